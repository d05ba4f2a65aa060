// The step runner on the GPU (CudaBackend: parameters, arena, accumulators and AdamW state in
// device memory, the optimizer's passes as device kernels) against the same runner on the CPU,
// as `tessera train --device cuda` runs it, its micro-step replayed as a CUDA graph (label gpu:
// skipped, and reported as skipped, where no CUDA device is present).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "comm/local_comm.h"
#include "equivalence.h"
#include "models/model.h"
#include "runtime/step_runner.h"

namespace tessera {
namespace {

constexpr int64_t kBatch = 2, kSeq = 32;

struct Trace {
  std::vector<float> losses;
  std::vector<double> norms;
  float eval = 0;
  int64_t arena = 0;
};

// gpt-tiny in `dtype` for 4 steps of `micro` micro-batches on `backend`, then one evaluation.
Trace train(Backend& backend, DType dtype, int micro, bool record = true) {
  ModelConfig c = *find_preset("gpt-tiny");
  c.dtype = dtype;
  ModelGraph m = build_model(c, kBatch, kSeq, ModelMode::train);
  ModelGraph e = build_model(c, kBatch, kSeq, ModelMode::loss);
  Plan plan = Plan::data_parallel(1);
  plan.micro_batches = micro;
  MeshComms comms = MeshComms::single(plan).value();
  auto made = StepRunner::create(m.graph, plan, backend, comms, AdamWConfig{.lr = 1e-3});
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  Trace t;
  if (!made.ok()) return t;
  StepRunner& step = **made;
  step.set_record_steps(record);
  EXPECT_TRUE(step.add_evaluation(e.graph).ok());
  step.init_params(7);
  t.arena = step.executor().plan().arena_bytes;
  std::vector<int32_t> x(kBatch * kSeq), y(kBatch * kSeq);
  for (int s = 0; s < 4; ++s) {
    float loss = 0;
    for (int k = 0; k < micro; ++k) {
      for (size_t i = 0; i < x.size(); ++i) {
        x[i] = static_cast<int32_t>((i * 7 + static_cast<size_t>(s + k) * 13) % 97);
        y[i] = static_cast<int32_t>((i * 5 + static_cast<size_t>(s) * 3 + 1) % 97);
      }
      loss += step.forward_backward(token_feed(x.data(), y.data())).value();
    }
    t.losses.push_back(loss / static_cast<float>(micro));
    t.norms.push_back(step.apply(1e-3, 1.0).value());
  }
  t.eval = step.evaluate(token_feed(x.data(), y.data())).value();
  return t;
}

TEST(StepRunnerOnCuda, FollowsTheCpuStepRunner) {
  std::string why;
  if (!cuda_device_present(&why)) GTEST_SKIP() << why;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (int micro : {1, 2}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + ", micro-batches " + std::to_string(micro));
      CpuBackend cpu;
      CudaBackend gpu;
      const Trace want = train(cpu, dt, micro), got = train(gpu, dt, micro);
      // f32: sums in another order; bf16/f16: a rounding of either side's activations.
      const double tol = dt == DType::f32 ? 1e-4 : 2e-2;
      ASSERT_EQ(got.losses.size(), want.losses.size());
      for (size_t s = 0; s < want.losses.size(); ++s) {
        EXPECT_NEAR(got.losses[s], want.losses[s], tol * want.losses[s]) << "step " << s;
        EXPECT_NEAR(got.norms[s], want.norms[s], 10 * tol * want.norms[s]) << "step " << s;
      }
      EXPECT_NEAR(got.eval, want.eval, tol * want.eval);
    }
  }
}

// bf16 parameters, activations and gradients with f32 master weights on the device: the
// losses follow f32's within bf16's rounding and the arena holds about half the bytes.
TEST(StepRunnerOnCuda, Bf16FollowsF32InHalfTheArena) {
  std::string why;
  if (!cuda_device_present(&why)) GTEST_SKIP() << why;
  CudaBackend gpu;
  const Trace f32 = train(gpu, DType::f32, 1), bf16 = train(gpu, DType::bf16, 1);
  ASSERT_EQ(bf16.losses.size(), f32.losses.size());
  for (size_t s = 0; s < f32.losses.size(); ++s)
    EXPECT_NEAR(bf16.losses[s], f32.losses[s], 0.02 * f32.losses[s]) << "step " << s;
  EXPECT_LT(static_cast<double>(bf16.arena), 0.6 * static_cast<double>(f32.arena));
}

// From the second micro-step on, the runner replays a CUDA graph of it: the same losses,
// norms and evaluation as eager steps, bit for bit.
TEST(StepRunnerOnCuda, ReplayedStepsAreTheEagerSteps) {
  std::string why;
  if (!cuda_device_present(&why)) GTEST_SKIP() << why;
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int micro : {1, 2}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + ", micro-batches " + std::to_string(micro));
      CudaBackend gpu;
      const Trace eager = train(gpu, dt, micro, false), replayed = train(gpu, dt, micro, true);
      EXPECT_EQ(replayed.losses, eager.losses);
      EXPECT_EQ(replayed.norms, eager.norms);
      EXPECT_EQ(replayed.eval, eager.eval);
    }
  }
}

// Two ranks on one GPU, as `launch -n 2 -- train --device cuda` runs them where the node has
// one: each rank's parameters, arena and optimizer state in device memory, the collectives
// staged through host memory (data parallelism with ZeRO-1, tensor parallelism, and LLaMA's
// sequences split over the ranks: context parallelism, its attention over a chunk of the
// sequence with the keys gathered or passed round the ring, contiguous or zigzag). Each rank
// follows the CPU ranks of the same plan within f32's reordered sums.
TEST(StepRunnerOnCuda, RanksSharingAGpuFollowTheCpuRanks) {
  std::string why;
  if (!cuda_device_present(&why)) GTEST_SKIP() << why;
  using namespace testing_equivalence;
  std::vector<std::pair<Plan, ModelConfig>> runs = {
      {Plan::data_parallel(2, 1), tiny_gpt()},
      {with_searched_layout(Plan::tensor_parallel(1, 2), tiny_gpt()), tiny_gpt()}};
  for (const Plan& plan : context_parallel_plans()) runs.emplace_back(plan, tiny_llama());
  for (const auto& [plan, cfg] : runs) {
    SCOPED_TRACE(plan.describe());
    std::vector<RunResult> want(2), got(2);
    for (bool gpu : {false, true}) {
      std::vector<std::unique_ptr<Communicator>> comms = make_local_comms(2);
      std::vector<std::thread> ranks;
      for (int r = 0; r < 2; ++r)
        ranks.emplace_back([&, r] {
          std::unique_ptr<CudaBackend> device = gpu ? std::make_unique<CudaBackend>(0) : nullptr;
          (gpu ? got : want)[size_t(r)] = run_rank(*comms[size_t(r)], plan, 3, cfg, device.get());
        });
      for (std::thread& t : ranks) t.join();
    }
    for (size_t r = 0; r < 2; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      ASSERT_EQ(got[r].losses.size(), want[r].losses.size());
      for (size_t s = 0; s < want[r].losses.size(); ++s)
        EXPECT_NEAR(got[r].losses[s], want[r].losses[s], 1e-4 * std::fabs(want[r].losses[s]));
      EXPECT_NEAR(got[r].eval_loss, want[r].eval_loss, 1e-4 * std::fabs(want[r].eval_loss));
      EXPECT_EQ(got[r].arena_measured, want[r].arena_measured);
    }
  }
}

}  // namespace
}  // namespace tessera
