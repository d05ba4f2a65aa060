// Attention, causal or bidirectional (attrs.causal), q [B,H,Tq,D], k/v [B,Hkv,Tk,D] (query head h
// reads kv head h / (H / Hkv)), an optional score bias [H,Tq,Tk], out [B,H,Tq,D] and the
// log-sum-exp per query row [B,H,Tq], as the CPU kernel computes them. One warp per row, each lane
// holding D/32 elements of it: the forward walks the keys of its query row with an online softmax;
// the backward is two passes that recompute the probabilities from the saved log-sum-exp, one per
// query row (dq) and one per key row (dk, dv, summed over the query heads of its group), so no two
// warps write one element of dq, dk or dv; the bias gradient, a sum over the batch, is added
// atomically. These are correct, simple kernels (O(T^2 D) per head with a warp reduction per
// score), not the fast path: cuDNN's fused attention is.
#include <cmath>

#include "backend/cuda/kernels.h"
#include "base/check.h"
#include "ir/position_buckets.h"

namespace tessera::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kMaxPerLane = 8;  // head dims up to 256
constexpr int kWarpsPerBlock = 4;

struct Dims {
  int64_t b, h, tq, tk, d, hkv, group;
  bool causal;
};

// The bias of head h's score (i, j), or 0 without one.
__device__ float bias_at(const float* bias, const Dims& z, int64_t h, int64_t i, int64_t j) {
  return bias ? bias[(h * z.tq + i) * z.tk + j] : 0.0f;
}

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
__global__ void forward_kernel(const float* q, const float* k, const float* v, const float* bias,
                               float* out, float* lse, Dims z, float scale) {
  const int64_t row = warp_index();
  const int lane = threadIdx.x % kWarp;
  if (row >= z.b * z.h * z.tq) return;
  const int64_t i = row % z.tq, bh = row / z.tq, b = bh / z.h, h = bh % z.h;
  const int64_t kv = (b * z.hkv + h / z.group) * z.tk * z.d;
  float qr[kMaxPerLane], acc[kMaxPerLane] = {};
  load_row(q + row * z.d, z.d, lane, qr);
  float m = -INFINITY, l = 0;
  for (int64_t j = 0; j < (z.causal ? i + 1 : z.tk); ++j) {
    const float s = scale * dot_row(qr, k + kv + j * z.d, z.d, lane) + bias_at(bias, z, h, i, j);
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

// dq of query row (b, h, i), its row of the bias gradient (added over the batch), and
// D_i = dO_i . O_i for the key pass.
__global__ void dq_kernel(const float* q, const float* k, const float* v, const float* out,
                          const float* lse, const float* dout, const float* bias, float* dq,
                          float* dbias, float* delta, Dims z, float scale) {
  const int64_t row = warp_index();
  const int lane = threadIdx.x % kWarp;
  if (row >= z.b * z.h * z.tq) return;
  const int64_t i = row % z.tq, bh = row / z.tq, b = bh / z.h, h = bh % z.h;
  const int64_t kv = (b * z.hkv + h / z.group) * z.tk * z.d;
  float qr[kMaxPerLane], dor[kMaxPerLane], acc[kMaxPerLane] = {};
  load_row(q + row * z.d, z.d, lane, qr);
  load_row(dout + row * z.d, z.d, lane, dor);
  const float di = dot_row(dor, out + row * z.d, z.d, lane), l = lse[row];
  for (int64_t j = 0; j < (z.causal ? i + 1 : z.tk); ++j) {
    const float p =
        expf(scale * dot_row(qr, k + kv + j * z.d, z.d, lane) + bias_at(bias, z, h, i, j) - l);
    const float ds = p * (dot_row(dor, v + kv + j * z.d, z.d, lane) - di);
    if (dbias && lane == 0) atomicAdd(dbias + (h * z.tq + i) * z.tk + j, ds);
    const float* kj = k + kv + j * z.d;
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int64_t c = lane + e * kWarp;
      if (c < z.d) acc[e] += ds * scale * kj[c];
    }
  }
  store_row(dq + row * z.d, z.d, lane, acc);
  if (lane == 0) delta[row] = di;
}

// dk, dv of key row (b, kv head, j): the query rows that see it (causal: i >= j) of every head
// in its group.
__global__ void dkv_kernel(const float* q, const float* k, const float* v, const float* lse,
                           const float* dout, const float* bias, const float* delta, float* dk,
                           float* dv, Dims z, float scale) {
  const int64_t row = warp_index();
  const int lane = threadIdx.x % kWarp;
  if (row >= z.b * z.hkv * z.tk) return;
  const int64_t j = row % z.tk, bk = row / z.tk, b = bk / z.hkv, kvh = bk % z.hkv;
  float kr[kMaxPerLane], vr[kMaxPerLane], dkr[kMaxPerLane] = {}, dvr[kMaxPerLane] = {};
  load_row(k + row * z.d, z.d, lane, kr);
  load_row(v + row * z.d, z.d, lane, vr);
  for (int64_t g = 0; g < z.group; ++g) {
    const int64_t hh = kvh * z.group + g, q0 = (b * z.h + hh) * z.tq;  // its first query row
    for (int64_t i = z.causal ? j : 0; i < z.tq; ++i) {
      const float* qi = q + (q0 + i) * z.d;
      const float* doi = dout + (q0 + i) * z.d;
      const float p =
          expf(scale * dot_row(kr, qi, z.d, lane) + bias_at(bias, z, hh, i, j) - lse[q0 + i]);
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
  Dims z{sq[0], sq[1], sq[2], sk[2], sq[3], sk[1], sq[1] / sk[1], a.attrs.causal};
  TS_CHECK(z.d <= kWarp * kMaxPerLane) << "the CUDA attention kernel takes head dims up to "
                                       << kWarp * kMaxPerLane << ", not " << z.d;
  return z;
}

unsigned warp_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

void attention(OpKind, const Args& a) {
  const Dims z = dims_of(a);
  const int64_t rows = z.b * z.h * z.tq;
  if (rows == 0) return;
  const float* bias = a.num_inputs() == 4 ? a.fin(3) : nullptr;
  forward_kernel<<<warp_blocks(rows), kWarpsPerBlock * kWarp, 0, a.stream>>>(
      a.fin(0), a.fin(1), a.fin(2), bias, a.fout(0), a.fout(1), z,
      static_cast<float>(a.attrs.scalar));
  TS_CUDA_LAUNCH();
}

void attention_grad(OpKind, const Args& a) {
  const Dims z = dims_of(a);
  const int64_t rows = z.b * z.h * z.tq, kv_rows = z.b * z.hkv * z.tk;
  if (rows == 0) return;
  const float scale = static_cast<float>(a.attrs.scalar);
  const float* bias = a.num_inputs() == 7 ? a.fin(6) : nullptr;
  float* dbias = bias ? a.fout(3) : nullptr;
  if (dbias)
    TS_CUDA(cudaMemsetAsync(dbias, 0, static_cast<size_t>(z.h * z.tq * z.tk) * 4, a.stream));
  float* delta = nullptr;
  TS_CUDA(
      cudaMallocAsync(reinterpret_cast<void**>(&delta), static_cast<size_t>(rows) * 4, a.stream));
  dq_kernel<<<warp_blocks(rows), kWarpsPerBlock * kWarp, 0, a.stream>>>(
      a.fin(0), a.fin(1), a.fin(2), a.fin(3), a.fin(4), a.fin(5), bias, a.fout(0), dbias, delta, z,
      scale);
  TS_CUDA_LAUNCH();
  dkv_kernel<<<warp_blocks(kv_rows), kWarpsPerBlock * kWarp, 0, a.stream>>>(
      a.fin(0), a.fin(1), a.fin(2), a.fin(4), a.fin(5), bias, delta, a.fout(1), a.fout(2), z,
      scale);
  TS_CUDA_LAUNCH();
  TS_CUDA(cudaFreeAsync(delta, a.stream));
}

__global__ void buckets_kernel(int32_t* out, int64_t tq, int64_t tk, bool bidirectional,
                               int64_t num_buckets, int64_t max_distance) {
  const int64_t x = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (x < tq * tk)
    out[x] = t5_position_bucket(x / tk, x % tk, bidirectional, num_buckets, max_distance);
}

void position_buckets(OpKind, const Args& a) {
  const std::vector<int64_t>& v = a.attrs.ints;
  const int64_t n = v[0] * v[1];
  if (n == 0) return;
  buckets_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, a.stream>>>(
      static_cast<int32_t*>(a.out[0]), v[0], v[1], !a.attrs.causal, v[2], v[3]);
  TS_CUDA_LAUNCH();
}

}  // namespace

void register_attention_kernels(KernelTable& t) {
  t.add(OpKind::position_buckets, position_buckets);
  t.add(OpKind::attention, attention);
  t.add(OpKind::attention_grad, attention_grad);
}

}  // namespace tessera::cuda
