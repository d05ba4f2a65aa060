// The optimizer's device passes (backend/cuda/optim.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/kernels.h"
#include "backend/cuda/optim.h"
#include "base/check.h"

namespace tessera::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ float load(const T* p, int64_t i);
template <>
__device__ float load(const float* p, int64_t i) {
  return p[i];
}
template <>
__device__ float load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
template <>
__device__ float load(const __half* p, int64_t i) {
  return __half2float(p[i]);
}

template <typename T>
__device__ void store(T* p, int64_t i, float x);
template <>
__device__ void store(float* p, int64_t i, float x) {
  p[i] = x;
}
template <>
__device__ void store(__nv_bfloat16* p, int64_t i, float x) {
  p[i] = __float2bfloat16_rn(x);
}
template <>
__device__ void store(__half* p, int64_t i, float x) {
  p[i] = __float2half_rn(x);
}

// Sums a block's values in a fixed tree order; thread 0 gets the total.
__device__ double block_sum(double x) {
  __shared__ double s[kThreads];
  s[threadIdx.x] = x;
  __syncthreads();
  for (int k = kThreads / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
    __syncthreads();
  }
  return s[0];
}

template <typename T>
__global__ void sum_squares_kernel(const T* x, int64_t n, double* parts) {
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{kThreads} * gridDim.x) {
    const double v = load(x, i);
    acc += v * v;
  }
  const double total = block_sum(acc);
  if (threadIdx.x == 0) parts[blockIdx.x] = total;
}

__global__ void clip_kernel(const double* parts, int64_t count, double max_norm, float* coef,
                            double* norm) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < count; i += kThreads) acc += parts[i];
  const double total = block_sum(acc);
  if (threadIdx.x == 0) {
    const double r = sqrt(total);
    *norm = r;
    const double c = max_norm / (r + 1e-6);
    *coef = max_norm > 0 && c < 1.0 ? static_cast<float>(c) : 1.0f;
  }
}

template <typename G, typename P>
__global__ void adamw_kernel(const AdamWStep* step, bool decay, const float* coef, float* master,
                             const G* grad, float* m, float* v, P* param, bool write_param,
                             int64_t n) {
  const AdamWStep u = *step;
  const float shrink = decay ? u.shrink : 1.0f;
  const float gs = *coef;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{kThreads} * gridDim.x) {
    const float g = load(grad, i) * gs;
    const float p = master[i] * shrink;
    const float mi = u.beta1 * m[i] + (1.0f - u.beta1) * g;
    const float vi = u.beta2 * v[i] + (1.0f - u.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float next = p - u.step_size * mi / (sqrtf(vi) / u.bc2_sqrt + u.eps);
    master[i] = next;
    if (write_param) store(param, i, next);
  }
}

// Calls f(T*) with the pointer cast to dt's element type.
template <typename F>
void with_type(DType dt, const void* p, F f) {
  switch (dt) {
    case DType::f32:
      return f(static_cast<const float*>(p));
    case DType::bf16:
      return f(static_cast<const __nv_bfloat16*>(p));
    case DType::f16:
      return f(static_cast<const __half*>(p));
    default:
      TS_CHECK(false) << "optimizer tensors are f32, bf16 or f16, not " << dtype_name(dt);
  }
}

}  // namespace

void sum_squares(const void* x, DType dt, int64_t n, double* parts, cudaStream_t stream) {
  with_type(dt, x,
            [&](auto* p) { sum_squares_kernel<<<kNormParts, kThreads, 0, stream>>>(p, n, parts); });
  TS_CUDA_LAUNCH();
}

void clip_coefficient(const double* parts, int64_t count, double max_norm, float* coef,
                      double* norm, cudaStream_t stream) {
  clip_kernel<<<1, kThreads, 0, stream>>>(parts, count, max_norm, coef, norm);
  TS_CUDA_LAUNCH();
}

void adamw(const AdamWStep* u, bool decay, const float* coef, float* master, const void* grad,
           DType grad_dt, float* m, float* v, void* param, DType param_dt, int64_t n,
           cudaStream_t stream) {
  if (n == 0) return;
  const bool write_param = param != master;
  with_type(grad_dt, grad, [&](auto* g) {
    with_type(param_dt, param, [&](auto* p) {
      using P = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
      adamw_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
          u, decay, coef, master, g, m, v, const_cast<P*>(p), write_param, n);
    });
  });
  TS_CUDA_LAUNCH();
}

}  // namespace tessera::cuda
