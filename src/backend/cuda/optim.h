// The optimizer's device passes (kernels_optim.cu), each one launch over all parameters (a
// multi-tensor pass: the tensors are cut into chunks of kChunk elements, one block each): each
// tensor's gradient sum of squares in a fixed order of additions (the same on every run), and
// a fused AdamW over f32 master weights that reads the gradient and writes the working copy in
// their own dtypes (f32, bf16, f16). CudaBackend::optimizer_group runs them:
//
//   cuda::OptimTensors list = cuda::describe(tensors, device_block);  // once
//   cuda::sum_squares(list, parts, stream);                            // parts[list.chunks]
//   cuda::tensor_sums(parts, first_chunk, tensors.size(), totals, stream);
//   cuda::adamw(list, update, stream);
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "ir/dtype.h"

namespace tessera::cuda {

// Elements per block of the multi-tensor passes.
constexpr int64_t kChunk = 8192;

// One parameter: its working copy (param, in param_dt), f32 master weights (== param for f32
// parameters), gradient (grad_dt), AdamW moments, and whether weight decay applies.
struct OptimTensor {
  void* param = nullptr;
  float* master = nullptr;
  const void* grad = nullptr;
  float *m = nullptr, *v = nullptr;
  int64_t n = 0;
  DType param_dt = DType::f32, grad_dt = DType::f32;
  bool decay = true;
};

// The tensors' descriptors and chunk table in device memory (describe()).
struct OptimTensors {
  const OptimTensor* tensors = nullptr;
  const int32_t* chunk_tensor = nullptr;  // chunk -> tensor
  const int64_t* chunk_first = nullptr;   // chunk -> its first element
  int64_t chunks = 0;
};

// Device bytes describe() needs for these tensors.
int64_t describe_bytes(const std::vector<OptimTensor>& tensors);
// Copies the descriptors and chunk table into `device` (describe_bytes() of device memory,
// 16-byte aligned); synchronous, once before the steps.
OptimTensors describe(const std::vector<OptimTensor>& tensors, void* device);

// parts[c] = the sum of squares (in double) of chunk c's gradient elements.
void sum_squares(const OptimTensors& list, double* parts, cudaStream_t stream);

// totals[k] = the sum of tensor k's chunk sums, for each of `count` tensors: first_chunk (device
// memory, count + 1 entries) holds each tensor's first chunk and, last, list.chunks. The parts
// are added in the order the single-tensor sum_squares adds them, so totals[k] equals it.
void tensor_sums(const double* parts, const int64_t* first_chunk, int64_t count, double* totals,
                 cudaStream_t stream);

// One AdamW step (AdamWUpdate's arithmetic, backend/backend.h, u.shrink for tensors with decay
// set) over every tensor: m, v and master updated in place, and param = master in param_dt
// (skipped when param is master).
void adamw(const OptimTensors& list, const AdamWUpdate& u, cudaStream_t stream);

// One tensor's passes (CudaBackend's Backend::sum_squares, scale, accumulate, adamw: the
// StepRunner's optimizer, one launch per parameter). x, grad and src are f32, bf16 or f16 (dt).
// sum_squares adds chunks of kChunk elements in a fixed order and waits for the stream.
double sum_squares(const void* x, DType dt, int64_t n, cudaStream_t stream);
void scale(float* x, int64_t n, float c, cudaStream_t stream);
void accumulate(float* dst, const void* src, DType dt, int64_t n, bool first, cudaStream_t stream);
void adamw(const AdamWUpdate& u, float* param, const void* grad, DType dt, float* m, float* v,
           int64_t n, cudaStream_t stream);

}  // namespace tessera::cuda
