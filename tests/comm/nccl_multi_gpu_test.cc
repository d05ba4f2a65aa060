// NCCL across GPUs (label multi-gpu: skipped, and reported as skipped, on machines with fewer
// than 2 GPUs): up to 4 ranks as threads of this process, each on its own GPU, bootstrapped over
// the in-process host communicators, against the exact sums the host ring gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "comm/local_comm.h"
#include "comm/nccl_comm.h"

namespace tessera {
namespace {

// Small integers: exact in f32 and bf16 whatever the summation order.
float value(int rank, int64_t i) { return static_cast<float>((rank + 1) * (i % 13) - 7 * rank); }

TEST(NcclMultiGpu, RanksOnTheirOwnGpusReduceGatherAndSplit) {
  const int gpus = cuda_device_count();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs or more; this machine has " << gpus;
  const int n = std::min(gpus, 4);
  auto host = make_local_comms(n);
  std::vector<std::thread> ranks;
  std::vector<std::string> failures(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      std::string& fail = failures[static_cast<size_t>(r)];
      CudaBackend gpu(r);
      auto world = nccl_world(*host[static_cast<size_t>(r)], gpu.stream());
      if (!world.ok()) return void(fail = world.status().to_string());
      Communicator& c = **world;
      const int64_t count = 1001;
      std::vector<float> x(count), want(count, 0.0f), got(count);
      for (int64_t i = 0; i < count; ++i) {
        x[i] = value(r, i);
        for (int q = 0; q < n; ++q) want[i] += value(q, i);
      }
      Buffer d = gpu.allocate(count * 4), all = gpu.allocate(count * 4 * n);
      gpu.to_device(d.data(), x.data(), count * 4);
      if (Status s = c.wait(c.all_reduce(d.data(), count, DType::f32, "sum")); !s.ok())
        return void(fail = s.to_string());
      gpu.to_host(got.data(), d.data(), count * 4);
      if (got != want) fail += "all_reduce differs; ";
      gpu.to_device(d.data(), x.data(), count * 4);
      if (Status s = c.wait(c.all_gather(d.data(), all.data(), count, DType::f32, "ag")); !s.ok())
        return void(fail = s.to_string());
      std::vector<float> every(static_cast<size_t>(count * n));
      gpu.to_host(every.data(), all.data(), count * 4 * n);
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < count; ++i)
          if (every[static_cast<size_t>(q * count + i)] != value(q, i)) fail += "all_gather; ";
      auto pair = c.split(r / 2, r % 2, "pair");
      if (!pair.ok() || !*pair) return void(fail += "split; ");
      auto sum = (*pair)->all_reduce_scalar(r, /*max=*/false, "pair sum");
      const int first = r / 2 * 2, second = std::min(first + 1, n - 1);
      if (!sum.ok() || *sum != (first == second ? first : first + second)) fail += "pair sum; ";
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(failures[static_cast<size_t>(r)], "") << "rank " << r;
}

}  // namespace
}  // namespace tessera
