#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/kernels.h"
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

void embedding(const Args& a) {
  const float* table = a.fin(0);
  const int32_t* ids = a.iin(1);
  float* y = a.fout(0);
  int64_t v = a.in_shape(0)[0], c = a.in_shape(0)[1], n = a.in_shape(1).numel();
#pragma omp parallel for schedule(static) if (n * c > 16384)
  for (int64_t i = 0; i < n; ++i) {
    TS_CHECK(ids[i] >= 0 && ids[i] < v)
        << "token id " << ids[i] << " out of range [0, " << v << ")";
    std::memcpy(y + i * c, table + ids[i] * c, static_cast<size_t>(c) * sizeof(float));
  }
}

void embedding_grad(const Args& a) {
  const float* dy = a.fin(0);
  const int32_t* ids = a.iin(1);
  float* dt = a.fout(0);
  int64_t v = a.out_shape(0)[0], c = a.out_shape(0)[1], n = a.in_shape(1).numel();
  std::memset(dt, 0, static_cast<size_t>(v * c) * sizeof(float));
  // Each thread owns a column range, so the scatter-add has no races.
#pragma omp parallel
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    int64_t lo = c * t / nt, hi = c * (t + 1) / nt;
    for (int64_t i = 0; i < n; ++i) {
      const float* src = dy + i * c;
      float* dst = dt + static_cast<int64_t>(ids[i]) * c;
      for (int64_t j = lo; j < hi; ++j) dst[j] += src[j];
    }
  }
}

void layernorm(const Args& a) {
  const float *x = a.fin(0), *w = a.fin(1), *b = a.fin(2);
  float *y = a.fout(0), *mean = a.fout(1), *rstd = a.fout(2);
  int64_t c = last_dim(a.in_shape(0)), rows = a.in_shape(0).numel() / c;
  float eps = static_cast<float>(a.attrs.eps);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * c;
    float m = 0;
    for (int64_t j = 0; j < c; ++j) m += xr[j];
    m /= static_cast<float>(c);
    float var = 0;
    for (int64_t j = 0; j < c; ++j) var += (xr[j] - m) * (xr[j] - m);
    var /= static_cast<float>(c);
    float s = 1.0f / std::sqrt(var + eps);
    float* yr = y + r * c;
    for (int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - m) * s * w[j] + b[j];
    mean[r] = m;
    rstd[r] = s;
  }
}

void layernorm_grad(const Args& a) {
  const float *dy = a.fin(0), *x = a.fin(1), *w = a.fin(2), *mean = a.fin(3), *rstd = a.fin(4);
  float *dx = a.fout(0), *dw = a.fout(1), *db = a.fout(2);
  int64_t c = last_dim(a.in_shape(1)), rows = a.in_shape(1).numel() / c;
  int threads = omp_get_max_threads();
  std::vector<float> pw(static_cast<size_t>(threads * c), 0.0f), pb(pw.size(), 0.0f);
#pragma omp parallel
  {
    float* tw = pw.data() + omp_get_thread_num() * c;
    float* tb = pb.data() + omp_get_thread_num() * c;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float *xr = x + r * c, *dyr = dy + r * c;
      float m = mean[r], s = rstd[r];
      float mean_d = 0, mean_dx = 0;
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
      for (int64_t j = 0; j < c; ++j) {
        float xh = (xr[j] - m) * s;
        dxr[j] = s * (dyr[j] * w[j] - mean_d - xh * mean_dx);
      }
    }
  }
  reduce_partials(pw, threads, c, dw);
  reduce_partials(pb, threads, c, db);
}

void rmsnorm(const Args& a) {
  const float *x = a.fin(0), *w = a.fin(1);
  float *y = a.fout(0), *rstd = a.fout(1);
  int64_t c = last_dim(a.in_shape(0)), rows = a.in_shape(0).numel() / c;
  float eps = static_cast<float>(a.attrs.eps);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * c;
    float ss = 0;
    for (int64_t j = 0; j < c; ++j) ss += xr[j] * xr[j];
    float s = 1.0f / std::sqrt(ss / static_cast<float>(c) + eps);
    float* yr = y + r * c;
    for (int64_t j = 0; j < c; ++j) yr[j] = xr[j] * s * w[j];
    rstd[r] = s;
  }
}

void rmsnorm_grad(const Args& a) {
  const float *dy = a.fin(0), *x = a.fin(1), *w = a.fin(2), *rstd = a.fin(3);
  float *dx = a.fout(0), *dw = a.fout(1);
  int64_t c = last_dim(a.in_shape(1)), rows = a.in_shape(1).numel() / c;
  int threads = omp_get_max_threads();
  std::vector<float> pw(static_cast<size_t>(threads * c), 0.0f);
#pragma omp parallel
  {
    float* tw = pw.data() + omp_get_thread_num() * c;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float *xr = x + r * c, *dyr = dy + r * c;
      float s = rstd[r], mean_dx = 0;
      for (int64_t j = 0; j < c; ++j) {
        float xh = xr[j] * s;
        mean_dx += dyr[j] * w[j] * xh;
        tw[j] += dyr[j] * xh;
      }
      mean_dx /= static_cast<float>(c);
      float* dxr = dx + r * c;
      for (int64_t j = 0; j < c; ++j) dxr[j] = s * (dyr[j] * w[j] - xr[j] * s * mean_dx);
    }
  }
  reduce_partials(pw, threads, c, dw);
}

// x [B,T,H,D], "rotate half" pairing (i, i + D/2), angle t * theta^(-2i/D).
void rope(const Args& a) {
  const Shape& s = a.in_shape(0);
  int64_t bsz = s[0], t = s[1], h = s[2], d = s[3], half = d / 2;
  std::vector<float> cs(static_cast<size_t>(t * half)), sn(cs.size());
  double theta = a.attrs.theta;
  for (int64_t p = 0; p < t; ++p)
    for (int64_t i = 0; i < half; ++i) {
      double ang = static_cast<double>(p) *
                   std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
      cs[static_cast<size_t>(p * half + i)] = static_cast<float>(std::cos(ang));
      sn[static_cast<size_t>(p * half + i)] =
          static_cast<float>(a.attrs.inverse ? -std::sin(ang) : std::sin(ang));
    }
  const float* x = a.fin(0);
  float* y = a.fout(0);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < bsz; ++b)
    for (int64_t p = 0; p < t; ++p)
      for (int64_t hh = 0; hh < h; ++hh) {
        int64_t off = ((b * t + p) * h + hh) * d;
        const float* c = cs.data() + p * half;
        const float* si = sn.data() + p * half;
        for (int64_t i = 0; i < half; ++i) {
          float x0 = x[off + i], x1 = x[off + i + half];
          y[off + i] = x0 * c[i] - x1 * si[i];
          y[off + i + half] = x1 * c[i] + x0 * si[i];
        }
      }
}

void softmax(const Args& a) {
  const float* x = a.fin(0);
  float* y = a.fout(0);
  int64_t c = last_dim(a.in_shape(0)), rows = a.in_shape(0).numel() / c;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * c;
    float* yr = y + r * c;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < c; ++j) m = std::max(m, xr[j]);
    float sum = 0;
    for (int64_t j = 0; j < c; ++j) {
      yr[j] = std::exp(xr[j] - m);
      sum += yr[j];
    }
    for (int64_t j = 0; j < c; ++j) yr[j] /= sum;
  }
}

void softmax_grad(const Args& a) {
  const float *y = a.fin(0), *dy = a.fin(1);
  float* dx = a.fout(0);
  int64_t c = last_dim(a.in_shape(0)), rows = a.in_shape(0).numel() / c;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float *yr = y + r * c, *dyr = dy + r * c;
    float dot = 0;
    for (int64_t j = 0; j < c; ++j) dot += yr[j] * dyr[j];
    for (int64_t j = 0; j < c; ++j) dx[r * c + j] = yr[j] * (dyr[j] - dot);
  }
}

void causal_mask(const Args& a) {
  const float* x = a.fin(0);
  float* y = a.fout(0);
  int64_t t = last_dim(a.in_shape(0)), mats = a.in_shape(0).numel() / (t * t);
  float fill = static_cast<float>(a.attrs.scalar);
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < mats; ++m)
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < t; ++j) {
        int64_t o = (m * t + i) * t + j;
        y[o] = j > i ? fill : x[o];
      }
}

void cross_entropy(const Args& a) {
  const float* logits = a.fin(0);
  const int32_t* tgt = a.iin(1);
  float *loss = a.fout(0), *lse = a.fout(1);
  int64_t n = a.in_shape(0)[0], v = a.in_shape(0)[1];
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits + i * v;
    TS_CHECK(tgt[i] >= 0 && tgt[i] < v) << "target " << tgt[i] << " out of range [0, " << v << ")";
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < v; ++j) m = std::max(m, row[j]);
    double s = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(row[j] - m);
    lse[i] = m + static_cast<float>(std::log(s));
  }
  double total = 0;  // summed in row order: reproducible whatever the thread count
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(lse[i]) - logits[i * v + tgt[i]];
  // attrs.count: the global row count when the rows are split across ranks.
  const int64_t rows = a.attrs.count > 0 ? a.attrs.count : n;
  loss[0] = static_cast<float>(total / static_cast<double>(rows));
}

void cross_entropy_grad(const Args& a) {
  const float *logits = a.fin(0), *lse = a.fin(2), *dloss = a.fin(3);
  const int32_t* tgt = a.iin(1);
  float* dl = a.fout(0);
  int64_t n = a.in_shape(0)[0], v = a.in_shape(0)[1];
  const int64_t rows = a.attrs.count > 0 ? a.attrs.count : n;
  float scale = dloss[0] / static_cast<float>(rows);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits + i * v;
    float* d = dl + i * v;
    for (int64_t j = 0; j < v; ++j) d[j] = std::exp(row[j] - lse[i]) * scale;
    d[tgt[i]] -= scale;
  }
}

}  // namespace tessera::cpu
