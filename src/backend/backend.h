// The Backend interface: one kind of device's memory and kernels. The runtime allocates its
// buffers through it (one arena sized by the static memory plan, the parameters), copies
// inputs in and results out through it, and executes a graph node by node on it; a backend
// that cannot run an op says so via supports() so that the caller can fall back or report it.
//
//   CpuBackend cpu;
//   Buffer x = cpu.allocate(bytes);              // zero-filled, released with the Buffer
//   cpu.to_device(x.data(), host_x, bytes);
//   cpu.run(graph, node, {x.data(), w.data()}, {y.data()});
//   cpu.to_host(host_y, y.data(), bytes);        // waits for the work before it
//
// Three backends: CpuBackend (host memory), CudaBackend (-DTESSERA_CUDA=ON, device memory and
// one stream) and NullBackend (backend/null_backend.h: hands out addresses that are never
// read and runs nothing, for planning tests of full-size models).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/mem_space.h"
#include "ir/graph.h"

namespace tessera {

// What a kernel gets for one node: its attributes, its values' types, and pointers to its
// buffers (host or device memory, as the backend keeps them), f32 unless the backend says.
struct KernelArgs {
  const Attrs& attrs;
  std::span<const TensorType> in_types;
  std::span<const TensorType> out_types;
  std::vector<const void*> in;
  std::vector<void*> out;

  const float* fin(int i) const { return static_cast<const float*>(in[static_cast<size_t>(i)]); }
  const int32_t* iin(int i) const {
    return static_cast<const int32_t*>(in[static_cast<size_t>(i)]);
  }
  float* fout(int i) const { return static_cast<float*>(out[static_cast<size_t>(i)]); }
  const Shape& in_shape(int i) const { return in_types[static_cast<size_t>(i)].shape; }
  int num_inputs() const { return static_cast<int>(in.size()); }
  const Shape& out_shape(int i) const { return out_types[static_cast<size_t>(i)].shape; }
  // The node's attributes as its op's type (op.h).
  template <class T>
  const T& attr() const {
    return attrs_as<T>(attrs);
  }
};

// What a device backend's alloc throws when the device has no room (a std::bad_alloc, as
// operator new throws for host memory); what() names the device and the bytes.
class OutOfDeviceMemory : public std::bad_alloc {
 public:
  explicit OutOfDeviceMemory(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

class Backend;

// Memory of one backend, released to it when the Buffer is destroyed. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* owner, void* data, int64_t bytes) : owner_(owner), data_(data), bytes_(bytes) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void* data() const { return data_; }
  uint8_t* bytes_at(int64_t offset) const { return static_cast<uint8_t*>(data_) + offset; }
  int64_t bytes() const { return bytes_; }
  Backend* backend() const { return owner_; }
  explicit operator bool() const { return data_ != nullptr; }
  void reset();

 private:
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// One AdamW update of a tensor's elements (torch.optim.AdamW's arithmetic, bias corrections
// folded into step_size and bc2_sqrt), with g = grad * grad_scale:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p = p*shrink - step_size m / (sqrt(v)/bc2_sqrt +
//   eps)
struct AdamWUpdate {
  float grad_scale = 1.0f;  // clipping (and loss-scale) coefficient
  float shrink = 1.0f;      // decoupled weight decay: 1 - lr * weight_decay, or 1
  float beta1 = 0.9f, beta2 = 0.95f;
  float step_size = 0.0f;  // lr / (1 - beta1^t)
  float bc2_sqrt = 1.0f;   // sqrt(1 - beta2^t)
  float eps = 1e-8f;
};

// One tensor the optimizer updates every step, in a backend's memory: f32 master weights, the
// gradient (grad_dtype), the AdamW moments, and optionally a working copy (a bf16/f16
// graph's parameter) written with the updated weights after each update.
struct OptimizerTensor {
  float* master = nullptr;
  const void* grad = nullptr;
  DType grad_dtype = DType::f32;
  float *m = nullptr, *v = nullptr;
  int64_t n = 0;
  bool decay = true;  // AdamWUpdate::shrink applies (1 for the others)
  void* working = nullptr;
  DType working_dtype = DType::f32;
};

// The optimizer's passes over a fixed list of tensors (Backend::optimizer_group): each pass
// over all of them at once (one launch and at most one wait on a device), with the single-
// tensor passes' arithmetic.
class OptimizerGroup {
 public:
  virtual ~OptimizerGroup() = default;
  // Each tensor's gradient sum of squares, equal to Backend::sum_squares of it; one wait.
  virtual std::vector<double> sum_squares() = 0;
  // Backend::adamw on every tensor (u.shrink where decay is set, 1 elsewhere), then each
  // working copy set to the master weights in its dtype (Backend::convert).
  virtual void adamw(const AdamWUpdate& u) = 0;
};

// Backend work recorded once (Backend::record) and enqueued again by replay(): on a device one
// launch of the whole sequence (a CUDA graph), on the same buffers.
class Recording {
 public:
  virtual ~Recording() = default;
  virtual void replay() = 0;
};

// Time of a backend's work between marks: device time on a device (CUDA events in the
// stream, idle gaps included), the host clock on a backend whose work is done when enqueued.
class WorkTimer {
 public:
  virtual ~WorkTimer() = default;
  // A mark after the work enqueued so far.
  virtual void mark() = 0;
  // Seconds between consecutive marks (one fewer than the marks; waits for the work), then
  // forgets the marks.
  virtual std::vector<double> intervals() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // The device as its driver names it ("NVIDIA H100 80GB HBM3 (sm_90)"); the backend's name
  // where there is no such device (the CPU).
  virtual std::string device_name() const { return name(); }
  virtual bool supports(OpKind op) const = 0;
  // Runs one node (enqueues it, on a device). inputs/outputs point at this backend's buffers
  // of the node's value types, densely packed row-major. Outputs never alias inputs.
  virtual void run(const Graph& g, const Node& node, std::span<const void* const> inputs,
                   std::span<void* const> outputs) = 0;

  // Memory: allocate() is alloc() owned by the returned Buffer. alloc gives zero-filled
  // memory (or fails as operator new does); free waits for the work that may still use it.
  virtual MemSpace memory() const = 0;
  Buffer allocate(int64_t bytes);
  virtual void* alloc(int64_t bytes) = 0;
  virtual void free(void* p) = 0;
  // Copies between host memory and this backend's memory, and within it, and byte fills, in
  // order with run(); to_host waits for everything before it, so `dst` is ready on return.
  virtual void to_device(void* dst, const void* host_src, int64_t bytes) = 0;
  // Host memory the device copies to and from on every step (an offloaded optimizer's state,
  // offloaded parameters): page-locked, where the device has copy engines that need it, so its
  // copies run at the link's rate without a staging pass; unpin_host before it is freed.
  // Nothing on a backend without (the CPU).
  virtual void pin_host(void* /*p*/, int64_t /*bytes*/) {}
  virtual void unpin_host(void* /*p*/) {}
  virtual void to_host(void* host_dst, const void* src, int64_t bytes) = 0;
  virtual void copy(void* dst, const void* src, int64_t bytes) = 0;
  virtual void fill(void* dst, uint8_t byte, int64_t bytes) = 0;
  // Waits until all work enqueued on this backend has finished.
  virtual void synchronize() {}
  // Bytes alloc can still hand out (a device's free memory), or -1 where that is not known
  // (host memory, which the OS overcommits): the runtime refuses a plan larger than this
  // before allocating any of it.
  virtual int64_t free_memory() const { return -1; }

  // The optimizer's flat passes over this backend's buffers of n elements: f32 unless a dtype
  // is named (a bf16/f16 gradient is read widened to f32).
  // The sum of squares in double, added in an order fixed for n (the same on every run); waits,
  // the result is on the host.
  virtual double sum_squares(const void* x, DType dtype, int64_t n) = 0;
  virtual void scale(float* x, int64_t n, float c) = 0;
  // Gradient accumulation: dst = src when `first`, else dst += src.
  virtual void accumulate(float* dst, const void* src, DType src_dtype, int64_t n, bool first) = 0;
  // AdamW on f32 parameters and moments.
  virtual void adamw(const AdamWUpdate& u, float* param, const void* grad, DType grad_dtype,
                     float* m, float* v, int64_t n) = 0;
  // Elementwise dtype conversion (f32/bf16/f16 to any of them; i32 to i32), within this
  // backend's memory: master weights to a low-precision working copy.
  virtual void convert(const void* src, DType from, void* dst, DType to, int64_t n) = 0;
  // The passes above over a list of tensors described once (pointers fixed for the group's
  // life). This default runs them tensor by tensor; a device runs each as one launch.
  virtual std::unique_ptr<OptimizerGroup> optimizer_group(std::vector<OptimizerTensor> tensors);

  // A timer of this backend's work; the default reads the host clock (work done when enqueued).
  virtual std::unique_ptr<WorkTimer> work_timer();

  // Records the work `enqueue` enqueues (run(), copy() and fill() within this backend's memory;
  // no waits, no host copies) for replay: the work is recorded, not done, and replay() does it
  // on the same pointers, whose buffers must outlive the recording. Null where the backend does
  // not record (then run the work itself again); the default.
  virtual std::unique_ptr<Recording> record(const std::function<void()>& enqueue) {
    (void)enqueue;
    return nullptr;
  }
};

// Host views of a backend's f32 buffers, for host code that reads or writes values in place
// (checkpoints, a sample's logits): on a host backend the memory itself; otherwise a host
// copy (read: copied out now; write: copied in at flush(), which the destructor does).
// Views stay valid while the staging lives.
//
//   HostStaging host(backend);
//   writer.add(name, host.read(runner.param_storage(i), n));
//   reader.read(name, host.write(runner.param_storage(i), n));  host.flush();
class HostStaging {
 public:
  explicit HostStaging(Backend& backend) : b_(backend) {}
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  ~HostStaging() { flush(); }

  const float* read(const void* p, int64_t n) {
    if (b_.memory() == MemSpace::host) return static_cast<const float*>(p);
    std::vector<float>& v = copies_.emplace_back(static_cast<size_t>(n));
    b_.to_host(v.data(), p, n * static_cast<int64_t>(sizeof(float)));
    return v.data();
  }
  // The view starts with the buffer's values (a partial write keeps the rest).
  float* write(void* p, int64_t n) {
    if (b_.memory() == MemSpace::host) return static_cast<float*>(p);
    float* v = const_cast<float*>(read(p, n));
    pending_.emplace_back(p, v, n);
    return v;
  }
  void flush() {
    for (const auto& [dst, src, n] : pending_)
      b_.to_device(dst, src, n * static_cast<int64_t>(sizeof(float)));
    pending_.clear();
  }

 private:
  Backend& b_;
  std::deque<std::vector<float>> copies_;  // a deque: views stay put as copies are added
  std::vector<std::tuple<void*, const float*, int64_t>> pending_;
};

}  // namespace tessera
