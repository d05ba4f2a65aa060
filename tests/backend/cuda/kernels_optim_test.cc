// The CUDA backend's one-tensor optimizer passes (kernels_optim.cu: sum_squares, scale,
// accumulate, adamw, convert) against host loops, as the CPU backend's are checked. Skipped
// (reported as skipped) without a CUDA device.
#include <gtest/gtest.h>

#include <string>

#include "../optimizer_passes.h"
#include "backend/cuda/cuda_backend.h"

namespace tessera {
namespace {

TEST(CudaBackend, OptimizerPassesMatchHostLoops) {
  std::string why;
  if (!cuda_device_present(&why)) GTEST_SKIP() << why;
  CudaBackend gpu;
  // sqrtf and the division may differ from the host's by an ulp or two.
  testing_passes::check_optimizer_passes(gpu, 1e-5);
}

TEST(CudaBackend, OptimizerGroupFollowsTheSingleTensorPasses) {
  std::string why;
  if (!cuda_device_present(&why)) GTEST_SKIP() << why;
  CudaBackend gpu;
  // The multi-tensor kernels: the same sums bit for bit; updates within an ulp or two.
  testing_passes::check_optimizer_group(gpu, 1e-6);
}

}  // namespace
}  // namespace tessera
