// Attention on the tensor cores: bf16/f16 q, k, v [B,H,T,D] (kv heads grouped as in
// kernels_attention.cu), no score bias, head dims that are multiples of 8 up to 128 (padded
// with zeros to 64 or 128 in shared memory). What the f32 kernels compute, with the products
// on the tensor cores (WMMA 16x16x16, f32 accumulation) and the softmax in f32 registers.
//
// A block is 4 warps; each warp owns 16 rows of the block's 64 (queries in the forward and dq
// passes, keys in the dk/dv pass), so a warp's rows of the score tile, of the probabilities
// and of the forward's output accumulator are touched by that warp alone and only the staged
// tiles of the other side need the whole block. Two lanes share a row: each takes half its
// columns and they combine with one shuffle.
//
// - forward: per query tile, walks the key tiles (causal: those at or before it), S = Q K^T,
//   the online softmax (running max and sum per row, the output accumulator rescaled in
//   shared memory), O += P V with P rounded to the storage type, as FlashAttention-2 does.
// - backward, deterministic (no atomics): a dq pass per query tile (S and dP = dO V^T
//   recomputed, dS = P (dP - D), dq += dS K kept in registers; D_i = dO_i . O_i is written for
//   the second pass) and a dk/dv pass per key tile over the query tiles of every head in its
//   group (dv += P^T dO, dk += dS^T Q).
#include <mma.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/kernels.h"
#include "backend/cuda/storage.cuh"

namespace tessera::cuda {

namespace {

using namespace nvcuda;

constexpr int kWarps = 4;
constexpr int kRows = 16 * kWarps;  // rows of a block's tile (queries or keys)
constexpr int kCols = 64;           // rows of the other side per staged tile
constexpr int kSPad = 4;            // f32 row padding (keeps rows 16-byte aligned)
constexpr int kTPad = 8;            // 16-bit row padding

struct Dims {
  int b, h, tq, tk, d, hkv, group;
  bool causal;
};

template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major>;
template <typename T>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Stages rows [r0, r0 + kRows) of x (rows of d elements, d a multiple of 8) as a [kRows][DP]
// tile with row stride ld; rows past `rows` and columns past d are zero.
template <typename T, int DP>
__device__ void stage(T* s, int ld, const T* x, int64_t r0, int64_t rows, int d) {
  constexpr int kVecs = DP / 8;  // 16-byte vectors per staged row
  for (int idx = threadIdx.x; idx < kRows * kVecs; idx += blockDim.x) {
    const int row = idx / kVecs, c = (idx % kVecs) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r0 + row < rows && c < d) v = *reinterpret_cast<const uint4*>(x + (r0 + row) * d + c);
    *reinterpret_cast<uint4*>(s + row * ld + c) = v;
  }
}

// out (16 x 16 x n_blocks, f32 staged at `acc` with stride lda) = A (16 x K) . B, over
// K = 16 k_blocks: A row-major at a (stride lda_), B row-major or, with BT, B^T row-major.
template <typename T, bool kBTransposed>
__device__ void warp_gemm(float* out, int ldo, const T* a, int lda, const T* b, int ldb,
                          int n_blocks, int k_blocks) {
  for (int nb = 0; nb < n_blocks; ++nb) {
    Acc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kb = 0; kb < k_blocks; ++kb) {
      FragA<T> fa;
      wmma::load_matrix_sync(fa, a + kb * 16, lda);
      if constexpr (kBTransposed) {  // b holds the n x k matrix row-major: B col-major
        FragBT<T> fb;
        wmma::load_matrix_sync(fb, b + nb * 16 * ldb + kb * 16, ldb);
        wmma::mma_sync(acc, fa, fb, acc);
      } else {
        FragB<T> fb;
        wmma::load_matrix_sync(fb, b + kb * 16 * ldb + nb * 16, ldb);
        wmma::mma_sync(acc, fa, fb, acc);
      }
    }
    wmma::store_matrix_sync(out + nb * 16, acc, ldo, wmma::mem_row_major);
  }
}

// Writes a warp's 16 x DP accumulators (times `scale`) to rows [r0, r0 + 16) of x (rows of d
// elements, `rows` of them), through a 16 x 16 f32 scratch at sc (stride kCols + kSPad).
template <typename T, int DP>
__device__ void store_rows(T* x, int64_t r0, int64_t rows, int d, Acc (&acc)[DP / 16], float* sc,
                           float scale) {
  constexpr int ld = kCols + kSPad;
  const int lane = threadIdx.x % 32, r = lane / 2, c0 = (lane % 2) * 8;
#pragma unroll
  for (int nb = 0; nb < DP / 16; ++nb) {
    wmma::store_matrix_sync(sc, acc[nb], ld, wmma::mem_row_major);
    __syncwarp();
    if (r0 + r < rows)
      for (int e = 0; e < 8; ++e) {
        const int c = nb * 16 + c0 + e;
        if (c < d) x[(r0 + r) * d + c] = from_f32<T>(sc[r * ld + c0 + e] * scale);
      }
    __syncwarp();
  }
}

template <typename T, int DP>
struct Smem {
  static constexpr int ld = DP + kTPad;      // 16-bit staged rows
  static constexpr int lds = kCols + kSPad;  // f32 score rows
  static constexpr int ldp = kCols + kTPad;  // 16-bit probability rows
  static constexpr int ldo = DP + kSPad;     // f32 output rows
  static constexpr size_t tile = size_t{kRows} * ld * sizeof(T);
  static constexpr size_t scores = size_t{kRows} * lds * sizeof(float);
  static constexpr size_t probs = size_t{kRows} * ldp * sizeof(T);
  static constexpr size_t forward = 3 * tile + scores + probs + size_t{kRows} * ldo * 4;
  static constexpr size_t backward = 4 * tile + 2 * scores + 2 * probs + 2 * kCols * 4;
};

template <typename T, int DP>
__global__ void __launch_bounds__(kWarps * 32)
    forward_kernel(const T* q, const T* k, const T* v, T* out, float* lse, Dims z, float scale) {
  using S = Smem<T, DP>;
  extern __shared__ float4 sm4[];
  char* sm = reinterpret_cast<char*>(sm4);
  T *qs = reinterpret_cast<T*>(sm), *ks = reinterpret_cast<T*>(sm + S::tile),
    *vs = reinterpret_cast<T*>(sm + 2 * S::tile);
  float* ss = reinterpret_cast<float*>(sm + 3 * S::tile);
  T* ps = reinterpret_cast<T*>(sm + 3 * S::tile + S::scores);
  float* os = reinterpret_cast<float*>(sm + 3 * S::tile + S::scores + S::probs);
  const int tiles = (z.tq + kRows - 1) / kRows;
  const int bh = blockIdx.x / tiles, q0 = (blockIdx.x % tiles) * kRows;
  const int b = bh / z.h, h = bh % z.h;
  const int64_t qbase = int64_t{bh} * z.tq, kvbase = (int64_t{b} * z.hkv + h / z.group) * z.tk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = warp * 16 + lane / 2, half = lane % 2;  // this lane's row and half of it
  const int64_t i = q0 + r;
  stage<T, DP>(qs, S::ld, q + qbase * z.d, q0, z.tq, z.d);
  for (int c = half * DP / 2; c < (half + 1) * DP / 2; ++c) os[r * S::ldo + c] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int keys = z.causal ? min(z.tk, q0 + kRows) : z.tk;
  for (int j0 = 0; j0 < keys; j0 += kCols) {
    __syncthreads();
    stage<T, DP>(ks, S::ld, k + kvbase * z.d, j0, z.tk, z.d);
    stage<T, DP>(vs, S::ld, v + kvbase * z.d, j0, z.tk, z.d);
    __syncthreads();
    warp_gemm<T, true>(ss + warp * 16 * S::lds, S::lds, qs + warp * 16 * S::ld, S::ld, ks, S::ld,
                       kCols / 16, DP / 16);
    __syncwarp();
    float* srow = ss + r * S::lds;
    float mx = -INFINITY;
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const int j = j0 + c;
      if (j < z.tk && !(z.causal && j > i)) mx = fmaxf(mx, srow[c] * scale);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
    float sum = 0.0f;
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const int j = j0 + c;
      const bool ok = j < z.tk && !(z.causal && j > i);
      const float p = ok ? expf(srow[c] * scale - m_new) : 0.0f;
      ps[r * S::ldp + c] = from_f32<T>(p);
      sum += p;  // unrounded: the log-sum-exp is f32's
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum;
    m = m_new;
    for (int c = half * DP / 2; c < (half + 1) * DP / 2; ++c) os[r * S::ldo + c] *= corr;
    __syncwarp();
    // O += P V, the accumulators loaded from and stored back to the warp's rows of os.
    for (int nb = 0; nb < DP / 16; ++nb) {
      Acc acc;
      float* o = os + warp * 16 * S::ldo + nb * 16;
      wmma::load_matrix_sync(acc, o, S::ldo, wmma::mem_row_major);
      for (int kb = 0; kb < kCols / 16; ++kb) {
        FragA<T> fa;
        FragB<T> fb;
        wmma::load_matrix_sync(fa, ps + warp * 16 * S::ldp + kb * 16, S::ldp);
        wmma::load_matrix_sync(fb, vs + kb * 16 * S::ld + nb * 16, S::ld);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(o, acc, S::ldo, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (i >= z.tq) return;
  const float inv = 1.0f / l;
  for (int c = half * DP / 2; c < (half + 1) * DP / 2 && c < z.d; ++c)
    out[(qbase + i) * z.d + c] = from_f32<T>(os[r * S::ldo + c] * inv);
  if (half == 0) lse[qbase + i] = m + logf(l);
}

// dq of a tile of query rows and D_i = dO_i . O_i.
template <typename T, int DP>
__global__ void __launch_bounds__(kWarps * 32)
    dq_kernel(const T* q, const T* k, const T* v, const T* out, const float* lse, const T* dout,
              T* dq, float* delta, Dims z, float scale) {
  using S = Smem<T, DP>;
  extern __shared__ float4 sm4[];
  char* sm = reinterpret_cast<char*>(sm4);
  T *qs = reinterpret_cast<T*>(sm), *dos = reinterpret_cast<T*>(sm + S::tile),
    *ks = reinterpret_cast<T*>(sm + 2 * S::tile), *vs = reinterpret_cast<T*>(sm + 3 * S::tile);
  float* ss = reinterpret_cast<float*>(sm + 4 * S::tile);
  float* dps = ss + kRows * S::lds;
  T* dss = reinterpret_cast<T*>(sm + 4 * S::tile + 2 * S::scores);
  const int tiles = (z.tq + kRows - 1) / kRows;
  const int bh = blockIdx.x / tiles, q0 = (blockIdx.x % tiles) * kRows;
  const int b = bh / z.h, h = bh % z.h;
  const int64_t qbase = int64_t{bh} * z.tq, kvbase = (int64_t{b} * z.hkv + h / z.group) * z.tk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = warp * 16 + lane / 2, half = lane % 2;
  const int64_t i = q0 + r;
  const bool row_ok = i < z.tq;
  stage<T, DP>(qs, S::ld, q + qbase * z.d, q0, z.tq, z.d);
  stage<T, DP>(dos, S::ld, dout + qbase * z.d, q0, z.tq, z.d);
  float di = 0.0f;
  if (row_ok)
    for (int c = half * DP / 2; c < (half + 1) * DP / 2 && c < z.d; ++c)
      di += as_f32(dout[(qbase + i) * z.d + c]) * as_f32(out[(qbase + i) * z.d + c]);
  di += __shfl_xor_sync(0xffffffffu, di, 1);
  const float li = row_ok ? lse[qbase + i] : 0.0f;
  Acc acc[DP / 16];
#pragma unroll
  for (int nb = 0; nb < DP / 16; ++nb) wmma::fill_fragment(acc[nb], 0.0f);
  const int keys = z.causal ? min(z.tk, q0 + kRows) : z.tk;
  for (int j0 = 0; j0 < keys; j0 += kCols) {
    __syncthreads();
    stage<T, DP>(ks, S::ld, k + kvbase * z.d, j0, z.tk, z.d);
    stage<T, DP>(vs, S::ld, v + kvbase * z.d, j0, z.tk, z.d);
    __syncthreads();
    warp_gemm<T, true>(ss + warp * 16 * S::lds, S::lds, qs + warp * 16 * S::ld, S::ld, ks, S::ld,
                       kCols / 16, DP / 16);
    warp_gemm<T, true>(dps + warp * 16 * S::lds, S::lds, dos + warp * 16 * S::ld, S::ld, vs, S::ld,
                       kCols / 16, DP / 16);
    __syncwarp();
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const int j = j0 + c;
      const bool ok = row_ok && j < z.tk && !(z.causal && j > i);
      const float p = ok ? expf(ss[r * S::lds + c] * scale - li) : 0.0f;
      dss[r * S::ldp + c] = from_f32<T>(p * (dps[r * S::lds + c] - di));
    }
    __syncwarp();
#pragma unroll
    for (int nb = 0; nb < DP / 16; ++nb)
      for (int kb = 0; kb < kCols / 16; ++kb) {
        FragA<T> fa;
        FragB<T> fb;
        wmma::load_matrix_sync(fa, dss + warp * 16 * S::ldp + kb * 16, S::ldp);
        wmma::load_matrix_sync(fb, ks + kb * 16 * S::ld + nb * 16, S::ld);
        wmma::mma_sync(acc[nb], fa, fb, acc[nb]);
      }
  }
  if (row_ok && half == 0) delta[qbase + i] = di;
  __syncthreads();
  store_rows<T, DP>(dq + qbase * z.d, q0 + warp * 16, z.tq, z.d, acc, ss + warp * 16 * S::lds,
                    scale);
}

// dk, dv of a tile of key rows (one batch and kv head), over the query rows of every head in
// its group that see them.
template <typename T, int DP>
__global__ void __launch_bounds__(kWarps * 32)
    dkv_kernel(const T* q, const T* k, const T* v, const float* lse, const T* dout,
               const float* delta, T* dk, T* dv, Dims z, float scale) {
  using S = Smem<T, DP>;
  extern __shared__ float4 sm4[];
  char* sm = reinterpret_cast<char*>(sm4);
  T *ks = reinterpret_cast<T*>(sm), *vs = reinterpret_cast<T*>(sm + S::tile),
    *qs = reinterpret_cast<T*>(sm + 2 * S::tile), *dos = reinterpret_cast<T*>(sm + 3 * S::tile);
  float* sts = reinterpret_cast<float*>(sm + 4 * S::tile);  // S^T: keys x queries
  float* dpts = sts + kRows * S::lds;
  T* pts = reinterpret_cast<T*>(sm + 4 * S::tile + 2 * S::scores);
  T* dsts = pts + kRows * S::ldp;
  float* ls = reinterpret_cast<float*>(sm + 4 * S::tile + 2 * S::scores + 2 * S::probs);
  float* ds = ls + kCols;
  const int tiles = (z.tk + kRows - 1) / kRows;
  const int bkv = blockIdx.x / tiles, j0 = (blockIdx.x % tiles) * kRows;
  const int b = bkv / z.hkv, kvh = bkv % z.hkv;
  const int64_t kvbase = int64_t{bkv} * z.tk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = warp * 16 + lane / 2, half = lane % 2;
  const int64_t j = j0 + r;
  stage<T, DP>(ks, S::ld, k + kvbase * z.d, j0, z.tk, z.d);
  stage<T, DP>(vs, S::ld, v + kvbase * z.d, j0, z.tk, z.d);
  Acc dka[DP / 16], dva[DP / 16];
#pragma unroll
  for (int nb = 0; nb < DP / 16; ++nb) {
    wmma::fill_fragment(dka[nb], 0.0f);
    wmma::fill_fragment(dva[nb], 0.0f);
  }
  for (int gi = 0; gi < z.group; ++gi) {
    const int64_t qbase = (int64_t{b} * z.h + kvh * z.group + gi) * z.tq;
    for (int i0 = z.causal ? j0 : 0; i0 < z.tq; i0 += kCols) {
      __syncthreads();
      stage<T, DP>(qs, S::ld, q + qbase * z.d, i0, z.tq, z.d);
      stage<T, DP>(dos, S::ld, dout + qbase * z.d, i0, z.tq, z.d);
      for (int x = threadIdx.x; x < kCols; x += blockDim.x) {
        const bool ok = i0 + x < z.tq;
        ls[x] = ok ? lse[qbase + i0 + x] : 0.0f;
        ds[x] = ok ? delta[qbase + i0 + x] : 0.0f;
      }
      __syncthreads();
      warp_gemm<T, true>(sts + warp * 16 * S::lds, S::lds, ks + warp * 16 * S::ld, S::ld, qs, S::ld,
                         kCols / 16, DP / 16);
      warp_gemm<T, true>(dpts + warp * 16 * S::lds, S::lds, vs + warp * 16 * S::ld, S::ld, dos,
                         S::ld, kCols / 16, DP / 16);
      __syncwarp();
      for (int c = half * 32; c < half * 32 + 32; ++c) {
        const int64_t i = i0 + c;
        const bool ok = j < z.tk && i < z.tq && !(z.causal && i < j);
        const float p = ok ? expf(sts[r * S::lds + c] * scale - ls[c]) : 0.0f;
        pts[r * S::ldp + c] = from_f32<T>(p);
        dsts[r * S::ldp + c] = from_f32<T>(p * (dpts[r * S::lds + c] - ds[c]));
      }
      __syncwarp();
#pragma unroll
      for (int nb = 0; nb < DP / 16; ++nb)
        for (int kb = 0; kb < kCols / 16; ++kb) {
          FragA<T> fp, fs;
          FragB<T> fdo, fq;
          wmma::load_matrix_sync(fp, pts + warp * 16 * S::ldp + kb * 16, S::ldp);
          wmma::load_matrix_sync(fdo, dos + kb * 16 * S::ld + nb * 16, S::ld);
          wmma::mma_sync(dva[nb], fp, fdo, dva[nb]);
          wmma::load_matrix_sync(fs, dsts + warp * 16 * S::ldp + kb * 16, S::ldp);
          wmma::load_matrix_sync(fq, qs + kb * 16 * S::ld + nb * 16, S::ld);
          wmma::mma_sync(dka[nb], fs, fq, dka[nb]);
        }
    }
  }
  __syncthreads();
  float* sc = sts + warp * 16 * S::lds;
  store_rows<T, DP>(dk + kvbase * z.d, j0 + warp * 16, z.tk, z.d, dka, sc, scale);
  store_rows<T, DP>(dv + kvbase * z.d, j0 + warp * 16, z.tk, z.d, dva, sc, 1.0f);
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
  *z = Dims{static_cast<int>(sq[0]),         static_cast<int>(sq[1]), static_cast<int>(sq[2]),
            static_cast<int>(sk[2]),         static_cast<int>(sq[3]), static_cast<int>(sk[1]),
            static_cast<int>(sq[1] / sk[1]), a.attrs.causal};
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
  const float scale = static_cast<float>(a.attrs.scalar);
  const int64_t blocks = int64_t{z.b} * z.h * ((z.tq + kRows - 1) / kRows);
  launch(forward_kernel<T, DP>, blocks, Smem<T, DP>::forward, a.stream,
         static_cast<const T*>(a.in[0]), static_cast<const T*>(a.in[1]),
         static_cast<const T*>(a.in[2]), static_cast<T*>(a.out[0]), a.fout(1), z, scale);
}

template <typename T, int DP>
void backward(const Args& a, const Dims& z) {
  const float scale = static_cast<float>(a.attrs.scalar);
  float* delta = nullptr;
  TS_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&delta),
                          static_cast<size_t>(z.b) * z.h * z.tq * sizeof(float), a.stream));
  auto in = [&](int i) { return static_cast<const T*>(a.in[static_cast<size_t>(i)]); };
  auto out = [&](int i) { return static_cast<T*>(a.out[static_cast<size_t>(i)]); };
  launch(dq_kernel<T, DP>, int64_t{z.b} * z.h * ((z.tq + kRows - 1) / kRows), Smem<T, DP>::backward,
         a.stream, in(0), in(1), in(2), in(3), a.fin(4), in(5), out(0), delta, z, scale);
  launch(dkv_kernel<T, DP>, int64_t{z.b} * z.hkv * ((z.tk + kRows - 1) / kRows),
         Smem<T, DP>::backward, a.stream, in(0), in(1), in(2), a.fin(4), in(5), delta, out(1),
         out(2), z, scale);
  TS_CUDA(cudaFreeAsync(delta, a.stream));
}

}  // namespace

bool attention_tensor_cores(const Args& a) {
  Dims z;
  if (!eligible(a, 3, &z)) return false;
  if (int64_t{z.b} * z.h * z.tq == 0) return true;
  const bool bf = a.in_types[0].dtype == DType::bf16;
  if (z.d <= 64)
    bf ? forward<__nv_bfloat16, 64>(a, z) : forward<__half, 64>(a, z);
  else
    bf ? forward<__nv_bfloat16, 128>(a, z) : forward<__half, 128>(a, z);
  return true;
}

bool attention_grad_tensor_cores(const Args& a) {
  Dims z;
  if (!eligible(a, 6, &z)) return false;
  if (int64_t{z.b} * z.h * z.tq == 0) return true;
  const bool bf = a.in_types[0].dtype == DType::bf16;
  if (z.d <= 64)
    bf ? backward<__nv_bfloat16, 64>(a, z) : backward<__half, 64>(a, z);
  else
    bf ? backward<__nv_bfloat16, 128>(a, z) : backward<__half, 128>(a, z);
  return true;
}

}  // namespace tessera::cuda
