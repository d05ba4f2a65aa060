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

  // Device buffers and copies (to_host and synchronize wait for the stream).
  void* alloc(int64_t bytes);
  void free(void* p);
  void to_device(void* dst, const void* src, int64_t bytes);
  void to_host(void* dst, const void* src, int64_t bytes);
  void synchronize();
  // The stream run() enqueues on (callers' own kernels go after the nodes on it).
  cudaStream_t stream() const;
  // The device's name and compute capability, e.g. "NVIDIA H100 80GB HBM3 (sm_90)".
  std::string device_name() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
