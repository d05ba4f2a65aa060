// Mixed-precision training on the CPU: a bf16 or fp16 graph (ModelConfig::dtype) trains
// through the step runner with f32 master weights and AdamW state (fp16 with dynamic loss
// scaling); its losses follow f32's, its arena is about half, the planned arena is the
// measured high-water mark, and the state the runner holds is what the Program and the
// simulator count, byte for byte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "equivalence.h"
#include "runtime/step_runner.h"
#include "sim/simulator.h"

namespace tessera {
namespace {

constexpr int64_t kRows = 4, kLen = 16;

struct Trained {
  std::vector<float> losses;
  int64_t arena = 0, measured = 0, state = 0, program_state = 0;
  double sim_state = 0, sim_arena = 0;
};

// One process training tiny_gpt in `dtype` on a fixed learnable batch of kRows x kLen tokens,
// split into micro_batches.
struct OneRank {
  ModelConfig cfg = testing_equivalence::tiny_gpt();
  ModelGraph m;
  CpuBackend cpu;
  Plan plan = Plan::data_parallel(1);
  std::unique_ptr<MeshComms> comms;
  std::unique_ptr<StepRunner> step;
  std::vector<int32_t> x, y;

  OneRank(DType dtype, int micro_batches) {
    cfg.dtype = dtype;
    m = build_model(cfg, kRows / micro_batches, kLen, ModelMode::train);
    plan.micro_batches = micro_batches;
    Result<MeshComms> made_comms = MeshComms::single(plan);
    EXPECT_TRUE(made_comms.ok());
    comms = std::make_unique<MeshComms>(std::move(*made_comms));
    auto made = StepRunner::create(m.graph, plan, cpu, *comms, AdamWConfig{.lr = 3e-3});
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    step = std::move(*made);
    step->init_params(5);
    x.resize(static_cast<size_t>(kRows * kLen));
    y.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<int32_t>((i * 5 + 1) % cfg.vocab_size);
      y[i] = static_cast<int32_t>((i * 5 + 6) % cfg.vocab_size);
    }
  }
};

Trained train(DType dtype, int micro_batches, int steps) {
  OneRank one(dtype, micro_batches);
  StepRunner& step = *one.step;
  const std::vector<int32_t>&x = one.x, &y = one.y;
  Trained r;
  const int64_t rows = kRows / micro_batches * kLen;
  for (int s = 0; s < steps; ++s) {
    float loss = 0;
    for (int k = 0; k < micro_batches; ++k) {
      if (s == 0 && k == 0) step.executor().paint_arena();
      Result<float> l =
          step.forward_backward(Feed(one.m, {x.data() + k * rows, y.data() + k * rows}));
      EXPECT_TRUE(l.ok()) << l.status().to_string();
      loss += *l / static_cast<float>(micro_batches);
    }
    EXPECT_TRUE(step.apply(3e-3, 1.0).ok());
    r.losses.push_back(loss);
  }
  r.arena = step.executor().plan().arena_bytes;
  r.measured = step.executor().measured_high_water();
  r.state = step.state_bytes_allocated();
  r.program_state = step.program().persistent_bytes();
  SimOptions so;
  so.precision = dtype;
  Result<ClusterSpec> cluster = load_cluster("dgx-a100");
  EXPECT_TRUE(cluster.ok());
  Result<SimResult> sim = simulate(step.program(), *cluster, so);
  EXPECT_TRUE(sim.ok()) << sim.status().to_string();
  r.sim_state = sim->persistent_bytes;
  r.sim_arena = sim->arena_bytes;
  return r;
}

// bf16, and fp16 with its loss scaling, against f32.
TEST(MixedPrecision, LowPrecisionTrainsLikeF32WithHalfTheArenaAndExactState) {
  for (DType low : {DType::bf16, DType::f16}) {
    for (int mb : {1, 2}) {
      SCOPED_TRACE(std::string(dtype_name(low)) + ", micro-batches " + std::to_string(mb));
      const Trained f32 = train(DType::f32, mb, 12), lp = train(low, mb, 12);
      for (size_t s = 0; s < f32.losses.size(); ++s) {
        std::printf("%s micro-batches %d step %zu: loss f32 %.5f %.5f\n", dtype_name(low), mb, s,
                    f32.losses[s], lp.losses[s]);
        EXPECT_NEAR(lp.losses[s], f32.losses[s], 0.02 * f32.losses[s]) << "step " << s;
      }
      EXPECT_LT(lp.losses.back(), lp.losses.front() - 0.5) << "did not learn";
      std::printf("arena f32 %lld %s %lld; state f32 %lld %s %lld\n",
                  static_cast<long long>(f32.arena), dtype_name(low),
                  static_cast<long long>(lp.arena), static_cast<long long>(f32.state),
                  dtype_name(low), static_cast<long long>(lp.state));
      EXPECT_LT(lp.arena, 0.6 * static_cast<double>(f32.arena));
      for (const Trained* r : {&f32, &lp}) {
        EXPECT_EQ(r->measured, r->arena);  // the plan is the high-water mark
        EXPECT_EQ(r->state, r->program_state);
        EXPECT_EQ(r->sim_state, static_cast<double>(r->state));
        EXPECT_EQ(r->sim_arena, static_cast<double>(r->arena));
      }
      // Per parameter: 2-byte copy + f32 master 4 + m, v 8 (+ an f32 accumulator 4 with
      // several micro-batches), against f32's 4 + 8 (+ 4).
      const double ratio = static_cast<double>(lp.state) / static_cast<double>(f32.state);
      EXPECT_NEAR(ratio, mb == 1 ? 14.0 / 12.0 : 18.0 / 16.0, 1e-9);
    }
  }
}

// fp16's dynamic loss scaling: gradients that overflow skip the update and halve the scale;
// kLossScaleGrowth good steps double it; f32 and bf16 runs have none.
TEST(MixedPrecision, Fp16OverflowSkipsTheStepAndHalvesTheScale) {
  OneRank one(DType::f16, 1);
  ASSERT_TRUE(one.step != nullptr);
  StepRunner& step = *one.step;
  EXPECT_EQ(step.loss_scale(), 65536.0);
  auto one_step = [&] {
    EXPECT_TRUE(step.forward_backward(Feed(one.m, {one.x.data(), one.y.data()})).ok());
    Result<double> norm = step.apply(3e-3, 1.0);
    EXPECT_TRUE(norm.ok());
    return norm.ok() ? *norm : -1.0;
  };
  const std::vector<float> before(step.param_data(0), step.param_data(0) + 64);
  step.set_loss_scale(std::ldexp(1.0, 40), 0);  // 2^40: the fp16 gradients overflow
  EXPECT_EQ(one_step(), 0.0);
  EXPECT_TRUE(step.step_skipped());
  EXPECT_EQ(step.loss_scale(), std::ldexp(1.0, 39));
  EXPECT_EQ(std::vector<float>(step.param_data(0), step.param_data(0) + 64), before)
      << "a skipped step changed the parameters";
  step.set_loss_scale(1024, StepRunner::kLossScaleGrowth - 1);
  const double norm = one_step();
  EXPECT_FALSE(step.step_skipped());
  EXPECT_GT(norm, 0.1);  // the true norm: the scale divided out
  EXPECT_LT(norm, 100.0);
  EXPECT_EQ(step.loss_scale(), 2048.0) << "the growth interval's last good step doubles it";
  EXPECT_EQ(step.loss_scale_good_steps(), 0);
  EXPECT_NE(std::vector<float>(step.param_data(0), step.param_data(0) + 64), before);
}

}  // namespace
}  // namespace tessera
