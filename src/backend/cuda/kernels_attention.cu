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
//
// Context parallelism (op.h's AttentionAttrs): an optional i32 `block` input makes the Tq
// queries a chunk of the sequence (contiguous or zigzag), and a `key_block` input makes the Tk
// keys one too (ring attention's steps); the causal mask compares positions in the whole
// sequence, read from device memory by every kernel. A row that sees no key of its chunk
// gets out 0 and lse -inf (attention_merge's convention), as on the CPU.
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
  // The queries' and keys' sequence chunks (device scalars, or null: positions 0..T-1) and
  // the zigzag order's chunk count (0: contiguous); resolve() reads them in a kernel.
  const int32_t *block_at = nullptr, *key_block_at = nullptr;
  int64_t zigzag = 0;
  int64_t block = 0, key_block = -1;

  __device__ void resolve() {
    if (block_at) block = block_at[0];
    if (key_block_at) key_block = key_block_at[0];
  }
  // Query row i's and key row j's positions in the sequence (increasing in i and j).
  __device__ int64_t query_position(int64_t i) const {
    return block_at ? sequence_position(i, block, tq, zigzag) : i;
  }
  __device__ int64_t key_position(int64_t j) const {
    return key_block >= 0 ? sequence_position(j, key_block, tk, zigzag) : j;
  }
  // Whether query i sees key j.
  __device__ bool sees(int64_t i, int64_t j) const {
    return !causal || key_position(j) <= query_position(i);
  }
  // How many keys sit at positions <= p (a prefix: key positions increase).
  __device__ int64_t keys_upto(int64_t p) const {
    return key_block < 0 ? rows_before(p + 1, 0, tk, 0) : rows_before(p + 1, key_block, tk, zigzag);
  }
  // How many query rows sit at positions < p (a prefix: query positions increase).
  __device__ int64_t queries_before(int64_t p) const {
    return block_at ? rows_before(p, block, tq, zigzag) : rows_before(p, 0, tq, 0);
  }
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
          z.causal ? z.keys_upto(z.query_position(std::min(t.first + per_block, z.tq) - 1)) : z.tk,
          i < z.tq};
}

template <int kC>
__global__ void forward_kernel(const float* q, const float* k, const float* v, const float* bias,
                               float* out, float* lse, Dims z, float scale, int g, int tile) {
  z.resolve();
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
      if (!row_ok || !z.sees(i, j)) continue;
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
  // A row with no visible key (a later chunk's keys) has no probability: out 0, lse -inf.
  store_chunk<kC>(out + row * z.d, z.d, part, acc, l > 0 ? 1.0f / l : 0.0f);
  if (part == 0) lse[row] = l > 0 ? m + logf(l) : -INFINITY;
}

// dq of each query row of the tile, its row of the bias gradient (added over the batch), and
// D_i = dO_i . O_i for the key pass.
template <int kC>
__global__ void dq_kernel(const float* q, const float* k, const float* v, const float* out,
                          const float* lse, const float* dout, const float* bias, float* dq,
                          float* dbias, float* delta, Dims z, float scale, int g, int tile) {
  z.resolve();
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
      if (!row_ok || !z.sees(i, j)) continue;
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
  z.resolve();
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
  // Causal: the tile's first key is seen from the first query row at or past its position.
  const int64_t first_query =
      z.causal ? z.queries_before(z.key_position(std::min(t.first, z.tk - 1))) : 0;
  for (int64_t gi = 0; gi < z.group; ++gi) {
    const int64_t hh = kvh * z.group + gi, q0 = (b * z.h + hh) * z.tq;  // its first query row
    for (int64_t i0 = first_query; i0 < z.tq; i0 += tile) {
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
        if (!key_ok || !z.sees(i, j)) continue;
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
  const Shape &sq = a.in_shape(0), &sk = a.in_shape(1);
  const AttentionAttrs& at = a.attr<AttentionAttrs>();
  Dims z{sq[0], sq[1], sq[2], sk[2], sq[3], sk[1], sq[1] / sk[1], at.causal};
  const OptionalInputs opt = optional_inputs(a.in_types, forward_inputs);
  if (opt.block >= 0) {  // (zigzag only with a block)
    z.block_at = a.iin(opt.block);
    z.zigzag = at.zigzag;
  }
  if (opt.key_block >= 0) z.key_block_at = a.iin(opt.key_block);
  TS_CHECK(z.d <= kMaxGroup * kBackwardChunk) << "the CUDA attention kernel takes head dims up to "
                                              << kMaxGroup * kBackwardChunk << ", not " << z.d;
  return z;
}

// The score bias [H,Tq,Tk] after the forward inputs, or null.
const float* bias_of(const Args& a, size_t forward_inputs) {
  const int bias = optional_inputs(a.in_types, forward_inputs).bias;
  return bias >= 0 ? a.fin(bias) : nullptr;
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
  const float* bias = bias_of(a, 3);
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
  const float* bias = bias_of(a, 6);
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

// Two attentions of the same queries over disjoint keys as one (ops_nn.cc's attention_merge):
// one thread per output element; a row with lse -inf on both sides stays 0 and -inf.
__global__ void merge_kernel(const float* __restrict__ oa, const float* __restrict__ la,
                             const float* __restrict__ ob, const float* __restrict__ lb,
                             float* __restrict__ o, float* __restrict__ l, int64_t rows,
                             int64_t d) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < rows * d;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / d, c = e - r * d;
    const float m = fmaxf(la[r], lb[r]);
    if (m == -INFINITY) {
      o[e] = 0.0f;
      if (c == 0) l[r] = m;
      continue;
    }
    const float wa = expf(la[r] - m), wb = expf(lb[r] - m), sum = wa + wb;
    o[e] = (wa / sum) * oa[e] + (wb / sum) * ob[e];
    if (c == 0) l[r] = m + logf(sum);
  }
}

void attention_merge(OpKind, const Args& a) {
  const Shape& so = a.in_shape(0);
  const int64_t rows = so[0] * so[1] * so[2], d = so[3];
  if (rows * d == 0) return;
  merge_kernel<<<blocks_for(rows * d), 256, 0, a.stream>>>(a.fin(0), a.fin(1), a.fin(2), a.fin(3),
                                                           a.fout(0), a.fout(1), rows, d);
  TS_CUDA_LAUNCH();
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
  t.add(OpKind::attention_merge, attention_merge);  // bf16/f16 outputs on widened copies
}

}  // namespace tessera::cuda
