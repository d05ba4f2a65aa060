// Causal attention, one (batch, kv-head) group per task: q [B,H,T,D], k/v [B,Hkv,T,D]; query
// head h reads kv head h / (H / Hkv). The forward saves the log-sum-exp per query row so the
// backward recomputes probabilities without storing the T x T matrix. Each head's products
// (Q K^T, P V and the five of the backward) are single-threaded OpenBLAS calls on a T x T
// scratch; the tasks run on the backend's threads.
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
};

Dims dims_of(const Args& a) {
  const Shape &sq = a.in_shape(0), &sk = a.in_shape(1);
  return {sq[0], sq[1], sq[2], sq[3], sk[1], sq[1] / sk[1]};
}

// Probabilities of one head in place: s holds scale * Q K^T on entry (rows i, columns j <= i
// valid); on exit p = exp(s - lse) on and below the diagonal and 0 above.
void causal_softmax(float* s, int64_t t, float* lse) {
  for (int64_t i = 0; i < t; ++i) {
    float* row = s + i * t;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j <= i; ++j) m = std::max(m, row[j]);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j <= i; ++j) {
      row[j] = exp_fast(row[j] - m);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
    for (int64_t j = i + 1; j < t; ++j) row[j] = 0.0f;
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
      // S = scale * Q K^T, then P = softmax(S) (causal), O = P V.
      sgemm(false, true, t, t, d, qh, d, kb, d, s.data(), t, 0.0f);
      for (float& x : s) x *= scale;
      causal_softmax(s.data(), t, lse + bh * t);
      sgemm(false, false, t, d, t, s.data(), t, vb, d, out + bh * t * d, d, 0.0f);
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
      for (int64_t g = 0; g < z.group; ++g) {
        const int64_t row0 = (b * z.h + kvh * z.group + g) * t;
        const float *qh = q + row0 * d, *oh = out + row0 * d, *doh = dout + row0 * d;
        const float* lh = lse + row0;
        const float beta = g == 0 ? 0.0f : 1.0f;  // the group's heads add into dk, dv
        // P = exp(scale * Q K^T - lse), causal.
        sgemm(false, true, t, t, d, qh, d, kb, d, p.data(), t, 0.0f);
        for (int64_t i = 0; i < t; ++i) {
          float* row = p.data() + i * t;
          const float l = lh[i];
#pragma omp simd
          for (int64_t j = 0; j <= i; ++j) row[j] = exp_fast(scale * row[j] - l);
          for (int64_t j = i + 1; j < t; ++j) row[j] = 0.0f;
          float s = 0;
          const float *dor = doh + i * d, *orow = oh + i * d;
#pragma omp simd reduction(+ : s)
          for (int64_t c = 0; c < d; ++c) s += dor[c] * orow[c];
          di[static_cast<size_t>(i)] = s;
        }
        // dV += P^T dO; dP = dO V^T; dS = P (dP - D) scale; dQ = dS K; dK += dS^T Q.
        sgemm(true, false, t, d, t, p.data(), t, doh, d, dvb, d, beta);
        sgemm(false, true, t, t, d, doh, d, vb, d, dp.data(), t, 0.0f);
        for (int64_t i = 0; i < t; ++i) {
          float *pr = p.data() + i * t, *dpr = dp.data() + i * t;
          const float dii = di[static_cast<size_t>(i)];
#pragma omp simd
          for (int64_t j = 0; j < t; ++j) pr[j] = pr[j] * (dpr[j] - dii) * scale;
        }
        sgemm(false, false, t, d, t, p.data(), t, kb, d, dq + row0 * d, d, 0.0f);
        sgemm(true, false, t, d, t, p.data(), t, qh, d, dkb, d, beta);
      }
    }
  });
}

}  // namespace tessera::cpu
