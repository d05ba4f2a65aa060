#include "backend/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/optim.h"
#include "base/check.h"

namespace tessera {

namespace cuda {
void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: CUDA error %s (%s) in %s\n", file, line, cudaGetErrorName(e),
               cudaGetErrorString(e), what);
  std::abort();
}

void run_in_f32(OpKind op, const Args& a, KernelFn fn) {
  std::vector<TensorType> in_types(a.in_types.begin(), a.in_types.end());
  std::vector<TensorType> out_types(a.out_types.begin(), a.out_types.end());
  Args w{{a.attrs, in_types, out_types, {}, {}}, a.stream, a.ctx};
  std::vector<void*> scratch;
  auto widened = [&](int64_t n) {
    void* p = nullptr;
    TS_CUDA(cudaMallocAsync(&p, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float),
                            a.stream));
    scratch.push_back(p);
    return p;
  };
  for (size_t i = 0; i < a.in.size(); ++i) {
    TensorType& t = in_types[i];
    if (is_low_precision(t.dtype)) {
      void* p = widened(t.shape.numel());
      convert(a.in[i], t.dtype, p, DType::f32, t.shape.numel(), a.stream);
      w.in.push_back(p);
      t.dtype = DType::f32;
    } else {
      w.in.push_back(a.in[i]);
    }
  }
  std::vector<size_t> narrowed;
  for (size_t i = 0; i < a.out.size(); ++i) {
    TensorType& t = out_types[i];
    if (is_low_precision(t.dtype)) {
      w.out.push_back(widened(t.shape.numel()));
      narrowed.push_back(i);
      t.dtype = DType::f32;
    } else {
      w.out.push_back(a.out[i]);
    }
  }
  fn(op, w);
  for (size_t i : narrowed)
    convert(w.out[i], DType::f32, a.out[i], a.out_types[i].dtype, a.out_types[i].shape.numel(),
            a.stream);
  for (void* p : scratch) TS_CUDA(cudaFreeAsync(p, a.stream));
}
}  // namespace cuda

namespace {

// cuBLASLt picks among its algorithms with this much scratch (Hopper's recommended size).
constexpr size_t kWorkspaceBytes = 32u << 20;
}  // namespace

bool cuda_device_present(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why != nullptr) {
      // The runtime calls a missing driver an old one: say which it is.
      void* driver = e == cudaErrorInsufficientDriver ? dlopen("libcuda.so.1", RTLD_LAZY) : nullptr;
      if (e == cudaErrorInsufficientDriver && driver == nullptr)
        *why = "no NVIDIA driver on this machine (libcuda.so.1 is not installed), so no GPU to use";
      else if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0))
        *why = "the NVIDIA driver sees no GPU on this machine";
      else
        *why = std::string("CUDA: ") + cudaGetErrorString(e);
      if (driver != nullptr) dlclose(driver);
    }
    cudaGetLastError();  // clear the sticky error
    return false;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) == cudaSuccess && p.major < 8) {
    if (why != nullptr)
      *why = std::string("CUDA: ") + p.name + " is sm_" + std::to_string(p.major * 10 + p.minor) +
             "; the CUDA backend is built for sm_80 and newer";
    return false;
  }
  return true;
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}

struct CudaBackend::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  cuda::Context ctx;
  cuda::KernelTable table;
};

CudaBackend::CudaBackend(int device) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  TS_CUDA(cudaSetDevice(device));
  TS_CUDA(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  // Stream-ordered scratch (widening, attention's row sums) stays in the pool between steps
  // instead of going back to the driver at every synchronization.
  cudaMemPool_t pool = nullptr;
  TS_CUDA(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t keep = UINT64_MAX;
  TS_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  TS_CHECK(cublasLtCreate(&impl_->lt) == CUBLAS_STATUS_SUCCESS) << "cublasLtCreate failed";
  TS_CUDA(cudaMalloc(&impl_->ctx.workspace, kWorkspaceBytes));
  impl_->ctx.lt = impl_->lt;
  impl_->ctx.workspace_bytes = kWorkspaceBytes;
  cuda::register_elementwise_kernels(impl_->table);
  cuda::register_shape_kernels(impl_->table);
  cuda::register_matmul_kernels(impl_->table);
  cuda::register_nn_kernels(impl_->table);
  cuda::register_norm_kernels(impl_->table);
  cuda::register_attention_kernels(impl_->table);
  cuda::register_moe_kernels(impl_->table);
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(impl_->device);
  cudaStreamSynchronize(impl_->stream);
  cudaFree(impl_->ctx.workspace);
  cublasLtDestroy(impl_->lt);
  cudaStreamDestroy(impl_->stream);
}

bool CudaBackend::supports(OpKind op) const {
  return op == OpKind::cast || impl_->table.at(op).fn != nullptr;
}

void CudaBackend::run(const Graph& g, const Node& node, std::span<const void* const> inputs,
                      std::span<void* const> outputs) {
  // Every method makes the backend's device current: the calling thread may use another.
  TS_CUDA(cudaSetDevice(impl_->device));
  cudaStream_t s = impl_->stream;
  if (node.op == OpKind::cast) {
    const TensorType& in = g.type(node.inputs[0]);
    cuda::convert(inputs[0], in.dtype, outputs[0], g.type(node.outputs[0]).dtype, in.shape.numel(),
                  s);
    return;
  }
  const cuda::KernelTable::Entry& k = impl_->table.at(node.op);
  TS_CHECK(k.fn != nullptr) << "the CUDA backend has no kernel for " << op_name(node.op)
                            << " (ask supports() first)";
  std::vector<TensorType> in_types, out_types;
  for (ValueId v : node.inputs) in_types.push_back(g.type(v));
  for (ValueId v : node.outputs) out_types.push_back(g.type(v));
  cuda::Args args{{node.attrs, in_types, out_types, {}, {}}, s, &impl_->ctx};
  args.in.assign(inputs.begin(), inputs.end());
  args.out.assign(outputs.begin(), outputs.end());
  const bool low = std::any_of(in_types.begin(), in_types.end(),
                               [](const TensorType& t) { return is_low_precision(t.dtype); }) ||
                   std::any_of(out_types.begin(), out_types.end(),
                               [](const TensorType& t) { return is_low_precision(t.dtype); });
  if (low && !k.low_precision)
    cuda::run_in_f32(node.op, args, k.fn);
  else
    k.fn(node.op, args);
}

void* CudaBackend::alloc(int64_t bytes) {
  TS_CUDA(cudaSetDevice(impl_->device));
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes > 0 ? bytes : 1));
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it
    throw OutOfDeviceMemory(device_name() + " cannot allocate " + std::to_string(bytes) +
                            " more bytes (" + std::to_string(free_memory()) + " free)");
  }
  TS_CUDA(e);
  // Zeroed before it is returned: a caller may write it from another stream (cudaMemcpy on
  // the legacy stream does not wait for the backend's non-blocking one). Never inside a step.
  TS_CUDA(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes > 0 ? bytes : 1), impl_->stream));
  synchronize();
  return p;
}

void CudaBackend::free(void* p) {
  TS_CUDA(cudaSetDevice(impl_->device));
  synchronize();
  TS_CUDA(cudaFree(p));
}

void CudaBackend::to_device(void* dst, const void* src, int64_t bytes) {
  TS_CUDA(cudaSetDevice(impl_->device));
  TS_CUDA(
      cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, impl_->stream));
}

void CudaBackend::to_host(void* dst, const void* src, int64_t bytes) {
  TS_CUDA(cudaSetDevice(impl_->device));
  TS_CUDA(
      cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, impl_->stream));
  synchronize();
}

void CudaBackend::copy(void* dst, const void* src, int64_t bytes) {
  TS_CUDA(cudaSetDevice(impl_->device));
  TS_CUDA(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                          impl_->stream));
}

void CudaBackend::fill(void* dst, uint8_t byte, int64_t bytes) {
  TS_CUDA(cudaSetDevice(impl_->device));
  TS_CUDA(cudaMemsetAsync(dst, byte, static_cast<size_t>(bytes), impl_->stream));
}

double CudaBackend::sum_squares(const void* x, DType dtype, int64_t n) {
  TS_CUDA(cudaSetDevice(impl_->device));
  return cuda::sum_squares(x, dtype, n, impl_->stream);
}

void CudaBackend::scale(float* x, int64_t n, float c) {
  TS_CUDA(cudaSetDevice(impl_->device));
  cuda::scale(x, n, c, impl_->stream);
}

void CudaBackend::accumulate(float* dst, const void* src, DType src_dtype, int64_t n, bool first) {
  TS_CUDA(cudaSetDevice(impl_->device));
  cuda::accumulate(dst, src, src_dtype, n, first, impl_->stream);
}

void CudaBackend::adamw(const AdamWUpdate& u, float* param, const void* grad, DType grad_dtype,
                        float* m, float* v, int64_t n) {
  TS_CUDA(cudaSetDevice(impl_->device));
  cuda::adamw(u, param, grad, grad_dtype, m, v, n, impl_->stream);
}

void CudaBackend::convert(const void* src, DType from, void* dst, DType to, int64_t n) {
  TS_CUDA(cudaSetDevice(impl_->device));
  cuda::convert(src, from, dst, to, n, impl_->stream);
}

namespace {

// The multi-tensor passes of backend/cuda/optim.h over the group's tensors: one device buffer
// holds the descriptors, the chunk sums, and each tensor's total and first chunk.
class CudaOptimizerGroup final : public OptimizerGroup {
 public:
  CudaOptimizerGroup(CudaBackend& b, const std::vector<OptimizerTensor>& tensors) : b_(b) {
    std::vector<cuda::OptimTensor> list;
    std::vector<int64_t> first_chunk{0};
    for (const OptimizerTensor& t : tensors) {
      const bool working = t.working != nullptr;
      list.push_back({working ? t.working : t.master, t.master, t.grad, t.m, t.v, t.n,
                      working ? t.working_dtype : DType::f32, t.grad_dtype, t.decay});
      first_chunk.push_back(first_chunk.back() + (t.n + cuda::kChunk - 1) / cuda::kChunk);
    }
    count_ = static_cast<int64_t>(list.size());
    const int64_t chunks = first_chunk.back();
    auto up = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
    const int64_t parts_at = 0, totals_at = up(chunks * 8), first_at = totals_at + up(count_ * 8),
                  list_at = first_at + up((count_ + 1) * 8);
    mem_ = b.allocate(list_at + cuda::describe_bytes(list));
    parts_ = reinterpret_cast<double*>(mem_.bytes_at(parts_at));
    totals_ = reinterpret_cast<double*>(mem_.bytes_at(totals_at));
    first_chunk_ = reinterpret_cast<int64_t*>(mem_.bytes_at(first_at));
    b.to_device(first_chunk_, first_chunk.data(), (count_ + 1) * 8);
    b.synchronize();  // before describe()'s copies on the legacy stream, and first_chunk's
    list_ = cuda::describe(list, mem_.bytes_at(list_at));
  }

  std::vector<double> sum_squares() override {
    cuda::sum_squares(list_, parts_, b_.stream());
    cuda::tensor_sums(parts_, first_chunk_, count_, totals_, b_.stream());
    std::vector<double> out(static_cast<size_t>(count_));
    b_.to_host(out.data(), totals_, count_ * 8);
    return out;
  }

  void adamw(const AdamWUpdate& u) override { cuda::adamw(list_, u, b_.stream()); }

 private:
  CudaBackend& b_;
  Buffer mem_;
  cuda::OptimTensors list_;
  int64_t count_ = 0;
  double *parts_ = nullptr, *totals_ = nullptr;
  int64_t* first_chunk_ = nullptr;
};

}  // namespace

std::unique_ptr<OptimizerGroup> CudaBackend::optimizer_group(std::vector<OptimizerTensor> tensors) {
  TS_CUDA(cudaSetDevice(impl_->device));
  return std::make_unique<CudaOptimizerGroup>(*this, tensors);
}

namespace {

class CudaGraph final : public Recording {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  void replay() override { TS_CUDA(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

// Events recorded on the stream, created as marks need them and reused.
class EventTimer final : public WorkTimer {
 public:
  EventTimer(CudaBackend& b) : b_(b) {}
  ~EventTimer() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  void mark() override {
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      TS_CUDA(cudaEventCreate(&e));
      events_.push_back(e);
    }
    TS_CUDA(cudaEventRecord(events_[used_++], b_.stream()));
  }
  std::vector<double> intervals() override {
    b_.synchronize();
    std::vector<double> out;
    for (size_t i = 1; i < used_; ++i) {
      float ms = 0;
      TS_CUDA(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
      out.push_back(1e-3 * ms);
    }
    used_ = 0;
    return out;
  }

 private:
  CudaBackend& b_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

}  // namespace

std::unique_ptr<WorkTimer> CudaBackend::work_timer() {
  TS_CUDA(cudaSetDevice(impl_->device));
  return std::make_unique<EventTimer>(*this);
}

std::unique_ptr<Recording> CudaBackend::record(const std::function<void()>& enqueue) {
  TS_CUDA(cudaSetDevice(impl_->device));
  cudaStream_t s = impl_->stream;
  TS_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  cudaGraph_t graph = nullptr;
  try {
    enqueue();
  } catch (...) {
    cudaStreamEndCapture(s, &graph);  // leave the stream usable, then pass the error on
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw;
  }
  TS_CUDA(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  TS_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  TS_CUDA(cudaGraphDestroy(graph));
  return std::make_unique<CudaGraph>(exec, s);
}

int64_t CudaBackend::free_memory() const {
  TS_CUDA(cudaSetDevice(impl_->device));
  size_t free = 0, total = 0;
  TS_CUDA(cudaMemGetInfo(&free, &total));
  return static_cast<int64_t>(free);
}

void CudaBackend::synchronize() {
  TS_CUDA(cudaSetDevice(impl_->device));
  TS_CUDA(cudaStreamSynchronize(impl_->stream));
}

cudaStream_t CudaBackend::stream() const { return impl_->stream; }

void CudaBackend::pin_host(void* p, int64_t bytes) {
  if (p == nullptr || bytes <= 0) return;
  if (cudaHostRegister(p, static_cast<size_t>(bytes), cudaHostRegisterDefault) != cudaSuccess)
    (void)cudaGetLastError();  // left pageable: the copies stage through the driver's buffers
}

void CudaBackend::unpin_host(void* p) {
  if (p != nullptr && cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

std::string CudaBackend::device_name() const {
  cudaDeviceProp p{};
  TS_CUDA(cudaGetDeviceProperties(&p, impl_->device));
  return std::string(p.name) + " (sm_" + std::to_string(p.major * 10 + p.minor) + ")";
}

}  // namespace tessera
