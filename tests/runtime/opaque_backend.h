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

}  // namespace tessera
