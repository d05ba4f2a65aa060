// NCCL communicators on one GPU (label gpu: skipped, and reported as skipped, without a device):
// one rank's every operation, ordered after the compute stream's work and before its later
// work by events; a device world beside a host world in MeshComms. NCCL refuses two ranks on
// one GPU, so the ranks-on-several-GPUs checks are nccl_multi_gpu_test's.
#include "comm/nccl_comm.h"

#include <gtest/gtest.h>

#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "comm/local_comm.h"

namespace tessera {
namespace {

TEST(NcclComm, OneRankRunsEveryOperationInStreamOrder) {
  std::string why;
  if (!cuda_device_present(&why)) GTEST_SKIP() << why;
  CudaBackend gpu;
  auto host = make_local_comms(1);
  auto world = nccl_world(*host[0], gpu.stream());
  ASSERT_TRUE(world.ok()) << world.status().to_string();
  Communicator& c = **world;
  EXPECT_EQ(c.memory(), MemSpace::device);
  EXPECT_STREQ(c.kind(), "nccl");
  const int64_t n = 1 << 16;
  std::vector<uint16_t> x(n), back(n);
  for (int64_t i = 0; i < n; ++i) x[i] = f32_to_bf16(static_cast<float>(i % 97) - 40);
  Buffer d = gpu.allocate(n * 2), gathered = gpu.allocate(n * 2);
  // The copy in is enqueued on the compute stream; the all-reduce must follow it, and the copy
  // out (after wait) must follow the all-reduce.
  gpu.to_device(d.data(), x.data(), n * 2);
  Request r = c.all_reduce(d.data(), n, DType::bf16, "one rank");
  ASSERT_TRUE(c.wait(r).ok());
  r = c.all_gather(d.data(), gathered.data(), n, DType::bf16, "gather");
  ASSERT_TRUE(c.wait(r).ok());
  gpu.to_host(back.data(), gathered.data(), n * 2);
  EXPECT_EQ(back, x);
  EXPECT_TRUE(c.test(r));
  Buffer swapped = gpu.allocate(n * 2);  // all-to-all on one rank: its own block back
  r = c.all_to_all(d.data(), swapped.data(), n, DType::bf16, "swap");
  ASSERT_TRUE(c.wait(r).ok());
  gpu.to_host(back.data(), swapped.data(), n * 2);
  EXPECT_EQ(back, x);
  auto sum = c.all_reduce_scalar(2.5, /*max=*/false, "scalar");
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(*sum, 2.5);
  EXPECT_TRUE(c.barrier("barrier").ok());
  auto solo = c.split(0, 0, "dp");
  ASSERT_TRUE(solo.ok());
  ASSERT_NE(*solo, nullptr);
  EXPECT_EQ((*solo)->size(), 1);
  EXPECT_EQ((*solo)->name(), "dp");
  auto none = c.split(-1, 0, "none");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  EXPECT_EQ(c.stats().bytes_sent, 0);  // one rank sends nothing
}

}  // namespace
}  // namespace tessera
