// Attention, causal or bidirectional (AttentionAttrs::causal), q [B,H,Tq,D], k/v [B,Hkv,Tk,D]
// (query head h reads kv head h / (H / Hkv)), an optional score bias [H,Tq,Tk], out [B,H,Tq,D] and
// the log-sum-exp per query row [B,H,Tq], as the CPU kernel computes them.
//
// Tiled (FlashAttention's schedule, in f32 on the CUDA cores): a block takes a tile of rows of
// one (batch, head); each row belongs to a group of G adjacent threads, each holding kC of its
// elements in registers (G = ceil(D / kC), so head dims up to 8 kC), and the block walks the
// other side's rows in tiles staged in shared memory, every thread reading each staged
// element as a broadcast. The forward keeps an online softmax per query row; the backward is
// two passes that recompute the probabilities from the saved log-sum-exp, one per query row
// (dq, and D_i = dO_i . O_i) and one per key row (dk, dv, summed over the query heads of its
// group), so no two threads write one element of dq, dk or dv; the bias gradient, a sum over
// the batch, is added atomically.
#include <algorithm>
#include <cmath>

#include "backend/cuda/kernels.h"
#include "base/check.h"
#include "ir/position_buckets.h"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxGroup = 8;                  // threads per row
constexpr int kForwardChunk = 64;             // elements per thread: q and the output
constexpr int kBackwardChunk = 32;            // dq pass: q, dO, dq; key pass: k, v, dk, dv
constexpr int kSharedFloats = 48 * 1024 / 4;  // static limit of dynamic shared memory
constexpr int kMaxTile = 64;                  // staged rows per tile

struct Dims {
  int64_t b, h, tq, tk, d, hkv, group;
  bool causal;
};

// The bias of head h's score (i, j), or 0 without one.
__device__ float bias_at(const float* bias, const Dims& z, int64_t h, int64_t i, int64_t j) {
  return bias ? bias[(h * z.tq + i) * z.tk + j] : 0.0f;
}

// Sum over the G threads of a row (adjacent lanes, groups aligned to G).
__device__ float group_sum(float v, int g) {
  for (int o = g / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// How a row is spread over threads and staged in shared memory: thread r of a row's group
// holds elements [r kC, r kC + kC); a staged row keeps chunk r at r (kC + kPad) (padding so
// that the G threads of a group read different banks, and chunks stay 16-byte aligned for
// float4 reads).
constexpr int kPad = 4;
struct Layout {
  int g, chunk, stride;  // threads per row, kC, floats per staged row
  __device__ int at(int c) const { return (c / chunk) * (chunk + kPad) + c % chunk; }
};

// Stages rows [r0, r0 + n) of x (rows of d floats) in s; elements past d and rows past n are 0.
__device__ void stage(float* s, const float* x, int64_t r0, int n, int tile, int64_t d,
                      const Layout& lay) {
  const int padded = lay.g * lay.chunk;
  for (int idx = threadIdx.x; idx < tile * padded; idx += blockDim.x) {
    const int row = idx / padded, c = idx % padded;
    s[row * lay.stride + lay.at(c)] = row < n && c < d ? x[(r0 + row) * d + c] : 0.0f;
  }
}

// Loads this thread's chunk of row x (d floats) into r.
template <int kC>
__device__ void load_chunk(const float* x, int64_t d, int part, bool ok, float* r) {
#pragma unroll
  for (int e = 0; e < kC; ++e) {
    const int64_t c = int64_t{part} * kC + e;
    r[e] = ok && c < d ? x[c] : 0.0f;
  }
}

template <int kC>
__device__ void store_chunk(float* x, int64_t d, int part, const float* r, float scale = 1.0f) {
#pragma unroll
  for (int e = 0; e < kC; ++e) {
    const int64_t c = int64_t{part} * kC + e;
    if (c < d) x[c] = r[e] * scale;
  }
}

// r . staged chunk, and acc += p * staged chunk (16-byte shared-memory reads).
template <int kC>
__device__ float dot_chunk(const float* r, const float* staged) {
  // Four independent sums: a chain of kC dependent FMAs would stall each warp on latency.
  const float4* p = reinterpret_cast<const float4*>(staged);
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma unroll
  for (int e = 0; e < kC / 4; ++e) {
    const float4 t = p[e];
    s0 += r[4 * e] * t.x;
    s1 += r[4 * e + 1] * t.y;
    s2 += r[4 * e + 2] * t.z;
    s3 += r[4 * e + 3] * t.w;
  }
  return (s0 + s1) + (s2 + s3);
}

template <int kC>
__device__ void axpy_chunk(float* acc, float a, const float* staged) {
  const float4* p = reinterpret_cast<const float4*>(staged);
#pragma unroll
  for (int e = 0; e < kC / 4; ++e) {
    const float4 t = p[e];
    acc[4 * e] += a * t.x;
    acc[4 * e + 1] += a * t.y;
    acc[4 * e + 2] += a * t.z;
    acc[4 * e + 3] += a * t.w;
  }
}

// The block's tile of rows: which (batch, head) and which first row, for `rows` rows per head.
struct Tile {
  int64_t bh, first;
};
__device__ Tile tile_of(int64_t rows, int per_block) {
  const int64_t tiles = (rows + per_block - 1) / per_block;
  return {blockIdx.x / tiles, (blockIdx.x % tiles) * per_block};
}

// A query row of the block's tile, for the forward and dq passes: the thread's part of it,
// its head and index, its flat row, its kv head's first element, the keys any row of the tile
// sees (the same for the whole block), and whether the row exists.
struct QueryRow {
  int part;
  int64_t h, i, row, kv, keys;
  bool ok;
};
__device__ QueryRow query_row(const Dims& z, int g) {
  const int per_block = blockDim.x / g;
  const Tile t = tile_of(z.tq, per_block);
  const int64_t b = t.bh / z.h, h = t.bh % z.h, i = t.first + threadIdx.x / g;
  return {static_cast<int>(threadIdx.x % g),
          h,
          i,
          t.bh * z.tq + i,
          (b * z.hkv + h / z.group) * z.tk * z.d,
          z.causal ? std::min<int64_t>(z.tk, t.first + per_block) : z.tk,
          i < z.tq};
}

template <int kC>
__global__ void forward_kernel(const float* q, const float* k, const float* v, const float* bias,
                               float* out, float* lse, Dims z, float scale, int g, int tile) {
  extern __shared__ float4 sm4[];  // 16-byte aligned
  float* sm = reinterpret_cast<float*>(sm4);
  const Layout lay{g, kC, g * (kC + kPad)};
  float *ks = sm, *vs = sm + tile * lay.stride;
  const auto [part, h, i, row, kv, keys, row_ok] = query_row(z, g);
  float qr[kC], acc[kC];
  load_chunk<kC>(q + row * z.d, z.d, part, row_ok, qr);
#pragma unroll
  for (int e = 0; e < kC; ++e) acc[e] = 0.0f;
  float m = -INFINITY, l = 0;
  for (int64_t j0 = 0; j0 < keys; j0 += tile) {
    const int n = static_cast<int>(std::min<int64_t>(tile, keys - j0));
    __syncthreads();
    stage(ks, k + kv, j0, n, tile, z.d, lay);
    stage(vs, v + kv, j0, n, tile, z.d, lay);
    __syncthreads();
    for (int jj = 0; jj < n; ++jj) {
      const float* kr = ks + jj * lay.stride + part * (kC + kPad);
      float s = group_sum(dot_chunk<kC>(qr, kr), g);
      const int64_t j = j0 + jj;
      if (!row_ok || (z.causal && j > i)) continue;
      s = s * scale + bias_at(bias, z, h, i, j);
      if (s > m) {  // a new maximum: rescale what was summed so far
        const float correction = expf(m - s);
        l *= correction;
#pragma unroll
        for (int e = 0; e < kC; ++e) acc[e] *= correction;
        m = s;
      }
      const float p = expf(s - m);
      l += p;
      axpy_chunk<kC>(acc, p, vs + jj * lay.stride + part * (kC + kPad));
    }
  }
  if (!row_ok) return;
  store_chunk<kC>(out + row * z.d, z.d, part, acc, 1.0f / l);
  if (part == 0) lse[row] = m + logf(l);
}

// dq of each query row of the tile, its row of the bias gradient (added over the batch), and
// D_i = dO_i . O_i for the key pass.
template <int kC>
__global__ void dq_kernel(const float* q, const float* k, const float* v, const float* out,
                          const float* lse, const float* dout, const float* bias, float* dq,
                          float* dbias, float* delta, Dims z, float scale, int g, int tile) {
  extern __shared__ float4 sm4[];  // 16-byte aligned
  float* sm = reinterpret_cast<float*>(sm4);
  const Layout lay{g, kC, g * (kC + kPad)};
  float *ks = sm, *vs = sm + tile * lay.stride;
  const auto [part, h, i, row, kv, keys, row_ok] = query_row(z, g);
  float qr[kC], dor[kC], acc[kC], o[kC];
  load_chunk<kC>(q + row * z.d, z.d, part, row_ok, qr);
  load_chunk<kC>(dout + row * z.d, z.d, part, row_ok, dor);
  load_chunk<kC>(out + row * z.d, z.d, part, row_ok, o);
  float di = 0;
#pragma unroll
  for (int e = 0; e < kC; ++e) {
    di += dor[e] * o[e];
    acc[e] = 0.0f;
  }
  di = group_sum(di, g);
  const float l = row_ok ? lse[row] : 0.0f;
  for (int64_t j0 = 0; j0 < keys; j0 += tile) {
    const int n = static_cast<int>(std::min<int64_t>(tile, keys - j0));
    __syncthreads();
    stage(ks, k + kv, j0, n, tile, z.d, lay);
    stage(vs, v + kv, j0, n, tile, z.d, lay);
    __syncthreads();
    for (int jj = 0; jj < n; ++jj) {
      const float* kr = ks + jj * lay.stride + part * (kC + kPad);
      const float* vr = vs + jj * lay.stride + part * (kC + kPad);
      const float s = group_sum(dot_chunk<kC>(qr, kr), g);
      const float dp = group_sum(dot_chunk<kC>(dor, vr), g);
      const int64_t j = j0 + jj;
      if (!row_ok || (z.causal && j > i)) continue;
      const float p = expf(s * scale + bias_at(bias, z, h, i, j) - l);
      const float ds = p * (dp - di);
      if (dbias && part == 0) atomicAdd(dbias + (h * z.tq + i) * z.tk + j, ds);
      axpy_chunk<kC>(acc, ds, kr);
    }
  }
  if (!row_ok) return;
  store_chunk<kC>(dq + row * z.d, z.d, part, acc, scale);
  if (part == 0) delta[row] = di;
}

// dk, dv of each key row of the tile (of one batch and kv head): the query rows that see it
// (causal: i >= j) of every head in its group.
template <int kC>
__global__ void dkv_kernel(const float* q, const float* k, const float* v, const float* lse,
                           const float* dout, const float* bias, const float* delta, float* dk,
                           float* dv, Dims z, float scale, int g, int tile) {
  extern __shared__ float4 sm4[];  // 16-byte aligned
  float* sm = reinterpret_cast<float*>(sm4);
  const Layout lay{g, kC, g * (kC + kPad)};
  float *qs = sm, *ds_rows = sm + tile * lay.stride, *ls = ds_rows + tile * lay.stride,
        *deltas = ls + tile;
  const int per_block = blockDim.x / g, part = threadIdx.x % g;
  const Tile t = tile_of(z.tk, per_block);
  const int64_t b = t.bh / z.hkv, kvh = t.bh % z.hkv, j = t.first + threadIdx.x / g;
  const bool key_ok = j < z.tk;
  const int64_t row = t.bh * z.tk + j;
  float kr[kC], vr[kC], dkr[kC], dvr[kC];
  load_chunk<kC>(k + row * z.d, z.d, part, key_ok, kr);
  load_chunk<kC>(v + row * z.d, z.d, part, key_ok, vr);
#pragma unroll
  for (int e = 0; e < kC; ++e) dkr[e] = dvr[e] = 0.0f;
  for (int64_t gi = 0; gi < z.group; ++gi) {
    const int64_t hh = kvh * z.group + gi, q0 = (b * z.h + hh) * z.tq;  // its first query row
    for (int64_t i0 = z.causal ? t.first : 0; i0 < z.tq; i0 += tile) {
      const int n = static_cast<int>(std::min<int64_t>(tile, z.tq - i0));
      __syncthreads();
      stage(qs, q + q0 * z.d, i0, n, tile, z.d, lay);
      stage(ds_rows, dout + q0 * z.d, i0, n, tile, z.d, lay);
      for (int x = threadIdx.x; x < n; x += blockDim.x) {
        ls[x] = lse[q0 + i0 + x];
        deltas[x] = delta[q0 + i0 + x];
      }
      __syncthreads();
      for (int ii = 0; ii < n; ++ii) {
        const float* qi = qs + ii * lay.stride + part * (kC + kPad);
        const float* doi = ds_rows + ii * lay.stride + part * (kC + kPad);
        const float s = group_sum(dot_chunk<kC>(kr, qi), g);
        const float dp = group_sum(dot_chunk<kC>(vr, doi), g);
        const int64_t i = i0 + ii;
        if (!key_ok || (z.causal && i < j)) continue;
        const float p = expf(s * scale + bias_at(bias, z, hh, i, j) - ls[ii]);
        const float dsc = p * (dp - deltas[ii]) * scale;
        axpy_chunk<kC>(dvr, p, doi);
        axpy_chunk<kC>(dkr, dsc, qi);
      }
    }
  }
  if (!key_ok) return;
  store_chunk<kC>(dk + row * z.d, z.d, part, dkr);
  store_chunk<kC>(dv + row * z.d, z.d, part, dvr);
}

// `forward_inputs`: 3 (attention) or 6 (attention_grad), before the optional bias and block.
Dims dims_of(const Args& a, size_t forward_inputs) {
  TS_CHECK(optional_inputs(a.in_types, forward_inputs).block < 0)
      << "context-parallel attention (a sequence block) has no CUDA kernel yet (StepRunner's "
         "check_kernels refuses it on a device)";
  const Shape &sq = a.in_shape(0), &sk = a.in_shape(1);
  Dims z{sq[0], sq[1], sq[2], sk[2], sq[3], sk[1], sq[1] / sk[1], a.attr<AttentionAttrs>().causal};
  TS_CHECK(z.d <= kMaxGroup * kBackwardChunk) << "the CUDA attention kernel takes head dims up to "
                                              << kMaxGroup * kBackwardChunk << ", not " << z.d;
  return z;
}

// Threads per row (a power of two) for rows of d elements in chunks of kC.
int group_for(int64_t d, int chunk) {
  int g = 1;
  while (g * chunk < d) g *= 2;
  return g;
}

// How a launch of a kernel with `chunk` elements per thread is shaped: threads per row, rows
// staged per tile (as many as fit `arrays` staged arrays and `per_row` extra floats).
struct Launch {
  int g, tile;
  size_t shared_bytes;
  unsigned blocks(int64_t heads, int64_t rows) const {
    const int64_t per_block = kThreads / g;
    return static_cast<unsigned>(heads * ((rows + per_block - 1) / per_block));
  }
};
Launch launch_for(int64_t d, int chunk, int arrays, int per_row) {
  Launch l;
  l.g = group_for(d, chunk);
  const int stride = l.g * (chunk + kPad);
  l.tile = std::max(1, std::min(kMaxTile, kSharedFloats / (arrays * stride + per_row)));
  l.shared_bytes = static_cast<size_t>(l.tile) * (arrays * stride + per_row) * sizeof(float);
  return l;
}

void attention_f32(OpKind, const Args& a) {
  const Dims z = dims_of(a, 3);
  if (z.b * z.h * z.tq == 0) return;
  const float* bias = a.num_inputs() == 4 ? a.fin(3) : nullptr;
  const float scale = static_cast<float>(a.attr<AttentionAttrs>().scale);
  const Launch l = launch_for(z.d, kForwardChunk, 2, 0);
  forward_kernel<kForwardChunk><<<l.blocks(z.b * z.h, z.tq), kThreads, l.shared_bytes, a.stream>>>(
      a.fin(0), a.fin(1), a.fin(2), bias, a.fout(0), a.fout(1), z, scale, l.g, l.tile);
  TS_CUDA_LAUNCH();
}

void attention_grad_f32(OpKind, const Args& a) {
  const Dims z = dims_of(a, 6);
  if (z.b * z.h * z.tq == 0) return;
  const float scale = static_cast<float>(a.attr<AttentionAttrs>().scale);
  const float* bias = a.num_inputs() == 7 ? a.fin(6) : nullptr;
  float* dbias = bias ? a.fout(3) : nullptr;
  if (dbias)
    TS_CUDA(cudaMemsetAsync(dbias, 0, static_cast<size_t>(z.h * z.tq * z.tk) * 4, a.stream));
  float* delta = nullptr;
  TS_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&delta),
                          static_cast<size_t>(z.b * z.h * z.tq) * 4, a.stream));
  const Launch lq = launch_for(z.d, kBackwardChunk, 2, 0);
  dq_kernel<kBackwardChunk><<<lq.blocks(z.b * z.h, z.tq), kThreads, lq.shared_bytes, a.stream>>>(
      a.fin(0), a.fin(1), a.fin(2), a.fin(3), a.fin(4), a.fin(5), bias, a.fout(0), dbias, delta, z,
      scale, lq.g, lq.tile);
  TS_CUDA_LAUNCH();
  if (z.tk > 0) {
    const Launch lk = launch_for(z.d, kBackwardChunk, 2, 2);
    dkv_kernel<kBackwardChunk>
        <<<lk.blocks(z.b * z.hkv, z.tk), kThreads, lk.shared_bytes, a.stream>>>(
            a.fin(0), a.fin(1), a.fin(2), a.fin(4), a.fin(5), bias, delta, a.fout(1), a.fout(2), z,
            scale, lk.g, lk.tile);
    TS_CUDA_LAUNCH();
  }
  TS_CUDA(cudaFreeAsync(delta, a.stream));
}

// bf16/f16 attention goes to the tensor cores where it can (kernels_attention_tc.cu), else to
// the f32 kernels on widened copies.
void attention(OpKind op, const Args& a) {
  if (attention_tensor_cores(a)) return;
  if (is_low_precision(a.in_types[0].dtype)) return run_in_f32(op, a, attention_f32);
  attention_f32(op, a);
}

void attention_grad(OpKind op, const Args& a) {
  if (attention_grad_tensor_cores(a)) return;
  if (is_low_precision(a.in_types[0].dtype)) return run_in_f32(op, a, attention_grad_f32);
  attention_grad_f32(op, a);
}

__global__ void buckets_kernel(int32_t* out, int64_t tq, int64_t tk, bool bidirectional,
                               int64_t num_buckets, int64_t max_distance) {
  const int64_t x = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (x < tq * tk)
    out[x] = t5_position_bucket(x / tk, x % tk, bidirectional, num_buckets, max_distance);
}

void position_buckets(OpKind, const Args& a) {
  const PositionBucketsAttrs& p = a.attr<PositionBucketsAttrs>();
  const int64_t n = p.tq * p.tk;
  if (n == 0) return;
  buckets_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, a.stream>>>(
      static_cast<int32_t*>(a.out[0]), p.tq, p.tk, p.bidirectional, p.num_buckets, p.max_distance);
  TS_CUDA_LAUNCH();
}

}  // namespace

void register_attention_kernels(KernelTable& t) {
  t.add(OpKind::position_buckets, position_buckets);
  t.add(OpKind::attention, attention, /*low_precision=*/true);
  t.add(OpKind::attention_grad, attention_grad, /*low_precision=*/true);
}

}  // namespace tessera::cuda
