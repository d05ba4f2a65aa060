// CUDA kernels of the neural-network ops (embedding, RoPE, softmax, causal mask,
// cross-entropy, vocab-parallel ops; the norms are in kernels_norm.cu), the device twins of
// backend/cpu/kernels_nn.cc. Row-wise
// ops reduce in a fixed order (one block per row), embedding_grad sums a row's tokens in token
// order after a stable sort: no float atomics, so every run gives the same result.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <type_traits>

#include "backend/cuda/kernels.h"
#include "backend/cuda/rows.cuh"
#include "backend/cuda/storage.cuh"

namespace tessera::cuda {

namespace {

// The columns [first, first + v) of the vocabulary that a block of logits holds (first from the
// device's shard index, 0 without one) and how many of them are classes (0: all).
struct Cols {
  int64_t first, k;
};
__device__ Cols block_cols(const int32_t* shard, int64_t v, int64_t vocab) {
  const int64_t first = shard ? static_cast<int64_t>(shard[0]) * v : 0;
  const int64_t k = vocab > 0 ? vocab - first : v;
  return {first, k < 0 ? 0 : (k > v ? v : k)};
}

// ---- embedding ---------------------------------------------------------------------------

// One block per token. Row `first + r` of the vocabulary is row r of the table, first =
// shard[0] * rows (0 without a shard). An id outside the table gives a zero row (the CPU kernel
// refuses plain embedding's bad ids; the device cannot report one) instead of out of bounds.
__global__ void embedding_kernel(const float* __restrict__ table, const int32_t* __restrict__ ids,
                                 const int32_t* __restrict__ shard, float* __restrict__ y,
                                 int64_t rows, int64_t c, int64_t n) {
  const int64_t first = shard ? static_cast<int64_t>(shard[0]) * rows : 0;
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t r = ids[i] - first;
    float* yr = y + i * c;
    if (r >= 0 && r < rows) {
      const float* tr = table + r * c;
      for (int64_t j = threadIdx.x; j < c; j += blockDim.x) yr[j] = tr[j];
    } else {
      for (int64_t j = threadIdx.x; j < c; j += blockDim.x) yr[j] = 0.0f;
    }
  }
}

// Sort keys of embedding_grad: each token's table row (`rows` when outside the table) and its
// position.
__global__ void grad_keys_kernel(const int32_t* __restrict__ ids, const int32_t* __restrict__ shard,
                                 int64_t rows, int n, uint32_t* __restrict__ keys,
                                 int32_t* __restrict__ pos) {
  const int64_t first = shard ? static_cast<int64_t>(shard[0]) * rows : 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int64_t r = ids[i] - first;
    keys[i] = static_cast<uint32_t>(r >= 0 && r < rows ? r : rows);
    pos[i] = i;
  }
}

// After a stable sort by table row, the tokens of each row are a run in token order. A block per
// run start sums the run's dy rows in that order (the CPU kernel's order) into its table row.
__global__ void embedding_grad_kernel(const float* __restrict__ dy,
                                      const uint32_t* __restrict__ keys,
                                      const int32_t* __restrict__ pos, float* __restrict__ dt,
                                      int64_t rows, int64_t c, int n) {
  for (int p = blockIdx.x; p < n; p += gridDim.x) {
    const uint32_t key = keys[p];
    if (key >= rows || (p > 0 && keys[p - 1] == key)) continue;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      float acc = 0.0f;
      for (int q = p; q < n && keys[q] == key; ++q) acc += dy[pos[q] * c + j];
      dt[key * c + j] = acc;
    }
  }
}

void embedding_impl(const Args& a, const int32_t* shard) {
  const int64_t rows = a.in_shape(0)[0], c = a.in_shape(0)[1], n = a.in_shape(1).numel();
  if (n == 0 || c == 0) return;
  embedding_kernel<<<row_grid(n), row_threads(c), 0, a.stream>>>(a.fin(0), a.iin(1), shard,
                                                                 a.fout(0), rows, c, n);
  TS_CUDA_LAUNCH();
}

// Zeroes the table gradient, sorts the tokens by table row (CUB's radix sort is stable) in
// stream-ordered scratch memory, then sums each row's run.
void embedding_grad_impl(const Args& a, const int32_t* shard) {
  const int64_t rows = a.out_shape(0)[0], c = a.out_shape(0)[1];
  const int n = static_cast<int>(a.in_shape(1).numel());
  float* dt = a.fout(0);
  if (rows == 0 || c == 0) return;
  TS_CUDA(cudaMemsetAsync(dt, 0, static_cast<size_t>(rows * c) * sizeof(float), a.stream));
  if (n == 0) return;
  int bits = 1;  // keys are in [0, rows]
  while ((int64_t{1} << bits) <= rows) ++bits;
  size_t temp = 0;
  TS_CUDA(cub::DeviceRadixSort::SortPairs(
      nullptr, temp, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, 0, bits, a.stream));
  const size_t arr = (static_cast<size_t>(n) * 4 + 255) / 256 * 256;
  char* buf = nullptr;
  TS_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&buf), 4 * arr + temp, a.stream));
  auto* keys = reinterpret_cast<uint32_t*>(buf);
  auto* sorted_keys = reinterpret_cast<uint32_t*>(buf + arr);
  auto* pos = reinterpret_cast<int32_t*>(buf + 2 * arr);
  auto* sorted_pos = reinterpret_cast<int32_t*>(buf + 3 * arr);
  grad_keys_kernel<<<blocks_for(n), 256, 0, a.stream>>>(a.iin(1), shard, rows, n, keys, pos);
  TS_CUDA_LAUNCH();
  TS_CUDA(cub::DeviceRadixSort::SortPairs(buf + 4 * arr, temp, keys, sorted_keys, pos, sorted_pos,
                                          n, 0, bits, a.stream));
  embedding_grad_kernel<<<row_grid(n), row_threads(c), 0, a.stream>>>(a.fin(0), sorted_keys,
                                                                      sorted_pos, dt, rows, c, n);
  TS_CUDA_LAUNCH();
  TS_CUDA(cudaFreeAsync(buf, a.stream));
}

void embedding(OpKind, const Args& a) { embedding_impl(a, nullptr); }
void vocab_embedding(OpKind, const Args& a) { embedding_impl(a, a.iin(2)); }
void embedding_grad(OpKind, const Args& a) { embedding_grad_impl(a, nullptr); }
void vocab_embedding_grad(OpKind, const Args& a) { embedding_grad_impl(a, a.iin(2)); }

// ---- rope, softmax, mask -----------------------------------------------------------------

// x [B,T,H,D]: one thread per (b, t, i < D/2) computes the angle t * theta^(-2i/D) in double
// (as the CPU kernel's table; t: sequence_position) and rotates the pair (i, i + D/2) per head.
__global__ void rope_kernel(const float* __restrict__ x, float* __restrict__ y,
                            const int32_t* __restrict__ block, int64_t t, int64_t h, int64_t d,
                            double theta, bool inverse, int64_t zigzag, int64_t n) {
  const int64_t half = d / 2, b = block ? block[0] : 0, z = block ? zigzag : 0;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bp = e / half, i = e - bp * half, p = sequence_position(bp % t, b, t, z);
    const double ang =
        static_cast<double>(p) * pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    const float cs = static_cast<float>(cos(ang));
    const float sn = static_cast<float>(inverse ? -sin(ang) : sin(ang));
    for (int64_t hh = 0; hh < h; ++hh) {
      const int64_t off = (bp * h + hh) * d;
      const float x0 = x[off + i], x1 = x[off + i + half];
      y[off + i] = x0 * cs - x1 * sn;
      y[off + i + half] = x1 * cs + x0 * sn;
    }
  }
}

void rope(OpKind, const Args& a) {
  const Shape& s = a.in_shape(0);
  const int64_t n = s[0] * s[1] * (s[3] / 2);
  if (n == 0 || s[2] == 0) return;
  const RopeAttrs& r = a.attr<RopeAttrs>();
  const int32_t* block = a.num_inputs() == 2 ? a.iin(1) : nullptr;  // rope's optional input
  rope_kernel<<<blocks_for(n), 256, 0, a.stream>>>(a.fin(0), a.fout(0), block, s[1], s[2], s[3],
                                                   r.theta, r.inverse, r.zigzag, n);
  TS_CUDA_LAUNCH();
}

__global__ void softmax_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t rows,
                               int64_t c) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * c;
    float* yr = y + r * c;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_reduce(m, Max());
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float e = expf(xr[j] - m);
      yr[j] = e;
      sum += e;
    }
    const float inv = 1.0f / block_reduce(sum, Sum());
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) yr[j] *= inv;  // this thread's writes
  }
}

__global__ void softmax_grad_kernel(const float* __restrict__ y, const float* __restrict__ dy,
                                    float* __restrict__ dx, int64_t rows, int64_t c) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *yr = y + r * c, *dyr = dy + r * c;
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) dot += yr[j] * dyr[j];
    dot = block_reduce(dot, Sum());
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) dx[r * c + j] = yr[j] * (dyr[j] - dot);
  }
}

void softmax(OpKind, const Args& a) {
  const int64_t c = a.in_shape(0)[-1], numel = a.in_shape(0).numel();
  if (numel == 0) return;
  const int64_t rows = numel / c;
  softmax_kernel<<<row_grid(rows), row_threads(c), 0, a.stream>>>(a.fin(0), a.fout(0), rows, c);
  TS_CUDA_LAUNCH();
}

void softmax_grad(OpKind, const Args& a) {
  const int64_t c = a.in_shape(0)[-1], numel = a.in_shape(0).numel();
  if (numel == 0) return;
  const int64_t rows = numel / c;
  softmax_grad_kernel<<<row_grid(rows), row_threads(c), 0, a.stream>>>(a.fin(0), a.fin(1),
                                                                       a.fout(0), rows, c);
  TS_CUDA_LAUNCH();
}

// One block per row of the [..., T, T] matrices; row i keeps columns j <= i.
__global__ void causal_mask_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t rows,
                                   int64_t t, float fill) {
  for (int64_t mi = blockIdx.x; mi < rows; mi += gridDim.x) {
    const int64_t i = mi % t;
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x)
      y[mi * t + j] = j > i ? fill : x[mi * t + j];
  }
}

void causal_mask(OpKind, const Args& a) {
  const int64_t t = a.in_shape(0)[-1], numel = a.in_shape(0).numel();
  if (numel == 0) return;
  const int64_t rows = numel / t;
  causal_mask_kernel<<<row_grid(rows), row_threads(t), 0, a.stream>>>(
      a.fin(0), a.fout(0), rows, t, static_cast<float>(a.attr<ScalarAttrs>().value));
  TS_CUDA_LAUNCH();
}

// ---- cross-entropy and logsumexp ---------------------------------------------------------

// Folds x into a running (max m, sum s of exp(. - m)), and merges two such pairs.
__device__ inline void lse_take(float& m, float& s, float x) {
  if (x == -INFINITY) return;
  if (x > m) {
    s = s * expf(m - x) + 1.0f;
    m = x;
  } else {
    s += expf(x - m);
  }
}
__device__ inline void lse_merge(float& m, float& s, float m2, float s2) {
  const float top = fmaxf(m, m2);
  if (top == -INFINITY) return;
  s = s * expf(m - top) + s2 * expf(m2 - top);
  m = top;
}

// log(sum_j exp(row[j])) over a row of v elements, by the whole block in one read (an online
// max and sum per thread, 16-byte packs where the row is aligned, merged over the warps in a
// fixed order). -inf for v == 0, as the CPU's log_sum_exp.
template <typename T>
__device__ float block_log_sum_exp(const T* row, int64_t v) {
  float m = -INFINITY, s = 0.0f;
  int64_t j0 = 0;
  if (reinterpret_cast<uintptr_t>(row) % 16 == 0) {
    using P = Pack<T>;
    const int64_t packs = v / P::kN;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const P x = reinterpret_cast<const P*>(row)[p];
#pragma unroll
      for (int e = 0; e < P::kN; ++e) lse_take(m, s, as_f32(x.v[e]));
    }
    j0 = packs * P::kN;
  }
  for (int64_t j = j0 + threadIdx.x; j < v; j += blockDim.x) lse_take(m, s, as_f32(row[j]));
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    lse_merge(m, s, m2, s2);
  }
  __shared__ float pm[32], ps[32];
  __syncthreads();  // the previous row's readers are done
  if (threadIdx.x % 32 == 0) {
    pm[threadIdx.x / 32] = m;
    ps[threadIdx.x / 32] = s;
  }
  __syncthreads();
  m = pm[0];
  s = ps[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) lse_merge(m, s, pm[w], ps[w]);
  return m + logf(s);
}

// y[i] = logsumexp of the class columns of row i (block_cols; -inf when there are none). With
// vocab == 0 and no shard: all v columns (logsumexp).
template <typename T>
__global__ void lse_kernel(const T* __restrict__ x, const int32_t* __restrict__ shard,
                           float* __restrict__ y, int64_t n, int64_t v, int64_t vocab) {
  const int64_t k = block_cols(shard, v, vocab).k;
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float l = k > 0 ? block_log_sum_exp(x + i * v, k) : -INFINITY;
    if (threadIdx.x == 0) y[i] = l;
  }
}

template <typename T>
void launch_lse(const Args& a, const int32_t* shard, float* y, int64_t n, int64_t v,
                int64_t vocab) {
  if (n == 0) return;
  lse_kernel<T><<<row_grid(n), row_threads(v), 0, a.stream>>>(in<T>(a, 0), shard, y, n, v, vocab);
  TS_CUDA_LAUNCH();
}

// loss = sum_i (lse[i] - logits[i, target[i]]) / rows, in double by one block in a fixed order.
// The CPU kernel rejects targets outside [0, k); here such a row makes the loss NaN.
template <typename T>
__global__ void ce_loss_kernel(const T* __restrict__ logits, const int32_t* __restrict__ tgt,
                               const float* __restrict__ lse, float* __restrict__ loss, int64_t n,
                               int64_t v, int64_t k, int64_t rows) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t t = tgt[i];
    s += t >= 0 && t < k ? static_cast<double>(lse[i]) - as_f32(logits[i * v + t]) : NAN;
  }
  s = block_reduce(s, Sum());
  if (threadIdx.x == 0) loss[0] = static_cast<float>(s / static_cast<double>(rows));
}

// The logits as stored (f32, bf16, f16); the loss and the log-sum-exps are f32.
void cross_entropy(OpKind op, const Args& a) {
  if (!one_storage(a, {0}, {})) return run_in_f32(op, a, cross_entropy);
  const int64_t v = a.in_shape(0)[-1], n = logit_rows(a.in_shape(0));
  // The class columns (the rest is padding), the rows the mean divides by (all ranks' when they
  // are split). Launched for n == 0 too, to write the scalar loss (0 / rows, as on the CPU).
  const CrossEntropyAttrs& ce = a.attr<CrossEntropyAttrs>();
  const int64_t k = ce.classes > 0 ? ce.classes : v, rows = ce.rows > 0 ? ce.rows : n;
  with_storage(a.in_types[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_lse<T>(a, nullptr, a.fout(1), n, v, ce.classes);
    ce_loss_kernel<T>
        <<<1, 512, 0, a.stream>>>(in<T>(a, 0), a.iin(1), a.fout(1), a.fout(0), n, v, k, rows);
  });
  TS_CUDA_LAUNCH();
}

// d logits = (softmax - onehot(target)) * dloss / rows on the block's columns [first, first + v)
// (first = shard[0] * v, 0 without a shard); padding columns get 0, a target outside the block
// adds no one-hot term. One block per row.
template <typename T>
__global__ void ce_grad_kernel(const T* __restrict__ logits, const int32_t* __restrict__ tgt,
                               const float* __restrict__ lse, const float* __restrict__ dloss,
                               const int32_t* __restrict__ shard, T* __restrict__ dl, int64_t n,
                               int64_t v, int64_t vocab, int64_t rows) {
  const Cols b = block_cols(shard, v, vocab);
  const float scale = dloss[0] / static_cast<float>(rows);
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const T* row = logits + i * v;
    T* d = dl + i * v;
    const float l = lse[i];
    const int64_t t = tgt[i] - b.first;
    // Rounded before the one-hot subtraction, as the CPU's two steps (no fused multiply-add).
    auto grad = [&](int64_t j, float x) {
      float g = j < b.k ? __fmul_rn(expf(x - l), scale) : 0.0f;
      return j == t ? g - scale : g;
    };
    using P = Pack<T>;
    int64_t j0 = 0;
    if (v % P::kN == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(d) % 16 == 0) {
      for (int64_t p = threadIdx.x; p < v / P::kN; p += blockDim.x) {
        const P x = reinterpret_cast<const P*>(row)[p];
        P g;
#pragma unroll
        for (int e = 0; e < P::kN; ++e) g.v[e] = from_f32<T>(grad(p * P::kN + e, as_f32(x.v[e])));
        reinterpret_cast<P*>(d)[p] = g;
      }
      j0 = v;
    }
    for (int64_t j = j0 + threadIdx.x; j < v; j += blockDim.x)
      d[j] = from_f32<T>(grad(j, as_f32(row[j])));
  }
}

// The logits and their gradient as stored; the log-sum-exps and the loss gradient f32.
void ce_grad_impl(OpKind op, const Args& a, const int32_t* shard, KernelFn self) {
  if (!one_storage(a, {0}, {0})) return run_in_f32(op, a, self);
  const int64_t v = a.in_shape(0)[-1], n = logit_rows(a.in_shape(0));
  if (n == 0 || v == 0) return;
  const CrossEntropyAttrs& ce = a.attr<CrossEntropyAttrs>();
  const int64_t rows = ce.rows > 0 ? ce.rows : n;  // the global rows when split across ranks
  with_storage(a.in_types[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ce_grad_kernel<T><<<row_grid(n), row_threads(v), 0, a.stream>>>(
        in<T>(a, 0), a.iin(1), a.fin(2), a.fin(3), shard, out<T>(a, 0), n, v, ce.classes, rows);
  });
  TS_CUDA_LAUNCH();
}

void cross_entropy_grad(OpKind op, const Args& a) {
  ce_grad_impl(op, a, nullptr, cross_entropy_grad);
}
void vocab_cross_entropy_grad(OpKind op, const Args& a) {
  ce_grad_impl(op, a, a.iin(4), vocab_cross_entropy_grad);
}

void logsumexp(OpKind, const Args& a) {
  launch_lse<float>(a, nullptr, a.fout(0), a.out_shape(0).numel(), a.in_shape(0)[-1], 0);
}

void vocab_logsumexp(OpKind, const Args& a) {
  const int64_t v = a.in_shape(0)[-1], n = logit_rows(a.in_shape(0));
  launch_lse<float>(a, a.iin(1), a.fout(0), n, v, a.attr<CrossEntropyAttrs>().classes);
}

// y[i] = logits[i, target[i] - first] where the target is in the block, else 0.
__global__ void vocab_pick_kernel(const float* __restrict__ logits, const int32_t* __restrict__ tgt,
                                  const int32_t* __restrict__ shard, float* __restrict__ y,
                                  int64_t n, int64_t v) {
  const int64_t first = static_cast<int64_t>(shard[0]) * v;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = tgt[i] - first;
    y[i] = t >= 0 && t < v ? logits[i * v + t] : 0.0f;
  }
}

void vocab_pick(OpKind, const Args& a) {
  const int64_t v = a.in_shape(0)[-1], n = logit_rows(a.in_shape(0));
  if (n == 0) return;
  vocab_pick_kernel<<<blocks_for(n), 256, 0, a.stream>>>(a.fin(0), a.iin(1), a.iin(2), a.fout(0), n,
                                                         v);
  TS_CUDA_LAUNCH();
}

}  // namespace

void register_nn_kernels(KernelTable& t) {
  t.add(OpKind::embedding, embedding);
  t.add(OpKind::embedding_grad, embedding_grad);
  t.add(OpKind::vocab_embedding, vocab_embedding);
  t.add(OpKind::vocab_embedding_grad, vocab_embedding_grad);
  t.add(OpKind::rope, rope);
  t.add(OpKind::softmax, softmax);
  t.add(OpKind::softmax_grad, softmax_grad);
  t.add(OpKind::causal_mask, causal_mask);
  t.add(OpKind::cross_entropy, cross_entropy, /*low_precision=*/true);
  t.add(OpKind::cross_entropy_grad, cross_entropy_grad, /*low_precision=*/true);
  t.add(OpKind::logsumexp, logsumexp);
  t.add(OpKind::vocab_logsumexp, vocab_logsumexp);
  t.add(OpKind::vocab_pick, vocab_pick);
  t.add(OpKind::vocab_cross_entropy_grad, vocab_cross_entropy_grad, /*low_precision=*/true);
}

}  // namespace tessera::cuda
