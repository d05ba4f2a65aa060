// CUDA kernels of the norms (layernorm, rmsnorm, their gradients, and the fused residual forms
// add_layernorm, layernorm_grad_add, add_rmsnorm and rmsnorm_grad_add of ir/ops_fused.cc), the
// device twins of the norms in backend/cpu/kernels_nn.cc. Each row reduces in a fixed order: every
// run gives the same result.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/kernels.h"
#include "backend/cuda/rows.cuh"
#include "backend/cuda/storage.cuh"

namespace tessera::cuda {

namespace {

// ---- norms -------------------------------------------------------------------------------

// What norm_row accumulates: a row's elements (layernorm's mean) or their squares (rmsnorm's).
struct Value {
  __device__ float operator()(float v) const { return v; }
};
struct Square {
  __device__ float operator()(float v) const { return v * v; }
};
// Row r of x, or with a residual (res and sum not null) of sum = x + res, rounded to T and
// written as the unfused add writes it, each thread reading back only what it wrote; this
// thread's share of `term` of the row's elements is added to *acc. Returns the row normalized.
template <typename T, typename Term>
__device__ const T* norm_row(const T* x, const T* res, T* sum, int64_t r, int64_t c, Term term,
                             float* acc) {
  const T* xr = x + r * c;
  if (!res) {
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) *acc += term(as_f32(xr[j]));
    return xr;
  }
  const T* rr = res + r * c;
  T* sr = sum + r * c;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    sr[j] = from_f32<T>(as_f32(xr[j]) + as_f32(rr[j]));
    *acc += term(as_f32(sr[j]));
  }
  return sr;
}

// The norms read and write their storage type T (x, w, b, y, dy, dx, dw, db) as stored, with
// the row statistics (mean, rstd) in f32. layernorm_grad_add adds dres to dx before dx is
// rounded to T (once; the unfused add rounds twice, and nvcc may contract it into an FMA).
// With a residual (add_layernorm: res and sum not null), the rows normalized are sum = x + res,
// rounded to T and written as the unfused add writes them; each thread reads back only what it
// wrote.
template <typename T>
__global__ void layernorm_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                 const T* __restrict__ b, T* __restrict__ y,
                                 float* __restrict__ mean, float* __restrict__ rstd, int64_t rows,
                                 int64_t c, float eps, const T* __restrict__ res = nullptr,
                                 T* __restrict__ sum = nullptr) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* yr = y + r * c;
    float s = 0.0f;
    const T* xr = norm_row(x, res, sum, r, c, Value(), &s);
    const float m = block_reduce(s, Sum()) / static_cast<float>(c);
    float v = 0.0f;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float d = as_f32(xr[j]) - m;
      v += d * d;
    }
    const float var = block_reduce(v, Sum()) / static_cast<float>(c);
    const float rs = 1.0f / sqrtf(var + eps);
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
      yr[j] = from_f32<T>((as_f32(xr[j]) - m) * rs * as_f32(w[j]) + as_f32(b[j]));
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

template <typename T>
__global__ void layernorm_grad_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                      const T* __restrict__ w, const float* __restrict__ mean,
                                      const float* __restrict__ rstd, T* __restrict__ dx,
                                      int64_t rows, int64_t c,
                                      const T* __restrict__ dres = nullptr) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = x + r * c, *dyr = dy + r * c;
    const float m = mean[r], s = rstd[r];
    float sd = 0.0f, sdx = 0.0f;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float xh = (as_f32(xr[j]) - m) * s, d = as_f32(dyr[j]) * as_f32(w[j]);
      sd += d;
      sdx += d * xh;
    }
    const float mean_d = block_reduce(sd, Sum()) / static_cast<float>(c);
    const float mean_dx = block_reduce(sdx, Sum()) / static_cast<float>(c);
    T* dxr = dx + r * c;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float xh = (as_f32(xr[j]) - m) * s;
      const float add = dres ? as_f32(dres[r * c + j]) : 0.0f;
      dxr[j] = from_f32<T>(s * (as_f32(dyr[j]) * as_f32(w[j]) - mean_d - xh * mean_dx) + add);
    }
  }
}

// With a residual (add_rmsnorm), as layernorm_kernel: the rows are sum = x + res, written.
template <typename T>
__global__ void rmsnorm_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                               float* __restrict__ rstd, int64_t rows, int64_t c, float eps,
                               const T* __restrict__ res = nullptr, T* __restrict__ sum = nullptr) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* yr = y + r * c;
    float ss = 0.0f;
    const T* xr = norm_row(x, res, sum, r, c, Square(), &ss);
    const float s = 1.0f / sqrtf(block_reduce(ss, Sum()) / static_cast<float>(c) + eps);
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
      yr[j] = from_f32<T>(as_f32(xr[j]) * s * as_f32(w[j]));
    if (threadIdx.x == 0) rstd[r] = s;
  }
}

template <typename T>
__global__ void rmsnorm_grad_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                    const T* __restrict__ w, const float* __restrict__ rstd,
                                    T* __restrict__ dx, int64_t rows, int64_t c,
                                    const T* __restrict__ dres = nullptr) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = x + r * c, *dyr = dy + r * c;
    const float s = rstd[r];
    float acc = 0.0f;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
      acc += as_f32(dyr[j]) * as_f32(w[j]) * (as_f32(xr[j]) * s);
    const float mean_dx = block_reduce(acc, Sum()) / static_cast<float>(c);
    T* dxr = dx + r * c;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
      dxr[j] = from_f32<T>(s * (as_f32(dyr[j]) * as_f32(w[j]) - as_f32(xr[j]) * s * mean_dx) +
                           (dres ? as_f32(dres[r * c + j]) : 0.0f));
  }
}

// The weight (and bias) gradients of the norms: dw[j] = sum_r dy[r,j] * (x[r,j] - mean[r]) *
// rstd[r], db[j] = sum_r dy[r,j] (mean null for rmsnorm, db null to skip), in two passes with
// a fixed order of additions: block (bx, by), 32x32 threads, owns columns [32 bx, 32 bx + 32)
// of rows [kWeightChunk by, ...): row lane y sums rows y, y + 32, ... of the chunk, lane 0
// adds the 32 lanes into partial[by][j]; the second pass adds the chunks' partials in order.
constexpr int64_t kWeightChunk = 256;

template <typename T>
__global__ void norm_weight_partial(const T* __restrict__ dy, const T* __restrict__ x,
                                    const float* __restrict__ mean, const float* __restrict__ rstd,
                                    float* __restrict__ pw, float* __restrict__ pb, int64_t rows,
                                    int64_t c) {
  __shared__ float sw[32][33], sb[32][33];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = blockIdx.y * kWeightChunk, r1 = min(rows, r0 + kWeightChunk);
  float aw = 0.0f, ab = 0.0f;
  if (j < c)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 32) {
      const float g = as_f32(dy[r * c + j]);
      aw += g * ((as_f32(x[r * c + j]) - (mean ? mean[r] : 0.0f)) * rstd[r]);
      ab += g;
    }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y != 0 || j >= c) return;
  for (int l = 1; l < 32; ++l) {
    aw += sw[l][threadIdx.x];
    ab += sb[l][threadIdx.x];
  }
  pw[blockIdx.y * c + j] = aw;
  pb[blockIdx.y * c + j] = ab;
}

template <typename T>
__global__ void norm_weight_total(const float* __restrict__ pw, const float* __restrict__ pb,
                                  int64_t parts, int64_t c, T* __restrict__ dw,
                                  T* __restrict__ db) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  float aw = 0.0f, ab = 0.0f;
  for (int64_t p = 0; p < parts; ++p) {
    aw += pw[p * c + j];
    ab += pb[p * c + j];
  }
  dw[j] = from_f32<T>(aw);
  if (db) db[j] = from_f32<T>(ab);
}

// Row-wise norms with a warp per row for rows of up to 32 kPer elements, held in registers:
// one read of each operand (the block-per-row kernels above read them two or three times).
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T, int kPer>
__global__ void layernorm_warp(const T* __restrict__ x, const T* __restrict__ w,
                               const T* __restrict__ b, T* __restrict__ y, float* __restrict__ mean,
                               float* __restrict__ rstd, int64_t rows, int c, float eps,
                               const T* __restrict__ res = nullptr, T* __restrict__ sum = nullptr) {
  const int lane = threadIdx.x % 32;
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (r >= rows) return;
  const T* xr = x + r * c;
  float v[kPer];
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    if (j < c && res) {  // add_layernorm: the sum as the unfused add rounds it
      const T t = from_f32<T>(as_f32(xr[j]) + as_f32(res[r * c + j]));
      sum[r * c + j] = t;
      v[i] = as_f32(t);
    } else {
      v[i] = j < c ? as_f32(xr[j]) : 0.0f;
    }
    s += v[i];
  }
  const float m = warp_sum(s) / static_cast<float>(c);
  float q = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (lane + 32 * i < c) q += (v[i] - m) * (v[i] - m);
  const float rs = 1.0f / sqrtf(warp_sum(q) / static_cast<float>(c) + eps);
  T* yr = y + r * c;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    if (j < c) yr[j] = from_f32<T>((v[i] - m) * rs * as_f32(w[j]) + as_f32(b[j]));
  }
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

template <typename T, int kPer>
__global__ void layernorm_grad_warp(const T* __restrict__ dy, const T* __restrict__ x,
                                    const T* __restrict__ w, const float* __restrict__ mean,
                                    const float* __restrict__ rstd, T* __restrict__ dx,
                                    int64_t rows, int c, const T* __restrict__ dres = nullptr) {
  const int lane = threadIdx.x % 32;
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (r >= rows) return;
  const T *xr = x + r * c, *dyr = dy + r * c;
  const float m = mean[r], s = rstd[r];
  float xh[kPer], d[kPer], sd = 0.0f, sdx = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    xh[i] = j < c ? (as_f32(xr[j]) - m) * s : 0.0f;
    d[i] = j < c ? as_f32(dyr[j]) * as_f32(w[j]) : 0.0f;
    sd += d[i];
    sdx += d[i] * xh[i];
  }
  const float mean_d = warp_sum(sd) / static_cast<float>(c);
  const float mean_dx = warp_sum(sdx) / static_cast<float>(c);
  T* dxr = dx + r * c;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = lane + 32 * i;
    if (j < c)
      dxr[j] = from_f32<T>(s * (d[i] - mean_d - xh[i] * mean_dx) +
                           (dres ? as_f32(dres[r * c + j]) : 0.0f));
  }
}

// Calls f with kPer (an integral_constant) for rows of c elements, or returns false for rows
// over 1,024 (the block-per-row kernels take them).
template <typename F>
bool with_row_registers(int64_t c, F f) {
  if (c <= 256) return f(std::integral_constant<int, 8>()), true;
  if (c <= 512) return f(std::integral_constant<int, 16>()), true;
  if (c <= 1024) return f(std::integral_constant<int, 32>()), true;
  return false;
}

// Warps per block of the warp-per-row kernels, and their grid for `rows` rows.
constexpr int kRowWarps = 8;
unsigned warp_rows_grid(int64_t rows) {
  return static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps);
}

template <typename T>
void norm_weight_grad(const Args& a, const float* mean, const float* rstd, T* db, int64_t rows,
                      int64_t c) {
  const int64_t parts = std::max<int64_t>(1, (rows + kWeightChunk - 1) / kWeightChunk);
  float* partial = nullptr;
  TS_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&partial),
                          static_cast<size_t>(2 * parts * c) * sizeof(float), a.stream));
  norm_weight_partial<T>
      <<<dim3(static_cast<unsigned>((c + 31) / 32), static_cast<unsigned>(parts)), dim3(32, 32), 0,
         a.stream>>>(in<T>(a, 0), in<T>(a, 1), mean, rstd, partial, partial + parts * c, rows, c);
  TS_CUDA_LAUNCH();
  norm_weight_total<T><<<static_cast<unsigned>((c + 255) / 256), 256, 0, a.stream>>>(
      partial, partial + parts * c, parts, c, out<T>(a, 1), db);
  TS_CUDA_LAUNCH();
  TS_CUDA(cudaFreeAsync(partial, a.stream));
}

// Each norm takes its operands as stored where they share one dtype, else widened.
// layernorm(x, w, b) -> (y, mean, rstd); add_layernorm(x, res, w, b) -> (x + res, y, mean, rstd).
void layernorm(OpKind op, const Args& a) {
  const bool fused = op == OpKind::add_layernorm;
  if (fused ? !one_storage(a, {0, 1, 2, 3}, {0, 1}) : !one_storage(a, {0, 1, 2}, {0}))
    return run_in_f32(op, a, layernorm);
  const int64_t c = a.in_shape(0)[-1], numel = a.in_shape(0).numel();
  if (numel == 0) return;
  const int64_t rows = numel / c;
  const int w = fused ? 2 : 1, y = fused ? 1 : 0;  // where the weights and the outputs are
  with_storage(a.in_types[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const float eps = static_cast<float>(a.attr<NormAttrs>().eps);
    const T* res = fused ? in<T>(a, 1) : nullptr;
    T* sum = fused ? out<T>(a, 0) : nullptr;
    const bool warps = with_row_registers(c, [&](auto per) {
      layernorm_warp<T, decltype(per)::value>
          <<<warp_rows_grid(rows), kRowWarps * 32, 0, a.stream>>>(
              in<T>(a, 0), in<T>(a, w), in<T>(a, w + 1), out<T>(a, y), a.fout(y + 1), a.fout(y + 2),
              rows, static_cast<int>(c), eps, res, sum);
    });
    if (!warps)
      layernorm_kernel<T><<<row_grid(rows), row_threads(c), 0, a.stream>>>(
          in<T>(a, 0), in<T>(a, w), in<T>(a, w + 1), out<T>(a, y), a.fout(y + 1), a.fout(y + 2),
          rows, c, eps, res, sum);
  });
  TS_CUDA_LAUNCH();
}

// layernorm_grad(dy, x, w, mean, rstd) -> (dx, dw, db); layernorm_grad_add with dres last adds
// it to dx.
void layernorm_grad(OpKind op, const Args& a) {
  const bool fused = op == OpKind::layernorm_grad_add;
  if (fused ? !one_storage(a, {0, 1, 2, 5}, {0, 1, 2}) : !one_storage(a, {0, 1, 2}, {0, 1, 2}))
    return run_in_f32(op, a, layernorm_grad);
  const int64_t c = a.in_shape(1)[-1], numel = a.in_shape(1).numel();
  if (c == 0) return;
  const int64_t rows = numel / c;
  with_storage(a.in_types[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* dres = fused ? in<T>(a, 5) : nullptr;
    if (rows > 0) {
      const bool warps = with_row_registers(c, [&](auto per) {
        layernorm_grad_warp<T, decltype(per)::value>
            <<<warp_rows_grid(rows), kRowWarps * 32, 0, a.stream>>>(
                in<T>(a, 0), in<T>(a, 1), in<T>(a, 2), a.fin(3), a.fin(4), out<T>(a, 0), rows,
                static_cast<int>(c), dres);
      });
      if (!warps)
        layernorm_grad_kernel<T><<<row_grid(rows), row_threads(c), 0, a.stream>>>(
            in<T>(a, 0), in<T>(a, 1), in<T>(a, 2), a.fin(3), a.fin(4), out<T>(a, 0), rows, c, dres);
      TS_CUDA_LAUNCH();
    }
    norm_weight_grad<T>(a, a.fin(3), a.fin(4), out<T>(a, 2), rows, c);  // zeros when rows == 0
  });
}

// rmsnorm(x, w) -> (y, rstd); add_rmsnorm(x, res, w) -> (x + res, y, rstd).
void rmsnorm(OpKind op, const Args& a) {
  const bool fused = op == OpKind::add_rmsnorm;
  if (fused ? !one_storage(a, {0, 1, 2}, {0, 1}) : !one_storage(a, {0, 1}, {0}))
    return run_in_f32(op, a, rmsnorm);
  const int64_t c = a.in_shape(0)[-1], numel = a.in_shape(0).numel();
  if (numel == 0) return;
  const int64_t rows = numel / c;
  const int w = fused ? 2 : 1, y = fused ? 1 : 0;  // where the weight and the outputs are
  with_storage(a.in_types[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rmsnorm_kernel<T><<<row_grid(rows), row_threads(c), 0, a.stream>>>(
        in<T>(a, 0), in<T>(a, w), out<T>(a, y), a.fout(y + 1), rows, c,
        static_cast<float>(a.attr<NormAttrs>().eps), fused ? in<T>(a, 1) : nullptr,
        fused ? out<T>(a, 0) : nullptr);
  });
  TS_CUDA_LAUNCH();
}

// rmsnorm_grad(dy, x, w, rstd) -> (dx, dw); rmsnorm_grad_add with dres last adds it to dx.
void rmsnorm_grad(OpKind op, const Args& a) {
  const bool fused = op == OpKind::rmsnorm_grad_add;
  if (fused ? !one_storage(a, {0, 1, 2, 4}, {0, 1}) : !one_storage(a, {0, 1, 2}, {0, 1}))
    return run_in_f32(op, a, rmsnorm_grad);
  const int64_t c = a.in_shape(1)[-1], numel = a.in_shape(1).numel();
  if (c == 0) return;
  const int64_t rows = numel / c;
  with_storage(a.in_types[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (rows > 0) {
      rmsnorm_grad_kernel<T><<<row_grid(rows), row_threads(c), 0, a.stream>>>(
          in<T>(a, 0), in<T>(a, 1), in<T>(a, 2), a.fin(3), out<T>(a, 0), rows, c,
          fused ? in<T>(a, 4) : nullptr);
      TS_CUDA_LAUNCH();
    }
    norm_weight_grad<T>(a, nullptr, a.fin(3), nullptr, rows, c);
  });
}

}  // namespace

void register_norm_kernels(KernelTable& t) {
  t.add(OpKind::layernorm, layernorm, /*low_precision=*/true);
  t.add(OpKind::layernorm_grad, layernorm_grad, /*low_precision=*/true);
  t.add(OpKind::add_layernorm, layernorm, /*low_precision=*/true);
  t.add(OpKind::layernorm_grad_add, layernorm_grad, /*low_precision=*/true);
  t.add(OpKind::rmsnorm, rmsnorm, /*low_precision=*/true);
  t.add(OpKind::rmsnorm_grad, rmsnorm_grad, /*low_precision=*/true);
  t.add(OpKind::add_rmsnorm, rmsnorm, /*low_precision=*/true);
  t.add(OpKind::rmsnorm_grad_add, rmsnorm_grad, /*low_precision=*/true);
}

}  // namespace tessera::cuda
