// Attention on the tensor cores: bf16/f16 q, k, v [B,H,T,D] (kv heads grouped as in
// kernels_attention.cu), no score bias, head dims that are multiples of 8 up to 128 (padded
// with zeros to 64 or 128 in shared memory). What the f32 kernels compute, with the products
// on the tensor cores (mma.sync m16n8k16, f32 accumulation) and the softmax in f32 registers.
//
// A block is 4 warps; each warp owns 16 rows of the block's 64 (queries in the forward and dq
// passes, keys in the dk/dv pass) and keeps its scores, probabilities and accumulators in
// registers, in the PTX ISA's fragment layouts: lane l holds rows l/4 and l/4 + 8 of a 16-row
// tile, columns 2(l%4) and 2(l%4) + 1 of each 8-column block. An accumulator tile of scores
// is, packed to 16 bits, the left operand of the next product (FlashAttention-2's register
// reuse); only the staged tiles of the other side live in shared memory, read with 32-bit
// loads and, where a product needs them transposed, ldmatrix.trans.
//
// - forward: per query tile, walks the key tiles (causal: those at or before it), S = Q K^T,
//   the online softmax (running max and sum per row, the output accumulators rescaled),
//   O += P V with P rounded to the storage type.
// - backward, deterministic (no atomics): a dq pass per query tile (S and dP = dO V^T
//   recomputed, dS = P (dP - D), dq += dS K; D_i = dO_i . O_i is written for the second
//   pass) and a dk/dv pass per key tile over the query tiles of every head in its group
//   (S^T and dP^T recomputed, dv += P^T dO, dk += dS^T Q).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/kernels.h"
#include "backend/cuda/storage.cuh"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kRows = 16 * kWarps;  // rows of a block's tile (queries or keys)
constexpr int kCols = 64;           // rows of the other side per staged tile
constexpr int kPad = 8;             // 16-bit row padding: rows stay 16-byte aligned, and the
                                    // 8 rows a fragment load touches start in distinct banks

struct Dims {
  int b, h, tq, tk, d, hkv, group;
  bool causal;
};

// Two f32 values as a 16-bit pair (the low half first), the operand register of mma.sync.
template <typename T>
__device__ inline uint32_t pack2(float lo, float hi);
template <>
__device__ inline uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ inline uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// c (16x8, f32) += a (16x16) b (16x8).
template <typename T>
__device__ inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ inline void mma<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ inline void mma<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                   uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <typename T>
__device__ inline uint32_t ld32(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// The lane's coordinates in a fragment: g = lane / 4 (its rows g and g + 8), t = lane % 4 (its
// columns 2t, 2t + 1 of each 8-column block).
struct Lane {
  int g, t, lane;
  __device__ Lane() : g((threadIdx.x % 32) / 4), t(threadIdx.x % 4), lane(threadIdx.x % 32) {}
};

// The left operand for rows [m0, m0 + 16) and columns [k0, k0 + 16) of x (row-major, stride ld).
template <typename T>
__device__ inline void load_a(uint32_t (&a)[4], const T* x, int ld, int m0, int k0, const Lane& l) {
  a[0] = ld32(x + (m0 + l.g) * ld + k0 + 2 * l.t);
  a[1] = ld32(x + (m0 + l.g + 8) * ld + k0 + 2 * l.t);
  a[2] = ld32(x + (m0 + l.g) * ld + k0 + 2 * l.t + 8);
  a[3] = ld32(x + (m0 + l.g + 8) * ld + k0 + 2 * l.t + 8);
}

// c[nb] += A . y^T over columns [n0 + 8 nb) of the product, for y's rows as the product's
// columns (a staged K or Q tile, row-major [n][k]): S = Q K^T and its kin.
template <typename T, int kN, int kK>
__device__ inline void gemm_abt(float (&c)[kN][4], const uint32_t (&a)[kK][4], const T* y, int ld,
                                const Lane& l) {
#pragma unroll
  for (int nb = 0; nb < kN; ++nb)
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) {
      const T* row = y + (nb * 8 + l.g) * ld + kk * 16 + 2 * l.t;
      mma<T>(c[nb], a[kk], ld32(row), ld32(row + 8));
    }
}

// The 16-bit left operand of columns [16 kk, 16 kk + 16) of accumulator tiles c (the
// accumulator layout of two 8-column blocks is the operand layout of one 16-column slice).
template <typename T, int kN>
__device__ inline void as_operand(uint32_t (&a)[4], const float (&c)[kN][4], int kk) {
  a[0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// acc[nb] += P . x, P the 16 x kCols accumulator tiles p (packed to T), x a staged row-major
// [kCols][DP] tile read transposed by ldmatrix (O += P V, dq += dS K, dv += P^T dO, ...).
template <typename T, int DP>
__device__ inline void gemm_px(float (&acc)[DP / 8][4], const float (&p)[kCols / 8][4], const T* x,
                               int ld, const Lane& l) {
  const int r = l.lane % 8, k_half = (l.lane / 8) % 2, n_half = l.lane / 16;
#pragma unroll
  for (int kk = 0; kk < kCols / 16; ++kk) {
    uint32_t a[4];
    as_operand<T>(a, p, kk);
#pragma unroll
    for (int nb2 = 0; nb2 < DP / 16; ++nb2) {
      const T* at = x + (kk * 16 + r + 8 * k_half) * ld + nb2 * 16 + 8 * n_half;
      const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(at));
      uint32_t b[4];
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                   : "r"(addr));
      mma<T>(acc[2 * nb2], a, b[0], b[1]);
      mma<T>(acc[2 * nb2 + 1], a, b[2], b[3]);
    }
  }
}

// Stages rows [r0, r0 + kRows) of x (rows of d elements, d a multiple of 8) as a [kRows][DP]
// tile with row stride DP + kPad; rows past `rows` and columns past d are zero.
template <typename T, int DP>
__device__ void stage(T* s, const T* x, int64_t r0, int64_t rows, int d) {
  constexpr int kVecs = DP / 8;  // 16-byte vectors per staged row
  for (int idx = threadIdx.x; idx < kRows * kVecs; idx += blockDim.x) {
    const int row = idx / kVecs, c = (idx % kVecs) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r0 + row < rows && c < d) v = *reinterpret_cast<const uint4*>(x + (r0 + row) * d + c);
    *reinterpret_cast<uint4*>(s + row * (DP + kPad) + c) = v;
  }
}

// stage() without waiting: 16-byte cp.async copies (zeros where the row or column is past the
// end), committed as one group. The kernels stage the next tile of the other side this way
// while they compute on the current one (two buffers), and wait for it with wait_staged().
template <typename T, int DP>
__device__ void stage_async(T* s, const T* x, int64_t r0, int64_t rows, int d) {
  constexpr int kVecs = DP / 8;
  for (int idx = threadIdx.x; idx < kRows * kVecs; idx += blockDim.x) {
    const int row = idx / kVecs, c = (idx % kVecs) * 8;
    const bool ok = r0 + row < rows && c < d;
    const T* src = ok ? x + (r0 + row) * d + c : x;  // any valid address; 0 bytes read
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(s + row * (DP + kPad) + c));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(ok ? 16 : 0));
  }
}
__device__ inline void commit_staged() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `pending` committed groups are still in flight, then for the block.
template <int kPending>
__device__ inline void wait_staged() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
  __syncthreads();
}

// Writes accumulator tiles acc (16 rows from r0, times scale) to x (rows of d elements).
template <typename T, int DP>
__device__ void store_rows(T* x, int64_t r0, int64_t rows, int d, const float (&acc)[DP / 8][4],
                           float scale0, float scale1, const Lane& l) {
#pragma unroll
  for (int nb = 0; nb < DP / 8; ++nb) {
    const int c = nb * 8 + 2 * l.t;
    if (c >= d) continue;
    if (r0 + l.g < rows)
      *reinterpret_cast<uint32_t*>(x + (r0 + l.g) * d + c) =
          pack2<T>(acc[nb][0] * scale0, acc[nb][1] * scale0);
    if (r0 + l.g + 8 < rows)
      *reinterpret_cast<uint32_t*>(x + (r0 + l.g + 8) * d + c) =
          pack2<T>(acc[nb][2] * scale1, acc[nb][3] * scale1);
  }
}

// Shared memory of the kernels (16-bit elements): staged tiles of kRows rows (the other
// side's in two buffers), and the backward's per-row terms.
template <int DP>
struct Smem {
  static constexpr int ld = DP + kPad;
  static constexpr size_t tile = size_t{kRows} * ld * 2;
  static constexpr size_t forward = 5 * tile;  // q; k, v twice
  static constexpr size_t backward = 6 * tile + 4 * kRows * sizeof(float);
};

// The block's (batch x head, first row) for a grid of ceil(rows / kRows) tiles per head.
struct Tile {
  int bh, first;
};
__device__ Tile tile_of(int rows) {
  const int tiles = (rows + kRows - 1) / kRows;
  return {static_cast<int>(blockIdx.x) / tiles, static_cast<int>(blockIdx.x) % tiles * kRows};
}

template <typename T, int DP>
__global__ void __launch_bounds__(kWarps * 32)
    forward_kernel(const T* q, const T* k, const T* v, T* out, float* lse, Dims z, float scale) {
  constexpr int ld = Smem<DP>::ld;
  extern __shared__ uint4 sm[];
  T* qs = reinterpret_cast<T*>(sm);  // then k, v of buffer 0, k, v of buffer 1
  auto kv = [&](int buf, int which) { return qs + (1 + 2 * buf + which) * kCols * ld; };
  const Tile tile = tile_of(z.tq);
  const int q0 = tile.first, b = tile.bh / z.h, h = tile.bh % z.h;
  const int64_t qbase = int64_t{tile.bh} * z.tq, kvbase = (int64_t{b} * z.hkv + h / z.group) * z.tk;
  const Lane l;
  const int m0 = threadIdx.x / 32 * 16;                   // the warp's first row in the tile
  const int row[2] = {q0 + m0 + l.g, q0 + m0 + l.g + 8};  // this lane's two rows
  stage<T, DP>(qs, q + qbase * z.d, q0, z.tq, z.d);
  __syncthreads();
  uint32_t qa[DP / 16][4];
#pragma unroll
  for (int kk = 0; kk < DP / 16; ++kk) load_a(qa[kk], qs, ld, m0, kk * 16, l);
  float o[DP / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};
  const int keys = z.causal ? min(z.tk, q0 + kRows) : z.tk;
  stage_async<T, DP>(kv(0, 0), k + kvbase * z.d, 0, z.tk, z.d);
  stage_async<T, DP>(kv(0, 1), v + kvbase * z.d, 0, z.tk, z.d);
  commit_staged();
  for (int j0 = 0, buf = 0; j0 < keys; j0 += kCols, buf ^= 1) {
    if (j0 + kCols < keys) {  // the next tile, into the other buffer
      stage_async<T, DP>(kv(buf ^ 1, 0), k + kvbase * z.d, j0 + kCols, z.tk, z.d);
      stage_async<T, DP>(kv(buf ^ 1, 1), v + kvbase * z.d, j0 + kCols, z.tk, z.d);
    }
    commit_staged();
    wait_staged<1>();  // this tile's group has landed
    const T *ks = kv(buf, 0), *vs = kv(buf, 1);
    float s[kCols / 8][4] = {};
    gemm_abt<T, kCols / 8, DP / 16>(s, qa, ks, ld, l);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < kCols / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = j0 + nb * 8 + 2 * l.t + (e & 1), r = e / 2;
        const bool ok = j < z.tk && !(z.causal && j > row[r]);
        s[nb][e] = ok ? s[nb][e] * scale : -INFINITY;
        mx[r] = fmaxf(mx[r], s[nb][e]);
      }
    float corr[2], add[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // the four lanes of a row hold its 64 columns
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);  // finite: key 0 is in every row's first tile
      corr[r] = expf(m[r] - m_new);            // 0 on the first tile (m = -inf)
      m[r] = m_new;
    }
#pragma unroll
    for (int nb = 0; nb < kCols / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nb][e] = expf(s[nb][e] - m[e / 2]);  // masked: exp(-inf) = 0
        add[e / 2] += s[nb][e];                // unrounded: the log-sum-exp is f32's
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      add[r] += __shfl_xor_sync(0xffffffffu, add[r], 1);
      add[r] += __shfl_xor_sync(0xffffffffu, add[r], 2);
      sum[r] = sum[r] * corr[r] + add[r];
    }
#pragma unroll
    for (int nb = 0; nb < DP / 8; ++nb) {
      o[nb][0] *= corr[0];
      o[nb][1] *= corr[0];
      o[nb][2] *= corr[1];
      o[nb][3] *= corr[1];
    }
    gemm_px<T, DP>(o, s, vs, ld, l);
    __syncthreads();  // every warp is done with this buffer before it is staged again
  }
  store_rows<T, DP>(out + qbase * z.d, q0 + m0, z.tq, z.d, o, 1.0f / sum[0], 1.0f / sum[1], l);
  if (l.t == 0)
    for (int r = 0; r < 2; ++r)
      if (row[r] < z.tq) lse[qbase + row[r]] = m[r] + logf(sum[r]);
}

// Each lane's two rows: D_i = dO_i . O_i (from global memory, two lanes a row) into
// delta_s[kRows], and the saved log-sum-exps into lse_s[kRows].
template <typename T>
__device__ void row_terms(const T* out, const T* dout, const float* lse, int64_t base, int r0,
                          int rows, int d, float* delta_s, float* lse_s) {
  for (int r = threadIdx.x / 2; r < kRows; r += blockDim.x / 2) {
    const int64_t i = r0 + r;
    float di = 0.0f;
    if (i < rows)
      for (int c = threadIdx.x % 2; c < d; c += 2)
        di += as_f32(dout[(base + i) * d + c]) * as_f32(out[(base + i) * d + c]);
    di += __shfl_xor_sync(0xffffffffu, di, 1);
    if (threadIdx.x % 2 == 0) {
      delta_s[r] = di;
      lse_s[r] = i < rows ? lse[base + i] : 0.0f;
    }
  }
}

// dq of a tile of query rows and D_i = dO_i . O_i.
template <typename T, int DP>
__global__ void __launch_bounds__(kWarps * 32)
    dq_kernel(const T* q, const T* k, const T* v, const T* out, const float* lse, const T* dout,
              T* dq, float* delta, Dims z, float scale) {
  constexpr int ld = Smem<DP>::ld;
  extern __shared__ uint4 sm[];
  T *qs = reinterpret_cast<T*>(sm), *dos = qs + kRows * ld;  // then k, v twice
  auto kv = [&](int buf, int which) { return qs + (2 + 2 * buf + which) * kCols * ld; };
  float* delta_s = reinterpret_cast<float*>(qs + 6 * kCols * ld);
  float* lse_s = delta_s + kRows;
  const Tile tile = tile_of(z.tq);
  const int q0 = tile.first, b = tile.bh / z.h, h = tile.bh % z.h;
  const int64_t qbase = int64_t{tile.bh} * z.tq, kvbase = (int64_t{b} * z.hkv + h / z.group) * z.tk;
  const Lane l;
  const int m0 = threadIdx.x / 32 * 16;
  const int row[2] = {q0 + m0 + l.g, q0 + m0 + l.g + 8};
  stage<T, DP>(qs, q + qbase * z.d, q0, z.tq, z.d);
  stage<T, DP>(dos, dout + qbase * z.d, q0, z.tq, z.d);
  row_terms(out, dout, lse, qbase, q0, z.tq, z.d, delta_s, lse_s);
  __syncthreads();
  uint32_t qa[DP / 16][4], da[DP / 16][4];
#pragma unroll
  for (int kk = 0; kk < DP / 16; ++kk) {
    load_a(qa[kk], qs, ld, m0, kk * 16, l);
    load_a(da[kk], dos, ld, m0, kk * 16, l);
  }
  const float li[2] = {lse_s[m0 + l.g], lse_s[m0 + l.g + 8]};
  const float di[2] = {delta_s[m0 + l.g], delta_s[m0 + l.g + 8]};
  float acc[DP / 8][4] = {};
  const int keys = z.causal ? min(z.tk, q0 + kRows) : z.tk;
  stage_async<T, DP>(kv(0, 0), k + kvbase * z.d, 0, z.tk, z.d);
  stage_async<T, DP>(kv(0, 1), v + kvbase * z.d, 0, z.tk, z.d);
  commit_staged();
  for (int j0 = 0, buf = 0; j0 < keys; j0 += kCols, buf ^= 1) {
    if (j0 + kCols < keys) {
      stage_async<T, DP>(kv(buf ^ 1, 0), k + kvbase * z.d, j0 + kCols, z.tk, z.d);
      stage_async<T, DP>(kv(buf ^ 1, 1), v + kvbase * z.d, j0 + kCols, z.tk, z.d);
    }
    commit_staged();
    wait_staged<1>();
    const T *ks = kv(buf, 0), *vs = kv(buf, 1);
    float s[kCols / 8][4] = {}, dp[kCols / 8][4] = {};
    gemm_abt<T, kCols / 8, DP / 16>(s, qa, ks, ld, l);
    gemm_abt<T, kCols / 8, DP / 16>(dp, da, vs, ld, l);
#pragma unroll
    for (int nb = 0; nb < kCols / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = j0 + nb * 8 + 2 * l.t + (e & 1), r = e / 2;
        const bool ok = row[r] < z.tq && j < z.tk && !(z.causal && j > row[r]);
        const float p = ok ? expf(s[nb][e] * scale - li[r]) : 0.0f;
        s[nb][e] = p * (dp[nb][e] - di[r]);  // dS
      }
    gemm_px<T, DP>(acc, s, ks, ld, l);
    __syncthreads();
  }
  store_rows<T, DP>(dq + qbase * z.d, q0 + m0, z.tq, z.d, acc, scale, scale, l);
  for (int r = threadIdx.x; r < kRows; r += blockDim.x)
    if (q0 + r < z.tq) delta[qbase + q0 + r] = delta_s[r];
}

// dk, dv of a tile of key rows (one batch and kv head), over the query rows of every head in
// its group that see them.
template <typename T, int DP>
__global__ void __launch_bounds__(kWarps * 32)
    dkv_kernel(const T* q, const T* k, const T* v, const float* lse, const T* dout,
               const float* delta, T* dk, T* dv, Dims z, float scale) {
  constexpr int ld = Smem<DP>::ld;
  extern __shared__ uint4 sm[];
  T *ks = reinterpret_cast<T*>(sm), *vs = ks + kRows * ld;  // then q, dO twice
  auto qd = [&](int buf, int which) { return ks + (2 + 2 * buf + which) * kCols * ld; };
  float* terms = reinterpret_cast<float*>(ks + 6 * kCols * ld);  // lse, D of each buffer
  auto term = [&](int buf, int which) { return terms + (2 * buf + which) * kCols; };
  const Tile tile = tile_of(z.tk);
  const int j0 = tile.first, b = tile.bh / z.hkv, kvh = tile.bh % z.hkv;
  const int64_t kvbase = int64_t{tile.bh} * z.tk;
  const Lane l;
  const int m0 = threadIdx.x / 32 * 16;
  const int key[2] = {j0 + m0 + l.g, j0 + m0 + l.g + 8};
  stage<T, DP>(ks, k + kvbase * z.d, j0, z.tk, z.d);
  stage<T, DP>(vs, v + kvbase * z.d, j0, z.tk, z.d);
  __syncthreads();
  uint32_t ka[DP / 16][4], va[DP / 16][4];
#pragma unroll
  for (int kk = 0; kk < DP / 16; ++kk) {
    load_a(ka[kk], ks, ld, m0, kk * 16, l);
    load_a(va[kk], vs, ld, m0, kk * 16, l);
  }
  float dka[DP / 8][4] = {}, dva[DP / 8][4] = {};
  // The (head of the group, query tile) pairs this key tile sees, in order: pair p is head
  // p / tiles, tile first + p % tiles.
  const int first = z.causal ? j0 / kCols : 0, tiles = (z.tq + kCols - 1) / kCols - first;
  auto stage_pair = [&](int p, int buf) {
    const int64_t qbase = (int64_t{b} * z.h + kvh * z.group + p / tiles) * z.tq;
    const int i0 = (first + p % tiles) * kCols;
    stage_async<T, DP>(qd(buf, 0), q + qbase * z.d, i0, z.tq, z.d);
    stage_async<T, DP>(qd(buf, 1), dout + qbase * z.d, i0, z.tq, z.d);
    for (int x = threadIdx.x; x < kCols; x += blockDim.x) {
      const bool ok = i0 + x < z.tq;
      term(buf, 0)[x] = ok ? lse[qbase + i0 + x] : 0.0f;
      term(buf, 1)[x] = ok ? delta[qbase + i0 + x] : 0.0f;
    }
  };
  const int pairs = z.group * max(tiles, 0);
  if (pairs > 0) stage_pair(0, 0);
  commit_staged();
  for (int p = 0, buf = 0; p < pairs; ++p, buf ^= 1) {
    if (p + 1 < pairs) stage_pair(p + 1, buf ^ 1);
    commit_staged();
    wait_staged<1>();
    const int i0 = (first + p % tiles) * kCols;
    const T *qs = qd(buf, 0), *dos = qd(buf, 1);
    const float *lse_s = term(buf, 0), *delta_s = term(buf, 1);
    {
      float st[kCols / 8][4] = {}, dpt[kCols / 8][4] = {};  // S^T, dP^T: keys x queries
      gemm_abt<T, kCols / 8, DP / 16>(st, ka, qs, ld, l);
      gemm_abt<T, kCols / 8, DP / 16>(dpt, va, dos, ld, l);
#pragma unroll
      for (int nb = 0; nb < kCols / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = nb * 8 + 2 * l.t + (e & 1), i = i0 + c, r = e / 2;
          const bool ok = key[r] < z.tk && i < z.tq && !(z.causal && i < key[r]);
          const float p = ok ? expf(st[nb][e] * scale - lse_s[c]) : 0.0f;
          st[nb][e] = p;
          dpt[nb][e] = p * (dpt[nb][e] - delta_s[c]);  // dS^T
        }
      gemm_px<T, DP>(dva, st, dos, ld, l);
      gemm_px<T, DP>(dka, dpt, qs, ld, l);
    }
    __syncthreads();
  }
  store_rows<T, DP>(dk + kvbase * z.d, j0 + m0, z.tk, z.d, dka, scale, scale, l);
  store_rows<T, DP>(dv + kvbase * z.d, j0 + m0, z.tk, z.d, dva, 1.0f, 1.0f, l);
}

// The tensor-core path takes the op when its operands are 16-bit, it has no bias, and the head
// dim is a multiple of 8 (16-byte rows) up to 128.
bool eligible(const Args& a, int bias_input, Dims* z) {
  const DType dt = a.in_types[0].dtype;
  if ((dt != DType::bf16 && dt != DType::f16) || a.num_inputs() > bias_input) return false;
  const Shape &sq = a.in_shape(0), &sk = a.in_shape(1);
  if (sq[3] % 8 != 0 || sq[3] > 128 || sk[2] == 0) return false;
  if (sq[0] * sq[1] * sq[2] * sq[3] >= (int64_t{1} << 31) ||
      sk[0] * sk[1] * sk[2] * sk[3] >= (int64_t{1} << 31))
    return false;
  *z =
      Dims{static_cast<int>(sq[0]),         static_cast<int>(sq[1]),        static_cast<int>(sq[2]),
           static_cast<int>(sk[2]),         static_cast<int>(sq[3]),        static_cast<int>(sk[1]),
           static_cast<int>(sq[1] / sk[1]), a.attr<AttentionAttrs>().causal};
  return true;
}

// Launches kernel on `blocks` blocks with `bytes` of dynamic shared memory, over the default
// 48 KiB (the limit is a per-kernel attribute; setting it is a host-side call of microseconds).
template <typename Kernel, typename... A>
void launch(Kernel kernel, int64_t blocks, size_t bytes, cudaStream_t s, A... args) {
  TS_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(bytes)));
  kernel<<<static_cast<unsigned>(blocks), kWarps * 32, bytes, s>>>(args...);
  TS_CUDA_LAUNCH();
}

template <typename T, int DP>
void forward(const Args& a, const Dims& z) {
  const float scale = static_cast<float>(a.attr<AttentionAttrs>().scale);
  const int64_t blocks = int64_t{z.b} * z.h * ((z.tq + kRows - 1) / kRows);
  launch(forward_kernel<T, DP>, blocks, Smem<DP>::forward, a.stream, static_cast<const T*>(a.in[0]),
         static_cast<const T*>(a.in[1]), static_cast<const T*>(a.in[2]), static_cast<T*>(a.out[0]),
         a.fout(1), z, scale);
}

template <typename T, int DP>
void backward(const Args& a, const Dims& z) {
  const float scale = static_cast<float>(a.attr<AttentionAttrs>().scale);
  float* delta = nullptr;
  TS_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&delta),
                          static_cast<size_t>(z.b) * z.h * z.tq * sizeof(float), a.stream));
  auto in = [&](int i) { return static_cast<const T*>(a.in[static_cast<size_t>(i)]); };
  auto out = [&](int i) { return static_cast<T*>(a.out[static_cast<size_t>(i)]); };
  launch(dq_kernel<T, DP>, int64_t{z.b} * z.h * ((z.tq + kRows - 1) / kRows), Smem<DP>::backward,
         a.stream, in(0), in(1), in(2), in(3), a.fin(4), in(5), out(0), delta, z, scale);
  launch(dkv_kernel<T, DP>, int64_t{z.b} * z.hkv * ((z.tk + kRows - 1) / kRows), Smem<DP>::backward,
         a.stream, in(0), in(1), in(2), a.fin(4), in(5), delta, out(1), out(2), z, scale);
  TS_CUDA(cudaFreeAsync(delta, a.stream));
}

// Runs run(T*, integral_constant DP, dims) for an eligible op (the score bias, if any, at input
// bias_input): T its 16-bit type, DP its head dim padded to 64 or 128. False if not eligible.
template <typename F>
bool on_tensor_cores(const Args& a, int bias_input, F run) {
  Dims z;
  if (!eligible(a, bias_input, &z)) return false;
  if (int64_t{z.b} * z.h * z.tq == 0) return true;
  auto padded = [&](auto* tag) {
    if (z.d <= 64)
      run(tag, std::integral_constant<int, 64>(), z);
    else
      run(tag, std::integral_constant<int, 128>(), z);
  };
  if (a.in_types[0].dtype == DType::bf16)
    padded(static_cast<__nv_bfloat16*>(nullptr));
  else
    padded(static_cast<__half*>(nullptr));
  return true;
}

}  // namespace

bool attention_tensor_cores(const Args& a) {
  return on_tensor_cores(a, 3, [&](auto* tag, auto dp, const Dims& z) {
    forward<std::remove_pointer_t<decltype(tag)>, decltype(dp)::value>(a, z);
  });
}

bool attention_grad_tensor_cores(const Args& a) {
  return on_tensor_cores(a, 6, [&](auto* tag, auto dp, const Dims& z) {
    backward<std::remove_pointer_t<decltype(tag)>, decltype(dp)::value>(a, z);
  });
}

}  // namespace tessera::cuda
