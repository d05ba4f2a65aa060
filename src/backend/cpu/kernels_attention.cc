// Causal attention, one (batch, kv-head) group per task: q [B,H,T,D], k/v [B,Hkv,T,D]; query
// head h reads kv head h / (H / Hkv). The forward saves the log-sum-exp per query row so the
// backward recomputes probabilities without storing the T x T matrix.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/kernels.h"

namespace tessera::cpu {

namespace {
inline float dot(const float* a, const float* b, int64_t d) {
  float s = 0;
  for (int64_t i = 0; i < d; ++i) s += a[i] * b[i];
  return s;
}
}  // namespace

void attention(const Args& a) {
  const Shape &sq = a.in_shape(0), &sk = a.in_shape(1);
  int64_t bsz = sq[0], h = sq[1], t = sq[2], d = sq[3], hkv = sk[1], group = h / hkv;
  float scale = static_cast<float>(a.attrs.scalar);
  const float *q = a.fin(0), *k = a.fin(1), *v = a.fin(2);
  float *out = a.fout(0), *lse = a.fout(1);
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(t));
#pragma omp for collapse(3) schedule(dynamic, 4)
    for (int64_t b = 0; b < bsz; ++b)
      for (int64_t hh = 0; hh < h; ++hh)
        for (int64_t i = 0; i < t; ++i) {
          int64_t kvh = hh / group;
          const float* qi = q + ((b * h + hh) * t + i) * d;
          const float* kb = k + (b * hkv + kvh) * t * d;
          const float* vb = v + (b * hkv + kvh) * t * d;
          float m = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j <= i; ++j) {
            p[static_cast<size_t>(j)] = scale * dot(qi, kb + j * d, d);
            m = std::max(m, p[static_cast<size_t>(j)]);
          }
          float sum = 0;
          for (int64_t j = 0; j <= i; ++j) {
            p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - m);
            sum += p[static_cast<size_t>(j)];
          }
          float* o = out + ((b * h + hh) * t + i) * d;
          std::memset(o, 0, static_cast<size_t>(d) * sizeof(float));
          float inv = 1.0f / sum;
          for (int64_t j = 0; j <= i; ++j) {
            float w = p[static_cast<size_t>(j)] * inv;
            const float* vj = vb + j * d;
            for (int64_t c = 0; c < d; ++c) o[c] += w * vj[c];
          }
          lse[(b * h + hh) * t + i] = m + std::log(sum);
        }
  }
}

void attention_grad(const Args& a) {
  const Shape &sq = a.in_shape(0), &sk = a.in_shape(1);
  int64_t bsz = sq[0], h = sq[1], t = sq[2], d = sq[3], hkv = sk[1], group = h / hkv;
  float scale = static_cast<float>(a.attrs.scalar);
  const float *q = a.fin(0), *k = a.fin(1), *v = a.fin(2), *out = a.fin(3), *lse = a.fin(4),
              *dout = a.fin(5);
  float *dq = a.fout(0), *dk = a.fout(1), *dv = a.fout(2);
  std::memset(dk, 0, static_cast<size_t>(sk.numel()) * sizeof(float));
  std::memset(dv, 0, static_cast<size_t>(sk.numel()) * sizeof(float));
  // One task per (batch, kv head): the query heads of a group write the same dk/dv rows.
#pragma omp parallel
  {
    std::vector<float> ds(static_cast<size_t>(t));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < bsz; ++b)
      for (int64_t kvh = 0; kvh < hkv; ++kvh) {
        const float* kb = k + (b * hkv + kvh) * t * d;
        const float* vb = v + (b * hkv + kvh) * t * d;
        float* dkb = dk + (b * hkv + kvh) * t * d;
        float* dvb = dv + (b * hkv + kvh) * t * d;
        for (int64_t hh = kvh * group; hh < (kvh + 1) * group; ++hh)
          for (int64_t i = 0; i < t; ++i) {
            int64_t row = (b * h + hh) * t + i;
            const float *qi = q + row * d, *oi = out + row * d, *doi = dout + row * d;
            float* dqi = dq + row * d;
            float di = dot(doi, oi, d);
            std::memset(dqi, 0, static_cast<size_t>(d) * sizeof(float));
            for (int64_t j = 0; j <= i; ++j) {
              float p = std::exp(scale * dot(qi, kb + j * d, d) - lse[row]);
              float dp = dot(doi, vb + j * d, d);
              float s = p * (dp - di) * scale;
              const float* kj = kb + j * d;
              float *dkj = dkb + j * d, *dvj = dvb + j * d;
              for (int64_t c = 0; c < d; ++c) {
                dqi[c] += s * kj[c];
                dkj[c] += s * qi[c];
                dvj[c] += p * doi[c];
              }
            }
          }
      }
  }
}

}  // namespace tessera::cpu
