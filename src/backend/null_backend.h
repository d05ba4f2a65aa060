// The NULL backend: allocates nothing and runs nothing. Its buffers are addresses no process
// can map (non-canonical on x86-64: a kernel or copy that touched one would fault), so a runtime
// built on it sets up a full-size model's executors in no time and no memory, and reports
// what it would have allocated and run. Planning and scheduling tests use it.
//
//   NullBackend null;
//   Executor ex(gpt3_175b_graph, null);      // instant; null.bytes_in_use() = params + arena
//   ex.run();                                // null.nodes_run() = the graph's kernel nodes
#pragma once

#include <cstdint>
#include <map>

#include "backend/backend.h"

namespace tessera {

class NullBackend final : public Backend {
 public:
  // capacity: the bytes it pretends to have (free_memory() falls as buffers are taken); -1:
  // unbounded.
  explicit NullBackend(int64_t capacity = -1) : capacity_(capacity) {}
  const char* name() const override { return "null"; }
  bool supports(OpKind) const override { return true; }
  void run(const Graph&, const Node&, std::span<const void* const>,
           std::span<void* const>) override {
    ++nodes_run_;
  }

  MemSpace memory() const override { return MemSpace::none; }
  int64_t free_memory() const override { return capacity_ < 0 ? -1 : capacity_ - in_use_; }
  void* alloc(int64_t bytes) override;
  void free(void* p) override;
  // Copies and fills do nothing; to_host writes zeros (there is nothing to read).
  void to_device(void*, const void*, int64_t) override {}
  void to_host(void* host_dst, const void* src, int64_t bytes) override;
  void copy(void*, const void*, int64_t) override {}
  void fill(void*, uint8_t, int64_t) override {}

  // The optimizer's passes do nothing; sum_squares is 0.
  double sum_squares(const void*, DType, int64_t) override { return 0; }
  void scale(float*, int64_t, float) override {}
  void accumulate(float*, const void*, DType, int64_t, bool) override {}
  void adamw(const AdamWUpdate&, float*, const void*, DType, float*, float*, int64_t) override {}
  void convert(const void*, DType, void*, DType, int64_t) override {}

  int64_t bytes_in_use() const { return in_use_; }
  int64_t peak_bytes() const { return peak_; }
  int64_t buffers_in_use() const { return static_cast<int64_t>(live_.size()); }
  int64_t nodes_run() const { return nodes_run_; }

 private:
  std::map<uintptr_t, int64_t> live_;    // address -> bytes
  uintptr_t next_ = uintptr_t{1} << 62;  // outside 48- and 57-bit virtual address spaces
  int64_t capacity_ = -1, in_use_ = 0, peak_ = 0, nodes_run_ = 0;
};

}  // namespace tessera
