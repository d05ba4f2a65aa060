// The fused GEMM epilogues' second pass (ir/ops_fused.cc), for the products cuBLASLt has no
// fused algorithm for (kernels_matmul.cc tries its epilogues first): the bias (and GELU) over
// the product in place, and GELU's gradient with the bias gradient. One pass over the product
// each, in the storage type, computing in f32.
#include "backend/cuda/activations.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/storage.cuh"

namespace tessera::cuda {

namespace {

// pre[r, j] = product + bias[j] (in place); with gelu, y = gelu(pre) from the unrounded sum.
template <typename T>
__global__ void bias_act(T* y, T* pre, const T* bias, int64_t numel, int64_t n, bool with_gelu) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = as_f32(pre[i]) + as_f32(bias[i % n]);
    pre[i] = from_f32<T>(v);
    if (with_gelu) y[i] = from_f32<T>(gelu(v));
  }
}

// d = d * gelu'(pre), in place.
template <typename T>
__global__ void dgelu(T* d, const T* pre, int64_t numel) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    d[i] = from_f32<T>(as_f32(d[i]) * gelu_grad(as_f32(pre[i])));
}

// db[j] = sum over the rows of d[r, j]: a block of 32 columns x 8 row lanes, reduced in shared
// memory (coalesced reads along the columns).
template <typename T>
__global__ void column_sums_kernel(const T* d, T* db, int64_t rows, int64_t n) {
  __shared__ float part[8][33];
  const int64_t j = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (j < n)
    for (int64_t r = threadIdx.y; r < rows; r += 8) s += as_f32(d[r * n + j]);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    for (int k = 1; k < 8; ++k) s += part[k][threadIdx.x];
    db[j] = from_f32<T>(s);
  }
}

}  // namespace

void bias_epilogue(DType dt, void* y, void* pre, const void* bias, int64_t numel, int64_t n,
                   bool with_gelu, cudaStream_t stream) {
  if (numel == 0) return;
  with_storage(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    bias_act<T><<<blocks_for(numel), 256, 0, stream>>>(
        static_cast<T*>(y), static_cast<T*>(pre), static_cast<const T*>(bias), numel, n, with_gelu);
  });
  TS_CUDA_LAUNCH();
}

void dgelu_bias_grad_epilogue(DType dt, void* d, const void* pre, void* db, int64_t numel,
                              int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  with_storage(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (numel > 0) {
      dgelu<T><<<blocks_for(numel), 256, 0, stream>>>(static_cast<T*>(d),
                                                      static_cast<const T*>(pre), numel);
      TS_CUDA_LAUNCH();
    }
  });
  column_sums(dt, d, db, numel, n, stream);
}

void column_sums(DType dt, const void* x, void* db, int64_t numel, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  with_storage(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    column_sums_kernel<T><<<static_cast<unsigned>((n + 31) / 32), dim3(32, 8), 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(db), numel / n, n);
  });
  TS_CUDA_LAUNCH();
}

}  // namespace tessera::cuda
