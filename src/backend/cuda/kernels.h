// CUDA kernels (f32 compute; i32 for ids/targets), the device twins of backend/cpu/kernels.h:
// each computes what its CPU kernel computes, on device pointers, enqueued on `stream`. Each
// kernels_*.cu file registers its kernels in a KernelTable (the backend calls every register_*
// once); an op without a registered kernel is one CudaBackend::supports() says no to.
//
//   void my_op(const Args& a) { my_kernel<<<blocks, 256, 0, a.stream>>>(a.fin(0), a.fout(0)); }
//   void register_my_kernels(KernelTable& t) { t.add(OpKind::my_op, my_op); }
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "ir/graph.h"

namespace tessera::cuda {

struct Context;

// A kernel's arguments (device pointers) and where to enqueue it.
struct Args : KernelArgs {
  cudaStream_t stream = nullptr;
  Context* ctx = nullptr;
};

using KernelFn = void (*)(OpKind op, const Args& a);

// Which kernel runs each op, and whether it takes bf16/f16 storage as is (else the backend
// widens the inputs to f32 around it and narrows the outputs, as the CPU backend does).
struct KernelTable {
  struct Entry {
    KernelFn fn = nullptr;
    bool low_precision = false;
  };
  std::array<Entry, kNumOps> entries{};
  void add(OpKind op, KernelFn fn, bool low_precision = false) {
    entries[static_cast<size_t>(op)] = {fn, low_precision};
  }
  const Entry& at(OpKind op) const { return entries[static_cast<size_t>(op)]; }
};

void register_elementwise_kernels(KernelTable& t);  // kernels_elementwise.cu
void register_shape_kernels(KernelTable& t);        // kernels_shape.cu
void register_matmul_kernels(KernelTable& t);       // kernels_matmul.cc (cuBLASLt)
void register_nn_kernels(KernelTable& t);           // kernels_nn.cu
void register_norm_kernels(KernelTable& t);         // kernels_norm.cu
void register_attention_kernels(KernelTable& t);    // kernels_attention.cu
void register_moe_kernels(KernelTable& t);          // kernels_moe.cu

// Converts n elements between f32, bf16 and f16 on the stream (kernels_elementwise.cu); i32
// only to i32.
void convert(const void* src, DType from, void* dst, DType to, int64_t n, cudaStream_t stream);

// Runs fn, an f32 kernel, on bf16/f16 storage: the low-precision inputs widened into
// stream-ordered scratch, the low-precision outputs computed there and narrowed after
// (cuda_backend.cc; what the backend does for every kernel registered without low_precision).
void run_in_f32(OpKind op, const Args& a, KernelFn fn);

// Attention on the tensor cores (kernels_attention_tc.cu), for bf16/f16 q, k, v without a
// score bias and head dims that are multiples of 8 up to 128; false (nothing enqueued) for
// anything else.
bool attention_tensor_cores(const Args& a);
bool attention_grad_tensor_cores(const Args& a);

// The fused GEMM epilogues' second pass over a product of `numel` elements in rows of n, in
// storage dtype dt (kernels_epilogue.cu), where cuBLASLt has no fused algorithm:
// bias_epilogue: pre += bias (in place), and with_gelu y = gelu(pre);
// dgelu_bias_grad_epilogue: d *= gelu'(pre) (in place), db = d summed over its rows.
// column_sums: db = x summed over its rows.
void bias_epilogue(DType dt, void* y, void* pre, const void* bias, int64_t numel, int64_t n,
                   bool with_gelu, cudaStream_t stream);
void dgelu_bias_grad_epilogue(DType dt, void* d, const void* pre, void* db, int64_t numel,
                              int64_t n, cudaStream_t stream);
// db[j] = x[r, j] summed over the rows (matmul_bgrad's bias gradient).
void column_sums(DType dt, const void* x, void* db, int64_t numel, int64_t n, cudaStream_t stream);

// The cuBLASLt handle and its workspace (cuda_backend.cc).
struct Context {
  void* lt = nullptr;  // cublasLtHandle_t
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Aborts with the CUDA error's name and the call site (a failed launch or copy is a bug or a
// lost device, not an input error).
void check_cuda(cudaError_t e, const char* what, const char* file, int line);
#define TS_CUDA(call) ::tessera::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define TS_CUDA_LAUNCH() TS_CUDA(cudaGetLastError())

// Blocks of `threads` covering n elements, at most 65535 * 16 of them (the elementwise kernels
// loop with a grid stride over the rest).
inline unsigned blocks_for(int64_t n, int threads = 256) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

}  // namespace tessera::cuda
