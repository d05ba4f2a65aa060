// Attention, causal or bidirectional (attrs.causal), q [B,H,T,D], k/v [B,Hkv,T,D] (query head h
// reads kv head h / (H / Hkv)), out [B,H,T,D] and the log-sum-exp per query row [B,H,T], as the CPU
// kernel computes them. One warp per row, each lane holding D/32 elements of it: the forward walks
// the keys of its query row with an online softmax; the backward is two passes that recompute the
// probabilities from the saved log-sum-exp, one per query row (dq) and one per key row (dk, dv,
// summed over the query heads of its group), so no two warps write one element. These are
// correct, simple kernels (O(T^2 D) per head with a warp reduction per score), not the fast
// path: cuDNN's fused attention is.
#include <cmath>

#include "backend/cuda/kernels.h"
#include "base/check.h"

namespace tessera::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kMaxPerLane = 8;  // head dims up to 256
constexpr int kWarpsPerBlock = 4;

struct Dims {
  int64_t b, h, t, d, hkv, group;
  bool causal;
};

__device__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Lane `lane` holds elements lane, lane + 32, ... of a row of d elements.
__device__ void load_row(const float* p, int64_t d, int lane, float* r) {
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t c = lane + e * kWarp;
    r[e] = c < d ? p[c] : 0.0f;
  }
}

__device__ float dot_row(const float* r, const float* p, int64_t d, int lane) {
  float s = 0;
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t c = lane + e * kWarp;
    if (c < d) s += r[e] * p[c];
  }
  return warp_sum(s);
}

__device__ void store_row(float* p, int64_t d, int lane, const float* r) {
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t c = lane + e * kWarp;
    if (c < d) p[c] = r[e];
  }
}

__device__ int64_t warp_index() { return (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / kWarp; }

// Row `row` = (b, h, i) of q.
__global__ void forward_kernel(const float* q, const float* k, const float* v, float* out,
                               float* lse, Dims z, float scale) {
  const int64_t row = warp_index();
  const int lane = threadIdx.x % kWarp;
  if (row >= z.b * z.h * z.t) return;
  const int64_t i = row % z.t, bh = row / z.t, b = bh / z.h, h = bh % z.h;
  const int64_t kv = (b * z.hkv + h / z.group) * z.t * z.d;
  float qr[kMaxPerLane], acc[kMaxPerLane] = {};
  load_row(q + row * z.d, z.d, lane, qr);
  float m = -INFINITY, l = 0;
  for (int64_t j = 0; j < (z.causal ? i + 1 : z.t); ++j) {
    const float s = scale * dot_row(qr, k + kv + j * z.d, z.d, lane);
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new), p = expf(s - m_new);
    l = l * correction + p;
    const float* vj = v + kv + j * z.d;
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int64_t c = lane + e * kWarp;
      acc[e] = acc[e] * correction + (c < z.d ? p * vj[c] : 0.0f);
    }
    m = m_new;
  }
  for (int e = 0; e < kMaxPerLane; ++e) acc[e] /= l;
  store_row(out + row * z.d, z.d, lane, acc);
  if (lane == 0) lse[row] = m + logf(l);
}

// dq of query row (b, h, i), and D_i = dO_i . O_i for the key pass.
__global__ void dq_kernel(const float* q, const float* k, const float* v, const float* out,
                          const float* lse, const float* dout, float* dq, float* delta, Dims z,
                          float scale) {
  const int64_t row = warp_index();
  const int lane = threadIdx.x % kWarp;
  if (row >= z.b * z.h * z.t) return;
  const int64_t i = row % z.t, bh = row / z.t, b = bh / z.h, h = bh % z.h;
  const int64_t kv = (b * z.hkv + h / z.group) * z.t * z.d;
  float qr[kMaxPerLane], dor[kMaxPerLane], acc[kMaxPerLane] = {};
  load_row(q + row * z.d, z.d, lane, qr);
  load_row(dout + row * z.d, z.d, lane, dor);
  const float di = dot_row(dor, out + row * z.d, z.d, lane), l = lse[row];
  for (int64_t j = 0; j < (z.causal ? i + 1 : z.t); ++j) {
    const float p = expf(scale * dot_row(qr, k + kv + j * z.d, z.d, lane) - l);
    const float ds = p * (dot_row(dor, v + kv + j * z.d, z.d, lane) - di) * scale;
    const float* kj = k + kv + j * z.d;
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int64_t c = lane + e * kWarp;
      if (c < z.d) acc[e] += ds * kj[c];
    }
  }
  store_row(dq + row * z.d, z.d, lane, acc);
  if (lane == 0) delta[row] = di;
}

// dk, dv of key row (b, kv head, j): the query rows that see it (causal: i >= j) of every head
// in its group.
__global__ void dkv_kernel(const float* q, const float* k, const float* v, const float* lse,
                           const float* dout, const float* delta, float* dk, float* dv, Dims z,
                           float scale) {
  const int64_t row = warp_index();
  const int lane = threadIdx.x % kWarp;
  if (row >= z.b * z.hkv * z.t) return;
  const int64_t j = row % z.t, bk = row / z.t, b = bk / z.hkv, kvh = bk % z.hkv;
  float kr[kMaxPerLane], vr[kMaxPerLane], dkr[kMaxPerLane] = {}, dvr[kMaxPerLane] = {};
  load_row(k + row * z.d, z.d, lane, kr);
  load_row(v + row * z.d, z.d, lane, vr);
  for (int64_t g = 0; g < z.group; ++g) {
    const int64_t q0 = (b * z.h + kvh * z.group + g) * z.t;  // first row of this query head
    for (int64_t i = z.causal ? j : 0; i < z.t; ++i) {
      const float* qi = q + (q0 + i) * z.d;
      const float* doi = dout + (q0 + i) * z.d;
      const float p = expf(scale * dot_row(kr, qi, z.d, lane) - lse[q0 + i]);
      const float ds = p * (dot_row(vr, doi, z.d, lane) - delta[q0 + i]) * scale;
      for (int e = 0; e < kMaxPerLane; ++e) {
        const int64_t c = lane + e * kWarp;
        if (c < z.d) {
          dvr[e] += p * doi[c];
          dkr[e] += ds * qi[c];
        }
      }
    }
  }
  store_row(dk + row * z.d, z.d, lane, dkr);
  store_row(dv + row * z.d, z.d, lane, dvr);
}

Dims dims_of(const Args& a) {
  const Shape &sq = a.in_shape(0), &sk = a.in_shape(1);
  Dims z{sq[0], sq[1], sq[2], sq[3], sk[1], sq[1] / sk[1], a.attrs.causal};
  TS_CHECK(z.d <= kWarp * kMaxPerLane) << "the CUDA attention kernel takes head dims up to "
                                       << kWarp * kMaxPerLane << ", not " << z.d;
  return z;
}

unsigned warp_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

void attention(OpKind, const Args& a) {
  const Dims z = dims_of(a);
  const int64_t rows = z.b * z.h * z.t;
  if (rows == 0) return;
  forward_kernel<<<warp_blocks(rows), kWarpsPerBlock * kWarp, 0, a.stream>>>(
      a.fin(0), a.fin(1), a.fin(2), a.fout(0), a.fout(1), z, static_cast<float>(a.attrs.scalar));
  TS_CUDA_LAUNCH();
}

void attention_grad(OpKind, const Args& a) {
  const Dims z = dims_of(a);
  const int64_t rows = z.b * z.h * z.t, kv_rows = z.b * z.hkv * z.t;
  if (rows == 0) return;
  const float scale = static_cast<float>(a.attrs.scalar);
  float* delta = nullptr;
  TS_CUDA(
      cudaMallocAsync(reinterpret_cast<void**>(&delta), static_cast<size_t>(rows) * 4, a.stream));
  dq_kernel<<<warp_blocks(rows), kWarpsPerBlock * kWarp, 0, a.stream>>>(
      a.fin(0), a.fin(1), a.fin(2), a.fin(3), a.fin(4), a.fin(5), a.fout(0), delta, z, scale);
  TS_CUDA_LAUNCH();
  dkv_kernel<<<warp_blocks(kv_rows), kWarpsPerBlock * kWarp, 0, a.stream>>>(
      a.fin(0), a.fin(1), a.fin(2), a.fin(4), a.fin(5), delta, a.fout(1), a.fout(2), z, scale);
  TS_CUDA_LAUNCH();
  TS_CUDA(cudaFreeAsync(delta, a.stream));
}

}  // namespace

void register_attention_kernels(KernelTable& t) {
  t.add(OpKind::attention, attention);
  t.add(OpKind::attention_grad, attention_grad);
}

}  // namespace tessera::cuda
