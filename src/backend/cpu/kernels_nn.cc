#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/vec_math.h"
#include "base/check.h"

namespace tessera::cpu {

namespace {
int64_t last_dim(const Shape& s) { return s[-1]; }

// Sums per-thread partial rows [threads, C] into out [C].
void reduce_partials(const std::vector<float>& partial, int threads, int64_t c, float* out) {
  for (int64_t j = 0; j < c; ++j) {
    float s = 0;
    for (int t = 0; t < threads; ++t) s += partial[static_cast<size_t>(t * c + j)];
    out[j] = s;
  }
}
}  // namespace

namespace {
// Row `first + r` of the vocabulary is row r of `table` ([rows, c]); ids outside the block
// give zero rows (vocab-parallel) or, with `all_in_block`, are an error.
void embedding_rows(const Args& a, int64_t first, bool all_in_block) {
  const float* table = a.fin(0);
  const int32_t* ids = a.iin(1);
  float* y = a.fout(0);
  int64_t rows = a.in_shape(0)[0], c = a.in_shape(0)[1], n = a.in_shape(1).numel();
  if (all_in_block) {
    for (int64_t i = 0; i < n; ++i)
      TS_CHECK(ids[i] >= 0 && ids[i] < rows)
          << "token id " << ids[i] << " out of range [0, " << rows << ")";
  }
  parallel_for(n, std::max<int64_t>(1, 16384 / c), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t r = ids[i] - first;
      if (r >= 0 && r < rows)
        std::memcpy(y + i * c, table + r * c, static_cast<size_t>(c) * sizeof(float));
      else
        std::memset(y + i * c, 0, static_cast<size_t>(c) * sizeof(float));
    }
  });
}

void embedding_grad_rows(const Args& a, int64_t first) {
  const float* dy = a.fin(0);
  const int32_t* ids = a.iin(1);
  float* dt = a.fout(0);
  int64_t rows = a.out_shape(0)[0], c = a.out_shape(0)[1], n = a.in_shape(1).numel();
  parallel_for(rows, 1024, [&](int64_t lo, int64_t hi) {
    std::memset(dt + lo * c, 0, static_cast<size_t>((hi - lo) * c) * sizeof(float));
  });
  // Each thread owns a column range, so the scatter-add has no races.
  parallel_run([&](int t, int nt) {
    int64_t lo = c * t / nt, hi = c * (t + 1) / nt;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = ids[i] - first;
      if (r < 0 || r >= rows) continue;
      const float* src = dy + i * c;
      float* dst = dt + r * c;
#pragma omp simd
      for (int64_t j = lo; j < hi; ++j) dst[j] += src[j];
    }
  });
}

// The first vocabulary row of a vocab-parallel block: the shard index (input `i`) times the
// block's rows.
int64_t block_start(const Args& a, int i, int64_t rows) { return a.iin(i)[0] * rows; }
}  // namespace

void embedding(const Args& a) { embedding_rows(a, 0, true); }
void embedding_grad(const Args& a) { embedding_grad_rows(a, 0); }
void vocab_embedding(const Args& a) {
  embedding_rows(a, block_start(a, 2, a.in_shape(0)[0]), false);
}
void vocab_embedding_grad(const Args& a) {
  embedding_grad_rows(a, block_start(a, 2, a.out_shape(0)[0]));
}

// Rows in parallel; per row one pass for the mean, one for the variance, one for the output.
namespace {
// out = x + y over n elements (add's arithmetic; out may be y): the residual of the fused norms.
void add_elements(const float* x, const float* y, float* out, int64_t n) {
  parallel_for(n, 16384, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = x[i] + y[i];
  });
}

// layernorm of the rows of x [rows, c] into y, with each row's mean and rstd.
void layernorm_rows(const float* x, const float* w, const float* b, float* y, float* mean,
                    float* rstd, int64_t rows, int64_t c, float eps) {
  parallel_for(rows, std::max<int64_t>(1, 8192 / c), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = x + r * c;
      float m = 0;
#pragma omp simd reduction(+ : m)
      for (int64_t j = 0; j < c; ++j) m += xr[j];
      m /= static_cast<float>(c);
      float var = 0;
#pragma omp simd reduction(+ : var)
      for (int64_t j = 0; j < c; ++j) var += (xr[j] - m) * (xr[j] - m);
      var /= static_cast<float>(c);
      float s = 1.0f / std::sqrt(var + eps);
      float* yr = y + r * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - m) * s * w[j] + b[j];
      mean[r] = m;
      rstd[r] = s;
    }
  });
}
}  // namespace

void layernorm(const Args& a) {
  const int64_t c = last_dim(a.in_shape(0)), rows = a.in_shape(0).numel() / c;
  layernorm_rows(a.fin(0), a.fin(1), a.fin(2), a.fout(0), a.fout(1), a.fout(2), rows, c,
                 static_cast<float>(a.attr<NormAttrs>().eps));
}

// add_layernorm: s = x + y (add's arithmetic), then layernorm's of s.
void add_layernorm(const Args& a) {
  const float *x = a.fin(0), *y = a.fin(1);
  float* sum = a.fout(0);
  const int64_t numel = a.in_shape(0).numel(), c = last_dim(a.in_shape(0)), rows = numel / c;
  add_elements(x, y, sum, numel);
  layernorm_rows(sum, a.fin(2), a.fin(3), a.fout(1), a.fout(2), a.fout(3), rows, c,
                 static_cast<float>(a.attr<NormAttrs>().eps));
}

void layernorm_grad(const Args& a) {
  const float *dy = a.fin(0), *x = a.fin(1), *w = a.fin(2), *mean = a.fin(3), *rstd = a.fin(4);
  float *dx = a.fout(0), *dw = a.fout(1), *db = a.fout(2);
  int64_t c = last_dim(a.in_shape(1)), rows = a.in_shape(1).numel() / c;
  int threads = num_threads();
  std::vector<float> pw(static_cast<size_t>(threads * c), 0.0f), pb(pw.size(), 0.0f);
  parallel_run([&](int t, int nt) {
    float* tw = pw.data() + t * c;
    float* tb = pb.data() + t * c;
    for (int64_t r = rows * t / nt; r < rows * (t + 1) / nt; ++r) {
      const float *xr = x + r * c, *dyr = dy + r * c;
      float m = mean[r], s = rstd[r];
      float mean_d = 0, mean_dx = 0;
#pragma omp simd reduction(+ : mean_d, mean_dx)
      for (int64_t j = 0; j < c; ++j) {
        float xh = (xr[j] - m) * s, d = dyr[j] * w[j];
        mean_d += d;
        mean_dx += d * xh;
        tw[j] += dyr[j] * xh;
        tb[j] += dyr[j];
      }
      mean_d /= static_cast<float>(c);
      mean_dx /= static_cast<float>(c);
      float* dxr = dx + r * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) {
        float xh = (xr[j] - m) * s;
        dxr[j] = s * (dyr[j] * w[j] - mean_d - xh * mean_dx);
      }
    }
  });
  reduce_partials(pw, threads, c, dw);
  reduce_partials(pb, threads, c, db);
}

// layernorm_grad_add: layernorm_grad's, then dres added to dx (add's arithmetic).
void layernorm_grad_add(const Args& a) {
  layernorm_grad(a);
  const float* dres = a.fin(5);
  float* dx = a.fout(0);
  add_elements(dres, dx, dx, a.out_shape(0).numel());
}

namespace {
// rmsnorm of the rows of x [rows, c] into y, with each row's rstd.
void rmsnorm_rows(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t c,
                  float eps) {
  parallel_for(rows, std::max<int64_t>(1, 8192 / c), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = x + r * c;
      float ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t j = 0; j < c; ++j) ss += xr[j] * xr[j];
      float s = 1.0f / std::sqrt(ss / static_cast<float>(c) + eps);
      float* yr = y + r * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) yr[j] = xr[j] * s * w[j];
      rstd[r] = s;
    }
  });
}
}  // namespace

void rmsnorm(const Args& a) {
  const int64_t c = last_dim(a.in_shape(0)), rows = a.in_shape(0).numel() / c;
  rmsnorm_rows(a.fin(0), a.fin(1), a.fout(0), a.fout(1), rows, c,
               static_cast<float>(a.attr<NormAttrs>().eps));
}

// add_rmsnorm: s = x + y (add's arithmetic), then rmsnorm's of s.
void add_rmsnorm(const Args& a) {
  const float *x = a.fin(0), *y = a.fin(1);
  float* sum = a.fout(0);
  const int64_t numel = a.in_shape(0).numel(), c = last_dim(a.in_shape(0)), rows = numel / c;
  add_elements(x, y, sum, numel);
  rmsnorm_rows(sum, a.fin(2), a.fout(1), a.fout(2), rows, c,
               static_cast<float>(a.attr<NormAttrs>().eps));
}

void rmsnorm_grad(const Args& a) {
  const float *dy = a.fin(0), *x = a.fin(1), *w = a.fin(2), *rstd = a.fin(3);
  float *dx = a.fout(0), *dw = a.fout(1);
  int64_t c = last_dim(a.in_shape(1)), rows = a.in_shape(1).numel() / c;
  int threads = num_threads();
  std::vector<float> pw(static_cast<size_t>(threads * c), 0.0f);
  parallel_run([&](int t, int nt) {
    float* tw = pw.data() + t * c;
    for (int64_t r = rows * t / nt; r < rows * (t + 1) / nt; ++r) {
      const float *xr = x + r * c, *dyr = dy + r * c;
      float s = rstd[r], mean_dx = 0;
#pragma omp simd reduction(+ : mean_dx)
      for (int64_t j = 0; j < c; ++j) {
        float xh = xr[j] * s;
        mean_dx += dyr[j] * w[j] * xh;
        tw[j] += dyr[j] * xh;
      }
      mean_dx /= static_cast<float>(c);
      float* dxr = dx + r * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) dxr[j] = s * (dyr[j] * w[j] - xr[j] * s * mean_dx);
    }
  });
  reduce_partials(pw, threads, c, dw);
}

// rmsnorm_grad_add: rmsnorm_grad's, then dres added to dx (add's arithmetic).
void rmsnorm_grad_add(const Args& a) {
  rmsnorm_grad(a);
  const float* dres = a.fin(4);
  float* dx = a.fout(0);
  add_elements(dres, dx, dx, a.out_shape(0).numel());
}

// x [B,T,H,D], "rotate half" pairing (i, i + D/2), angle t * theta^(-2i/D); with a sequence
// block (op.h), t is row's sequence_position.
void rope(const Args& a) {
  const Shape& s = a.in_shape(0);
  int64_t bsz = s[0], t = s[1], h = s[2], d = s[3], half = d / 2;
  const RopeAttrs& r = a.attr<RopeAttrs>();
  const bool blocked = a.num_inputs() == 2;  // (zigzag only with a block)
  const int64_t block = blocked ? static_cast<int64_t>(a.iin(1)[0]) : 0,
                zz = blocked ? r.zigzag : 0;
  std::vector<float> cs(static_cast<size_t>(t * half)), sn(cs.size());
  double theta = r.theta;
  for (int64_t p = 0; p < t; ++p)
    for (int64_t i = 0; i < half; ++i) {
      double ang = static_cast<double>(sequence_position(p, block, t, zz)) *
                   std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
      cs[static_cast<size_t>(p * half + i)] = static_cast<float>(std::cos(ang));
      sn[static_cast<size_t>(p * half + i)] =
          static_cast<float>(r.inverse ? -std::sin(ang) : std::sin(ang));
    }
  const float* x = a.fin(0);
  float* y = a.fout(0);
  parallel_for(bsz * t, std::max<int64_t>(1, 4096 / (h * d)), [&](int64_t lo, int64_t hi) {
    for (int64_t bp = lo; bp < hi; ++bp) {
      const int64_t p = bp % t;
      const float* c = cs.data() + p * half;
      const float* si = sn.data() + p * half;
      for (int64_t hh = 0; hh < h; ++hh) {
        int64_t off = (bp * h + hh) * d;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          float x0 = x[off + i], x1 = x[off + i + half];
          y[off + i] = x0 * c[i] - x1 * si[i];
          y[off + i + half] = x1 * c[i] + x0 * si[i];
        }
      }
    }
  });
}

void softmax(const Args& a) {
  const float* x = a.fin(0);
  float* y = a.fout(0);
  int64_t c = last_dim(a.in_shape(0)), rows = a.in_shape(0).numel() / c;
  parallel_for(rows, std::max<int64_t>(1, 4096 / c), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = x + r * c;
      float* yr = y + r * c;
      float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
      for (int64_t j = 0; j < c; ++j) m = std::max(m, xr[j]);
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < c; ++j) {
        yr[j] = exp_fast(xr[j] - m);
        sum += yr[j];
      }
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) yr[j] *= inv;
    }
  });
}

void softmax_grad(const Args& a) {
  const float *y = a.fin(0), *dy = a.fin(1);
  float* dx = a.fout(0);
  int64_t c = last_dim(a.in_shape(0)), rows = a.in_shape(0).numel() / c;
  parallel_for(rows, std::max<int64_t>(1, 4096 / c), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float *yr = y + r * c, *dyr = dy + r * c;
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < c; ++j) dot += yr[j] * dyr[j];
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) dx[r * c + j] = yr[j] * (dyr[j] - dot);
    }
  });
}

void causal_mask(const Args& a) {
  const float* x = a.fin(0);
  float* y = a.fout(0);
  int64_t t = last_dim(a.in_shape(0)), mats = a.in_shape(0).numel() / (t * t);
  float fill = static_cast<float>(a.attr<ScalarAttrs>().value);
  parallel_for(mats * t, std::max<int64_t>(1, 4096 / t), [&](int64_t lo, int64_t hi) {
    for (int64_t mi = lo; mi < hi; ++mi) {
      const int64_t i = mi % t;
      const float* xr = x + mi * t;
      float* yr = y + mi * t;
      for (int64_t j = 0; j < t; ++j) yr[j] = j > i ? fill : xr[j];
    }
  });
}

namespace {
// log(sum_j exp(row[j])) over a long row: max, then exp(row - max) summed in float over blocks
// of 1024 (vectorized) and in double across blocks.
float log_sum_exp(const float* row, int64_t v) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < v; ++j) m = std::max(m, row[j]);
  double s = 0;
  for (int64_t j0 = 0; j0 < v; j0 += 1024) {
    const int64_t j1 = std::min(v, j0 + 1024);
    float bs = 0;
#pragma omp simd reduction(+ : bs)
    for (int64_t j = j0; j < j1; ++j) bs += exp_fast(row[j] - m);
    s += bs;
  }
  return m + static_cast<float>(std::log(s));
}

// The class columns of a row of the logits (CrossEntropyAttrs::classes; the rest is padding).
int64_t classes(const Args& a, int64_t cols) {
  const int64_t c = a.attr<CrossEntropyAttrs>().classes;
  return c > 0 ? c : cols;
}

// The rows the mean loss divides by (CrossEntropyAttrs::rows: the global row count when the
// rows are split across ranks; else the n here).
int64_t mean_rows(const Args& a, int64_t n) {
  const int64_t rows = a.attr<CrossEntropyAttrs>().rows;
  return rows > 0 ? rows : n;
}
}  // namespace

void cross_entropy(const Args& a) {
  const float* logits = a.fin(0);
  const int32_t* tgt = a.iin(1);
  float *loss = a.fout(0), *lse = a.fout(1);
  const int64_t v = a.in_shape(0)[-1], n = logit_rows(a.in_shape(0)), k = classes(a, v);
  for (int64_t i = 0; i < n; ++i)
    TS_CHECK(tgt[i] >= 0 && tgt[i] < k) << "target " << tgt[i] << " out of range [0, " << k << ")";
  parallel_for(n, std::max<int64_t>(1, 16384 / v), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) lse[i] = log_sum_exp(logits + i * v, k);
  });
  double total = 0;  // summed in row order: reproducible whatever the thread count
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(lse[i]) - logits[i * v + tgt[i]];
  // The global row count when the rows are split across ranks.
  const int64_t rows = mean_rows(a, n);
  loss[0] = static_cast<float>(total / static_cast<double>(rows));
}

namespace {
// d logits = (softmax - onehot(target)) * dloss / rows on the columns [first, first + v) of the
// vocabulary; a target outside them adds no one-hot term here, padding columns get 0.
void cross_entropy_grad_cols(const Args& a, int64_t first) {
  const float *logits = a.fin(0), *lse = a.fin(2), *dloss = a.fin(3);
  const int32_t* tgt = a.iin(1);
  float* dl = a.fout(0);
  const int64_t v = a.in_shape(0)[-1], n = logit_rows(a.in_shape(0));
  const int64_t k = std::clamp<int64_t>(classes(a, first + v) - first, 0, v);
  const int64_t rows = mean_rows(a, n);
  float scale = dloss[0] / static_cast<float>(rows);
  parallel_for(n, std::max<int64_t>(1, 16384 / v), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float* row = logits + i * v;
      float* d = dl + i * v;
      const float l = lse[i];
#pragma omp simd
      for (int64_t j = 0; j < k; ++j) d[j] = exp_fast(row[j] - l) * scale;
      std::fill(d + k, d + v, 0.0f);
      const int64_t t = tgt[i] - first;
      if (t >= 0 && t < v) d[t] -= scale;
    }
  });
}
}  // namespace

void cross_entropy_grad(const Args& a) { cross_entropy_grad_cols(a, 0); }
void vocab_cross_entropy_grad(const Args& a) {
  cross_entropy_grad_cols(a, block_start(a, 4, a.in_shape(0)[-1]));
}

void logsumexp(const Args& a) {
  const float* x = a.fin(0);
  float* y = a.fout(0);
  const int64_t v = a.in_shape(0)[-1], n = a.out_shape(0).numel();
  parallel_for(n, std::max<int64_t>(1, 16384 / v), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y[i] = log_sum_exp(x + i * v, v);
  });
}

void vocab_logsumexp(const Args& a) {
  const float* x = a.fin(0);
  float* y = a.fout(0);
  const int64_t v = a.in_shape(0)[-1], n = logit_rows(a.in_shape(0));
  const int64_t first = block_start(a, 1, v);
  const int64_t k = std::clamp<int64_t>(classes(a, first + v) - first, 0, v);
  parallel_for(n, std::max<int64_t>(1, 16384 / v), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      y[i] = k > 0 ? log_sum_exp(x + i * v, k) : -std::numeric_limits<float>::infinity();
  });
}

void vocab_pick(const Args& a) {
  const float* logits = a.fin(0);
  const int32_t* tgt = a.iin(1);
  float* y = a.fout(0);
  const int64_t v = a.in_shape(0)[-1], n = logit_rows(a.in_shape(0));
  const int64_t first = block_start(a, 2, v);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = tgt[i] - first;
    y[i] = t >= 0 && t < v ? logits[i * v + t] : 0.0f;
  }
}

// Registers this file's kernels (cpu_backend.cc builds the table once).
void register_nn_kernels(KernelTable& t) {
  t.add(OpKind::embedding, [](OpKind, const Args& a) { embedding(a); });
  t.add(OpKind::embedding_grad, [](OpKind, const Args& a) { embedding_grad(a); });
  t.add(OpKind::vocab_embedding, [](OpKind, const Args& a) { vocab_embedding(a); });
  t.add(OpKind::vocab_embedding_grad, [](OpKind, const Args& a) { vocab_embedding_grad(a); });
  t.add(OpKind::layernorm, [](OpKind, const Args& a) { layernorm(a); });
  t.add(OpKind::layernorm_grad, [](OpKind, const Args& a) { layernorm_grad(a); });
  t.add(OpKind::add_layernorm, [](OpKind, const Args& a) { add_layernorm(a); });
  t.add(OpKind::layernorm_grad_add, [](OpKind, const Args& a) { layernorm_grad_add(a); });
  t.add(OpKind::add_rmsnorm, [](OpKind, const Args& a) { add_rmsnorm(a); });
  t.add(OpKind::rmsnorm_grad_add, [](OpKind, const Args& a) { rmsnorm_grad_add(a); });
  t.add(OpKind::rmsnorm, [](OpKind, const Args& a) { rmsnorm(a); });
  t.add(OpKind::rmsnorm_grad, [](OpKind, const Args& a) { rmsnorm_grad(a); });
  t.add(OpKind::rope, [](OpKind, const Args& a) { rope(a); });
  t.add(OpKind::softmax, [](OpKind, const Args& a) { softmax(a); });
  t.add(OpKind::softmax_grad, [](OpKind, const Args& a) { softmax_grad(a); });
  t.add(OpKind::causal_mask, [](OpKind, const Args& a) { causal_mask(a); });
  t.add(OpKind::cross_entropy, [](OpKind, const Args& a) { cross_entropy(a); });
  t.add(OpKind::cross_entropy_grad, [](OpKind, const Args& a) { cross_entropy_grad(a); });
  t.add(OpKind::logsumexp, [](OpKind, const Args& a) { logsumexp(a); });
  t.add(OpKind::vocab_logsumexp, [](OpKind, const Args& a) { vocab_logsumexp(a); });
  t.add(OpKind::vocab_pick, [](OpKind, const Args& a) { vocab_pick(a); });
  t.add(OpKind::vocab_cross_entropy_grad,
        [](OpKind, const Args& a) { vocab_cross_entropy_grad(a); });
}

}  // namespace tessera::cpu
