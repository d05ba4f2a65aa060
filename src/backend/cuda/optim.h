// The optimizer's device passes (kernels_optim.cu): the global gradient norm in a fixed order
// of additions (the same on every run), the clipping coefficient computed on the device (no
// host round trip inside a step), and a fused AdamW over f32 master weights that reads the
// gradient and writes the working copy in their own dtypes (f32, bf16, f16).
//
//   cuda::sum_squares(grad, DType::bf16, n, parts + k * cuda::kNormParts, stream);  // per tensor
//   cuda::clip_coefficient(parts, tensors * cuda::kNormParts, 1.0, coef, norm, stream);
//   cuda::adamw(u, decay, coef, master, grad, DType::bf16, m, v, param, DType::bf16, n, stream);
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ir/dtype.h"

namespace tessera::cuda {

// Partial sums one sum_squares call writes (one per block of its fixed grid).
constexpr int kNormParts = 128;

// parts[0..kNormParts) = partial sums of x^2 (in double) over n elements of dtype dt.
void sum_squares(const void* x, DType dt, int64_t n, double* parts, cudaStream_t stream);

// Adds `count` partial sums in order: *norm = sqrt(sum), *coef = min(1, max_norm / (norm +
// 1e-6)) (torch's clip_grad_norm_); max_norm <= 0 leaves *coef = 1.
void clip_coefficient(const double* parts, int64_t count, double max_norm, float* coef,
                      double* norm, cudaStream_t stream);

// One AdamW step (cpu::AdamWUpdate's arithmetic) with g = grad * *coef: m, v and master
// updated in place, and param = master in param_dt (skipped when param is master). The step's
// values are read from device memory (u), as the coefficient is, so that a step captured in a
// CUDA graph replays with each step's learning rate.
struct AdamWStep {
  float shrink = 1.0f;  // 1 - lr * weight_decay, for tensors with decay set
  float beta1 = 0.9f, beta2 = 0.95f;
  float step_size = 0.0f;  // lr / (1 - beta1^t)
  float bc2_sqrt = 1.0f;   // sqrt(1 - beta2^t)
  float eps = 1e-8f;
};
void adamw(const AdamWStep* u, bool decay, const float* coef, float* master, const void* grad,
           DType grad_dt, float* m, float* v, void* param, DType param_dt, int64_t n,
           cudaStream_t stream);

}  // namespace tessera::cuda
