// GELU (tanh approximation, as GPT-2 and cuBLASLt's GELU epilogues compute it) and its
// derivative, shared by the elementwise kernels and the fused GEMM epilogues' second pass.
#pragma once

namespace tessera::cuda {

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)

__device__ inline float gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(kGeluC * (x + 0.044715f * x * x * x)));
}
__device__ inline float gelu_grad(float x) {
  float t = tanhf(kGeluC * (x + 0.044715f * x * x * x));
  float du = kGeluC * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

}  // namespace tessera::cuda
