// The row-wise kernels' shared pieces (kernels_nn.cu, kernels_norm.cu): block reductions in a
// fixed order, the launch shape of a one-block-per-row kernel, and typed operand access.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace tessera::cuda {

struct Sum {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The reduction of `v` over the block (blockDim.x a multiple of 32), returned to every thread.
// Warp butterflies, then every thread folds the warps' partials in warp order: a fixed order.
template <class T, class Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T part[32];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // the previous call's readers are done with `part`
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  v = part[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) v = op(v, part[w]);
  return v;
}

// Threads of a row-wise kernel for rows of c elements: a power of two in [32, 512].
inline int row_threads(int64_t c) {
  int t = 32;
  while (t < 512 && t < c) t *= 2;
  return t;
}
// Blocks of a row-wise kernel (which loops over rows with a grid stride).
inline unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(rows, 1 << 20));
}

template <typename T>
const T* in(const Args& a, int i) {
  return static_cast<const T*>(a.in[static_cast<size_t>(i)]);
}
template <typename T>
T* out(const Args& a, int i) {
  return static_cast<T*>(a.out[static_cast<size_t>(i)]);
}

}  // namespace tessera::cuda
