// The NULL backend (backend/null_backend.h): distinct addresses that no process maps, byte
// accounting with a peak, kernels counted and not run, copies out as zeros.
#include "backend/null_backend.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ir/builder.h"

namespace tessera {
namespace {

TEST(NullBackend, HandsOutDisjointUnmappedAddressesAndCountsBytes) {
  NullBackend null;
  EXPECT_EQ(null.memory(), MemSpace::none);
  std::vector<void*> p;
  const std::vector<int64_t> sizes = {0, 1, 4096, 4097, int64_t{1} << 40};  // 1 TiB: nothing
  for (int64_t n : sizes) p.push_back(null.alloc(n));
  for (size_t i = 0; i + 1 < p.size(); ++i) {
    const uintptr_t end = reinterpret_cast<uintptr_t>(p[i]) + static_cast<uintptr_t>(sizes[i]);
    EXPECT_LT(end, reinterpret_cast<uintptr_t>(p[i + 1])) << "buffers " << i << ", " << i + 1;
  }
  // Above the 57-bit virtual address space of 5-level paging: never a mapped page.
  EXPECT_GE(reinterpret_cast<uintptr_t>(p[0]), uintptr_t{1} << 57);
  EXPECT_EQ(null.bytes_in_use(), 8194 + (int64_t{1} << 40));
  null.free(p.back());
  EXPECT_EQ(null.bytes_in_use(), 8194);
  EXPECT_EQ(null.peak_bytes(), 8194 + (int64_t{1} << 40));
  for (size_t i = 0; i + 1 < p.size(); ++i) null.free(p[i]);
  EXPECT_EQ(null.bytes_in_use(), 0);
}

TEST(NullBackend, RunsNothingAndReadsZeros) {
  NullBackend null;
  Graph g;
  Builder b(&g);
  const ValueId y = b.relu(b.input("x", Shape{4})).id;
  void* buf = null.alloc(16);
  std::vector<const void*> in = {buf};
  std::vector<void*> out = {buf};
  null.run(g, g.producer(y), in, out);
  null.run(g, g.producer(y), in, out);
  EXPECT_EQ(null.nodes_run(), 2);
  std::vector<float> host(4, 7.0f);
  null.to_host(host.data(), buf, 16);
  for (float v : host) EXPECT_EQ(v, 0.0f);
  null.free(buf);
}

}  // namespace
}  // namespace tessera
