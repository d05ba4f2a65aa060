// The CPU backend: f32 compute through OpenBLAS GEMM and loops split over the backend's own
// thread pool (backend/cpu/thread_pool.h; `omp simd` only vectorizes). bf16/f16 tensors are
// stored in their own dtype and converted to f32 around each kernel.
//
//   CpuBackend cpu;
//   Buffer x = cpu.allocate(bytes);             // host memory: the runtime may read it in place
//   cpu.run(g, g.node(id), inputs, outputs);
#pragma once

#include "backend/backend.h"

namespace tessera {

// Converts n elements between dtypes in host memory (any of f32/bf16/f16 to any; i32 only to
// i32), threaded.
void convert_elements(const void* src, DType from, void* dst, DType to, int64_t n);

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  bool supports(OpKind op) const override;
  void run(const Graph& g, const Node& node, std::span<const void* const> inputs,
           std::span<void* const> outputs) override;

  // Host memory, aligned as malloc aligns (alloc throws std::bad_alloc when there is none, as
  // new does); copies are memcpy (run() has finished when it returns).
  MemSpace memory() const override { return MemSpace::host; }
  void* alloc(int64_t bytes) override;
  void free(void* p) override;
  void to_device(void* dst, const void* host_src, int64_t bytes) override;
  void to_host(void* host_dst, const void* src, int64_t bytes) override;
  void copy(void* dst, const void* src, int64_t bytes) override;
  void fill(void* dst, uint8_t byte, int64_t bytes) override;

  // The optimizer's passes (kernels_optim.cc), threaded; low-precision inputs are widened in
  // chunks of 64 Ki elements.
  double sum_squares(const void* x, DType dtype, int64_t n) override;
  void scale(float* x, int64_t n, float c) override;
  void accumulate(float* dst, const void* src, DType src_dtype, int64_t n, bool first) override;
  void adamw(const AdamWUpdate& u, float* param, const void* grad, DType grad_dtype, float* m,
             float* v, int64_t n) override;
  void convert(const void* src, DType from, void* dst, DType to, int64_t n) override {
    convert_elements(src, from, dst, to, n);
  }
};

// When OpenBLAS fell back to its SSE3 "Prescott" kernels on a CPU that has AVX2/AVX-512 (0.3.21
// does not know some newer CPUs), the OPENBLAS_CORETYPE that would give the fast ones
// ("SkylakeX", "Haswell"); nullptr otherwise. OpenBLAS reads it when it is loaded, so a program
// must set it and re-execute itself (the tessera binary does, in main()).
const char* openblas_better_coretype();

}  // namespace tessera
