// Backend memory (backend/backend.h): buffers are zero-filled, released once to their backend,
// and the copies between host and backend memory move the bytes they name; the optimizer's
// passes compute what host loops compute; the host work timer reads the clock.
#include "backend/backend.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/null_backend.h"
#include "optimizer_passes.h"

namespace tessera {
namespace {

TEST(Buffer, IsZeroFilledAndCopiesRoundTrip) {
  CpuBackend cpu;
  EXPECT_EQ(cpu.memory(), MemSpace::host);
  Buffer b = cpu.allocate(1000);
  ASSERT_TRUE(b);
  EXPECT_EQ(b.bytes(), 1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % alignof(std::max_align_t), 0u);
  const uint8_t* p = b.bytes_at(0);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(p[i], 0) << i;

  std::vector<uint8_t> in(1000), out(1000, 0);
  std::iota(in.begin(), in.end(), uint8_t{3});
  cpu.to_device(b.data(), in.data(), 1000);
  cpu.to_host(out.data(), b.data(), 1000);
  EXPECT_EQ(out, in);
  // copy within the backend's memory (overlapping ranges move as memmove does), then fill.
  cpu.copy(b.bytes_at(1), b.data(), 10);
  cpu.to_host(out.data(), b.data(), 12);
  EXPECT_EQ(out[1], in[0]);
  EXPECT_EQ(out[10], in[9]);
  cpu.fill(b.bytes_at(500), 0xA5, 100);
  cpu.to_host(out.data(), b.data(), 1000);
  EXPECT_EQ(out[499], in[499]);
  EXPECT_EQ(out[500], 0xA5);
  EXPECT_EQ(out[599], 0xA5);
  EXPECT_EQ(out[600], in[600]);
}

TEST(Buffer, IsReleasedOnceWhenMovedAndDestroyed) {
  NullBackend null;
  {
    Buffer a = null.allocate(100);
    EXPECT_EQ(null.bytes_in_use(), 100);
    Buffer b = std::move(a);
    EXPECT_FALSE(a);  // NOLINT: checking the moved-from state
    EXPECT_EQ(b.bytes(), 100);
    Buffer c = null.allocate(50);
    c = std::move(b);  // c's 50 bytes go back; b's 100 stay, now c's
    EXPECT_EQ(null.bytes_in_use(), 100);
    EXPECT_EQ(null.buffers_in_use(), 1);
  }
  EXPECT_EQ(null.bytes_in_use(), 0);
  EXPECT_EQ(null.buffers_in_use(), 0);
  EXPECT_EQ(null.peak_bytes(), 150);
}

// HostStaging: on host memory the views are the buffers themselves; elsewhere copies, read
// now and written back at flush.
TEST(HostStaging, ViewsHostMemoryInPlaceAndCopiesDeviceMemory) {
  CpuBackend cpu;
  Buffer b = cpu.allocate(16);
  {
    HostStaging host(cpu);
    EXPECT_EQ(host.read(b.data(), 4), b.data());
    host.write(b.data(), 4)[2] = 5.0f;
  }
  EXPECT_EQ(static_cast<float*>(b.data())[2], 5.0f);

  NullBackend null;  // reads zeros, takes writes without storing them
  Buffer d = null.allocate(16);
  HostStaging staged(null);
  const float* r = staged.read(d.data(), 4);
  EXPECT_NE(static_cast<const void*>(r), d.data());
  EXPECT_EQ(r[3], 0.0f);
  float* w = staged.write(d.data(), 4);
  EXPECT_NE(static_cast<void*>(w), d.data());
  w[0] = 1.0f;
  staged.flush();
}

// The CPU backend's optimizer passes are the host loops' arithmetic (FMA contraction may move
// a result by an ulp).
TEST(CpuBackend, OptimizerPassesMatchHostLoops) {
  CpuBackend cpu;
  testing_passes::check_optimizer_passes(cpu, 1e-6);
}

// The host backend's work timer reads the host clock: one interval per pair of marks, each
// at least the time slept between them, and the marks forgotten after.
TEST(CpuBackend, WorkTimerMeasuresBetweenMarks) {
  CpuBackend cpu;
  std::unique_ptr<WorkTimer> t = cpu.work_timer();
  t->mark();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  t->mark();
  t->mark();
  const std::vector<double> s = t->intervals();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_GE(s[0], 0.005);
  EXPECT_GE(s[1], 0.0);
  EXPECT_TRUE(t->intervals().empty());
  EXPECT_EQ(cpu.record([] {}), nullptr) << "the CPU backend records nothing";
}

TEST(CpuBackend, OptimizerGroupIsTheSingleTensorPasses) {
  CpuBackend cpu;
  testing_passes::check_optimizer_group(cpu, 0);  // the same passes: bit for bit
}

}  // namespace
}  // namespace tessera
