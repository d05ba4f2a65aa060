// The CUDA backend: the Backend interface over device memory, one stream, cuBLASLt GEMMs and
// Tessera's own kernels (backend/cuda/kernels.h). run() takes device pointers and enqueues the
// node's kernels on the backend's stream; synchronize() waits for them. bf16/f16 tensors are
// stored in their own dtype: matmul takes them as they are (f32 accumulation), the other
// kernels see them widened to f32, as on the CPU backend.
//
//   if (!cuda_device_present(&why)) ...;            // no driver, no device
//   CudaBackend gpu;
//   void* x = gpu.alloc(bytes);  gpu.to_device(x, host, bytes);
//   gpu.run(g, node, {x, w}, {y});  gpu.to_host(host_y, y, bytes);  // to_host synchronizes
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "backend/backend.h"

namespace tessera {

// True when a CUDA device can be used; otherwise false and, with `why`, the reason (the CUDA
// runtime's message).
bool cuda_device_present(std::string* why = nullptr);
// The CUDA devices this process sees (0 where there is no driver or device).
int cuda_device_count();

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }
  bool supports(OpKind op) const override;
  void run(const Graph& g, const Node& node, std::span<const void* const> inputs,
           std::span<void* const> outputs) override;

  // Device memory; copies and fills are enqueued on the backend's stream (to_host waits).
  MemSpace memory() const override { return MemSpace::device; }
  void* alloc(int64_t bytes) override;
  void free(void* p) override;
  void to_device(void* dst, const void* host_src, int64_t bytes) override;
  void to_host(void* host_dst, const void* src, int64_t bytes) override;
  void copy(void* dst, const void* src, int64_t bytes) override;
  void fill(void* dst, uint8_t byte, int64_t bytes) override;
  void synchronize() override;
  int64_t free_memory() const override;  // cudaMemGetInfo's free bytes

  // The optimizer's passes, one tensor per launch (backend/cuda/optim.h), on the stream.
  double sum_squares(const void* x, DType dtype, int64_t n) override;
  void scale(float* x, int64_t n, float c) override;
  void accumulate(float* dst, const void* src, DType src_dtype, int64_t n, bool first) override;
  void adamw(const AdamWUpdate& u, float* param, const void* grad, DType grad_dtype, float* m,
             float* v, int64_t n) override;
  void convert(const void* src, DType from, void* dst, DType to, int64_t n) override;
  // The group's passes as one launch each over all its tensors (multi-tensor kernels).
  std::unique_ptr<OptimizerGroup> optimizer_group(std::vector<OptimizerTensor> tensors) override;
  // A CUDA graph of the work captured from the stream (relaxed mode: the kernels' own
  // stream-ordered allocations are captured with them).
  std::unique_ptr<Recording> record(const std::function<void()>& enqueue) override;
  // CUDA events recorded on the stream.
  std::unique_ptr<WorkTimer> work_timer() override;
  // The stream run() enqueues on (callers' own kernels go after the nodes on it).
  cudaStream_t stream() const;
  // The device's name and compute capability, e.g. "NVIDIA H100 80GB HBM3 (sm_90)".
  std::string device_name() const override;
  // cudaHostRegister / cudaHostUnregister (a failure leaves the memory pageable: slower copies).
  void pin_host(void* p, int64_t bytes) override;
  void unpin_host(void* p) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
