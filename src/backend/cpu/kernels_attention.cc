// Attention, causal (decoders) or bidirectional (encoders), one (batch, kv-head) group per task: q
// [B,H,T,D], k/v [B,Hkv,T,D]; query head h reads kv head h / (H / Hkv). The forward saves the
// log-sum-exp per query row so the backward recomputes probabilities without storing the T x T
// matrix. Each head's products (Q K^T, P V and the five of the backward) are single-threaded
// OpenBLAS calls on a T x T scratch; the tasks run on the backend's threads.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/vec_math.h"

namespace tessera::cpu {

namespace {

struct Dims {
  int64_t bsz, h, t, d, hkv, group;
  bool causal;
  // Query row i attends to keys [0, row_end(i)).
  int64_t row_end(int64_t i) const { return causal ? i + 1 : t; }
  // Query rows [i0, i1) together attend to keys [0, block_end(i1)).
  int64_t block_end(int64_t i1) const { return causal ? i1 : t; }
};

Dims dims_of(const Args& a) {
  const Shape &sq = a.in_shape(0), &sk = a.in_shape(1);
  return {sq[0], sq[1], sq[2], sq[3], sk[1], sq[1] / sk[1], a.attrs.causal};
}

// Query rows are taken in blocks of kBlock: causal, block [i0, i1) only meets keys [0, i1),
// so the products skip the blocks above the diagonal (at T = 256, 5/8 of the square is
// computed).
constexpr int64_t kBlock = 64;

// Probabilities of rows [i0, i1) of one head in place: s (row stride t) holds scale * Q K^T
// for columns [0, z.block_end(i1)) on entry; on exit p = exp(s - lse) for j < z.row_end(i)
// and 0 for the rest of those columns.
void softmax_rows(const Dims& z, float* s, int64_t i0, int64_t i1, float* lse) {
  for (int64_t i = i0; i < i1; ++i) {
    float* row = s + i * z.t;
    const int64_t n = z.row_end(i);
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) m = std::max(m, row[j]);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      row[j] = exp_fast(row[j] - m);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    for (int64_t j = n; j < z.block_end(i1); ++j) row[j] = 0.0f;
    lse[i] = m + std::log(sum);
  }
}

}  // namespace

void attention(const Args& a) {
  const Dims z = dims_of(a);
  const int64_t t = z.t, d = z.d;
  const float scale = static_cast<float>(a.attrs.scalar);
  const float *q = a.fin(0), *k = a.fin(1), *v = a.fin(2);
  float *out = a.fout(0), *lse = a.fout(1);
  parallel_for(z.bsz * z.h, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> s(static_cast<size_t>(t * t));
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / z.h, hh = bh % z.h, kvh = hh / z.group;
      const float* qh = q + bh * t * d;
      const float* kb = k + (b * z.hkv + kvh) * t * d;
      const float* vb = v + (b * z.hkv + kvh) * t * d;
      for (int64_t i0 = 0; i0 < t; i0 += kBlock) {
        const int64_t i1 = std::min(t, i0 + kBlock), rows = i1 - i0, keys = z.block_end(i1);
        float* sb = s.data() + i0 * t;
        // S = scale * Q K^T, P = softmax(S), O = P V; keys [0, keys) only.
        sgemm(false, true, rows, keys, d, qh + i0 * d, d, kb, d, sb, t, 0.0f);
        for (int64_t i = 0; i < rows; ++i)
#pragma omp simd
          for (int64_t j = 0; j < keys; ++j) sb[i * t + j] *= scale;
        softmax_rows(z, s.data(), i0, i1, lse + bh * t);
        sgemm(false, false, rows, d, keys, sb, t, vb, d, out + (bh * t + i0) * d, d, 0.0f);
      }
    }
  });
}

void attention_grad(const Args& a) {
  const Dims z = dims_of(a);
  const int64_t t = z.t, d = z.d;
  const float scale = static_cast<float>(a.attrs.scalar);
  const float *q = a.fin(0), *k = a.fin(1), *v = a.fin(2), *out = a.fin(3), *lse = a.fin(4),
              *dout = a.fin(5);
  float *dq = a.fout(0), *dk = a.fout(1), *dv = a.fout(2);
  // One task per (batch, kv head): the query heads of a group write the same dk/dv rows.
  parallel_for(z.bsz * z.hkv, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> p(static_cast<size_t>(t * t)), dp(p.size()), di(static_cast<size_t>(t));
    for (int64_t bk = lo; bk < hi; ++bk) {
      const int64_t b = bk / z.hkv, kvh = bk % z.hkv;
      const float* kb = k + bk * t * d;
      const float* vb = v + bk * t * d;
      float* dkb = dk + bk * t * d;
      float* dvb = dv + bk * t * d;
      std::fill(dkb, dkb + t * d, 0.0f);
      std::fill(dvb, dvb + t * d, 0.0f);
      for (int64_t g = 0; g < z.group; ++g) {
        const int64_t row0 = (b * z.h + kvh * z.group + g) * t;
        const float *qh = q + row0 * d, *oh = out + row0 * d, *doh = dout + row0 * d;
        const float* lh = lse + row0;
        for (int64_t i0 = 0; i0 < t; i0 += kBlock) {
          const int64_t i1 = std::min(t, i0 + kBlock), rows = i1 - i0, keys = z.block_end(i1);
          float *pb = p.data() + i0 * t, *dpb = dp.data() + i0 * t;
          const float *qb = qh + i0 * d, *dob = doh + i0 * d;
          // P = exp(scale * Q K^T - lse) (0 where masked); D_i = dO_i . O_i.
          sgemm(false, true, rows, keys, d, qb, d, kb, d, pb, t, 0.0f);
          for (int64_t i = i0; i < i1; ++i) {
            float* row = p.data() + i * t;
            const float l = lh[i];
            const int64_t n = z.row_end(i);
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) row[j] = exp_fast(scale * row[j] - l);
            for (int64_t j = n; j < keys; ++j) row[j] = 0.0f;
            float s = 0;
            const float *dor = doh + i * d, *orow = oh + i * d;
#pragma omp simd reduction(+ : s)
            for (int64_t c = 0; c < d; ++c) s += dor[c] * orow[c];
            di[static_cast<size_t>(i)] = s;
          }
          // dV += P^T dO; dP = dO V^T; dS = P (dP - D) scale; dQ = dS K; dK += dS^T Q.
          sgemm(true, false, keys, d, rows, pb, t, dob, d, dvb, d, 1.0f);
          sgemm(false, true, rows, keys, d, dob, d, vb, d, dpb, t, 0.0f);
          for (int64_t i = i0; i < i1; ++i) {
            float *pr = p.data() + i * t, *dpr = dp.data() + i * t;
            const float dii = di[static_cast<size_t>(i)];
#pragma omp simd
            for (int64_t j = 0; j < keys; ++j) pr[j] = pr[j] * (dpr[j] - dii) * scale;
          }
          sgemm(false, false, rows, d, keys, pb, t, kb, d, dq + (row0 + i0) * d, d, 0.0f);
          sgemm(true, false, keys, d, rows, pb, t, qb, d, dkb, d, 1.0f);
        }
      }
    }
  });
}

}  // namespace tessera::cpu
