// A backend whose memory the host cannot address: a stand-in for a GPU in CPU tests. Its
// buffers are addresses no process maps (as NullBackend's); behind each one it keeps host
// storage, and it runs the CPU backend's kernels and passes on that storage. A runtime that
// read or wrote a buffer without the backend (a host pointer where a device pointer belongs)
// would fault, so a test that trains through it proves the runtime only touches memory
// through the Backend interface, as a CUDA device requires.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "base/check.h"
#include "comm/communicator.h"

namespace tessera {

class OpaqueBackend final : public Backend {
 public:
  const char* name() const override { return "opaque"; }
  bool supports(OpKind op) const override { return cpu_.supports(op); }
  void run(const Graph& g, const Node& node, std::span<const void* const> inputs,
           std::span<void* const> outputs) override {
    std::vector<const void*> in;
    std::vector<void*> out;
    for (const void* p : inputs) in.push_back(real(p));
    for (void* p : outputs) out.push_back(real(p));
    cpu_.run(g, node, in, out);
  }

  MemSpace memory() const override { return MemSpace::device; }
  void* alloc(int64_t bytes) override {
    const uintptr_t at = next_;
    next_ += (static_cast<uintptr_t>(bytes) + 8191) / 4096 * 4096;  // a gap page after each
    blocks_[at] = Block{std::make_unique<uint8_t[]>(static_cast<size_t>(bytes) + 1), bytes};
    return reinterpret_cast<void*>(at);
  }
  void free(void* p) override {
    TS_CHECK(blocks_.erase(reinterpret_cast<uintptr_t>(p)) == 1) << "not an opaque buffer";
  }
  void to_device(void* dst, const void* host_src, int64_t bytes) override {
    std::memcpy(real(dst, bytes), host_src, static_cast<size_t>(bytes));
  }
  void to_host(void* host_dst, const void* src, int64_t bytes) override {
    std::memcpy(host_dst, real(src, bytes), static_cast<size_t>(bytes));
  }
  void copy(void* dst, const void* src, int64_t bytes) override {
    std::memmove(real(dst, bytes), real(src, bytes), static_cast<size_t>(bytes));
  }
  void fill(void* dst, uint8_t byte, int64_t bytes) override {
    std::memset(real(dst, bytes), byte, static_cast<size_t>(bytes));
  }

  double sum_squares(const void* x, DType dtype, int64_t n) override {
    return cpu_.sum_squares(real(x), dtype, n);
  }
  void scale(float* x, int64_t n, float c) override { cpu_.scale(real(x), n, c); }
  void accumulate(float* dst, const void* src, DType src_dtype, int64_t n, bool first) override {
    cpu_.accumulate(real(dst), real(src), src_dtype, n, first);
  }
  void adamw(const AdamWUpdate& u, float* param, const void* grad, DType grad_dtype, float* m,
             float* v, int64_t n) override {
    cpu_.adamw(u, real(param), real(grad), grad_dtype, real(m), real(v), n);
  }
  void convert(const void* src, DType from, void* dst, DType to, int64_t n) override {
    cpu_.convert(real(src), from, real(dst), to, n);
  }

  // The host storage behind `bytes` bytes at address p (a test's device communicator's view).
  void* storage(const void* p, int64_t bytes) const { return real(const_cast<void*>(p), bytes); }

 private:
  struct Block {
    std::unique_ptr<uint8_t[]> data;
    int64_t bytes = 0;
  };
  // The host storage behind address p (inside a live buffer, with `bytes` after it).
  template <typename T>
  T* real(T* p, int64_t bytes = 0) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = blocks_.upper_bound(a);
    TS_CHECK(it != blocks_.begin()) << "address outside every opaque buffer";
    --it;
    const uintptr_t off = a - it->first;
    TS_CHECK(static_cast<int64_t>(off) + bytes <= std::max<int64_t>(it->second.bytes, 1))
        << "access past the end of an opaque buffer";
    return reinterpret_cast<T*>(it->second.data.get() + off);
  }

  CpuBackend cpu_;
  std::map<uintptr_t, Block> blocks_;
  uintptr_t next_ = uintptr_t{1} << 62;
};

// A device communicator for OpaqueBackend's memory, as NCCL is for a GPU's: memory() is
// device, so the step runner hands it the values in place, in their dtype, with no host
// staging; it passes the host storage behind them to a host communicator (the rank's own, of a
// world separate from its host world). Ranks as threads, for CPU tests of the device path.
class OpaqueCommunicator final : public Communicator {
 public:
  OpaqueCommunicator(std::unique_ptr<Communicator> host, const OpaqueBackend& memory)
      : host_(std::move(host)), mem_(memory) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }
  int world_rank(int r) const override { return host_->world_rank(r); }
  MemSpace memory() const override { return MemSpace::device; }
  const char* kind() const override { return "opaque"; }
  Result<std::unique_ptr<Communicator>> split(int color, int key, std::string name) override {
    TS_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> c, host_->split(color, key, name));
    if (!c) return std::unique_ptr<Communicator>();
    return std::unique_ptr<Communicator>(new OpaqueCommunicator(std::move(c), mem_));
  }
  Status wait(const Request& r) override { return host_->wait(r); }
  bool test(const Request& r) const override { return host_->test(r); }
  Status barrier(std::string what) override { return host_->barrier(std::move(what)); }
  Result<double> all_reduce_scalar(double x, bool max, std::string what) override {
    return host_->all_reduce_scalar(x, max, std::move(what));
  }
  CommStats stats() const override { return host_->stats(); }
  void reset_stats() override { host_->reset_stats(); }
  void set_timeout(double seconds) override { host_->set_timeout(seconds); }
  double timeout() const override { return host_->timeout(); }

 protected:
  Request do_all_reduce(void* data, int64_t count, DType dt, std::string what) override {
    return host_->all_reduce(view(data, count, dt), count, dt, std::move(what));
  }
  Request do_reduce_scatter(const void* in, void* out, int64_t count, DType dt,
                            std::string what) override {
    return host_->reduce_scatter(view(in, count * size(), dt), view(out, count, dt), count, dt,
                                 std::move(what));
  }
  Request do_all_gather(const void* in, void* out, int64_t count, DType dt,
                        std::string what) override {
    return host_->all_gather(view(in, count, dt), view(out, count * size(), dt), count, dt,
                             std::move(what));
  }
  Request do_all_to_all(const void* in, void* out, int64_t count, DType dt,
                        std::string what) override {
    return host_->all_to_all(view(in, count * size(), dt), view(out, count * size(), dt), count, dt,
                             std::move(what));
  }
  Request do_broadcast(void* data, int64_t count, DType dt, int root, std::string what) override {
    return host_->broadcast(view(data, count, dt), count, dt, root, std::move(what));
  }
  Request do_p2p(bool receiving, void* data, int64_t count, DType dt, int peer, int tag,
                 std::string what) override {
    void* v = view(data, count, dt);
    return receiving ? host_->recv(v, count, dt, peer, tag, std::move(what))
                     : host_->send(v, count, dt, peer, tag, std::move(what));
  }

 private:
  void* view(const void* p, int64_t count, DType dt) const {
    return count == 0 ? nullptr : mem_.storage(p, count * dtype_size(dt));
  }

  std::unique_ptr<Communicator> host_;
  const OpaqueBackend& mem_;
};

}  // namespace tessera
