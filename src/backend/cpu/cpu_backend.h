// The CPU backend: f32 compute through OpenBLAS GEMM and loops split over the backend's own
// thread pool (backend/cpu/thread_pool.h; `omp simd` only vectorizes). bf16/f16 tensors are
// stored in their own dtype and converted to f32 around each kernel.
//
//   CpuBackend cpu;
//   cpu.run(g, g.node(id), inputs, outputs);
#pragma once

#include "backend/backend.h"

namespace tessera {

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  bool supports(OpKind op) const override;
  void run(const Graph& g, const Node& node, std::span<const void* const> inputs,
           std::span<void* const> outputs) override;
};

// When OpenBLAS fell back to its SSE3 "Prescott" kernels on a CPU that has AVX2/AVX-512 (0.3.21
// does not know some newer CPUs), the OPENBLAS_CORETYPE that would give the fast ones
// ("SkylakeX", "Haswell"); nullptr otherwise. OpenBLAS reads it when it is loaded, so a program
// must set it and re-execute itself (the tessera binary does, in main()).
const char* openblas_better_coretype();

// Converts n elements between dtypes (any of f32/bf16/f16 to any; i32 only to i32).
void convert_elements(const void* src, DType from, void* dst, DType to, int64_t n);

}  // namespace tessera
