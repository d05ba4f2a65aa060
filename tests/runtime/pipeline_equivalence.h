// Shared by the pipeline equivalence tests (in-process ranks and MPI ranks): trains under a
// pipeline plan on one rank of a world (PipelineRunner) on the global batches of equivalence.h,
// and compares with the one-rank run.
#pragma once

#include <map>
#include <string>

#include "equivalence.h"
#include "runtime/pipeline_runner.h"

namespace tessera::testing_equivalence {

struct PipeResult {
  std::vector<float> losses;
  std::vector<double> norms;                         // pre-clip gradient norm per step
  std::vector<double> loss_scales;                   // fp16: the scale after each step
  std::vector<char> skipped;                         // fp16: the step overflowed, no update
  std::map<std::string, std::vector<float>> params;  // the whole tensors of this stage's chunks
  int64_t arena_planned = 0, arena_measured = 0;
  int64_t p2p_buffer_bytes = 0, p2p_planned = 0;
  Status status;
};

// One rank of a pipeline plan (on `backend`; null: the CPU backend; fp16: starting from
// `loss_scale` where it is > 0).
inline PipeResult run_pipeline_rank(Communicator& world, const Plan& plan, int steps,
                                    const ModelConfig& cfg, Backend* backend = nullptr,
                                    double loss_scale = 0) {
  PipeResult out;
  CpuBackend cpu;
  ModelGraph m = build_model(cfg, kBatch, kSeq, ModelMode::train);
  Result<PipelineProgram> pp = lower_pipeline(m.graph, plan);
  if (!pp.ok()) {
    out.status = pp.status();
    return out;
  }
  Result<MeshComms> comms = MeshComms::create(world, plan);
  if (!comms.ok()) {
    out.status = comms.status();
    return out;
  }
  auto made = PipelineRunner::create(m.graph, *pp, backend ? *backend : cpu, *comms, adamw());
  if (!made.ok()) {
    out.status = made.status();
    return out;
  }
  PipelineRunner& step = **made;
  step.init_params(kSeed);
  if (loss_scale > 0) step.set_loss_scale(loss_scale, 0);
  const int dp = plan.data_group();
  const int idx = plan.mesh.group_index(world.rank(), plan.data_axes);
  const int64_t rows = kBatch / dp;
  std::vector<int32_t> x, y, xs, ys;
  for (int s = 0; s < steps; ++s) {
    xs.clear();
    ys.clear();
    for (int k = 0; k < plan.micro_batches; ++k) {  // this rank's rows of each micro-batch
      global_batch(s, k, &x, &y, cfg.vocab_size);
      xs.insert(xs.end(), x.begin() + idx * rows * kSeq, x.begin() + (idx + 1) * rows * kSeq);
      ys.insert(ys.end(), y.begin() + idx * rows * kSeq, y.begin() + (idx + 1) * rows * kSeq);
    }
    if (s == steps - 1) step.paint_arena();
    Result<float> loss = step.forward_backward(token_feed(xs.data(), ys.data()));
    if (!loss.ok()) {
      out.status = loss.status();
      return out;
    }
    Result<double> norm = step.apply(kLr, 0.5);
    if (!norm.ok()) {
      out.status = norm.status();
      return out;
    }
    out.losses.push_back(*loss);
    out.norms.push_back(*norm);
    out.loss_scales.push_back(step.loss_scale());
    out.skipped.push_back(step.step_skipped());
  }
  out.arena_measured = step.measured_arena_bytes();
  out.arena_planned = pp->stage_arena_bytes[static_cast<size_t>(step.stage())];
  out.p2p_buffer_bytes = step.p2p_buffer_bytes();
  out.p2p_planned = step.planned_p2p_bytes();
  for (int v = 0; v < step.local_chunks(); ++v) {
    std::vector<std::vector<float>> whole;
    Status g = step.chunk(v).gather_params(&whole);
    if (!g.ok()) {
      out.status = g;
      return out;
    }
    for (size_t i = 0; i < whole.size(); ++i)
      out.params[step.chunk(v).program().part.params[i].name] = std::move(whole[i]);
  }
  return out;
}

// This rank's losses, parameters (those of its stage's chunks) and memory against `ref`.
inline void expect_pipeline_equivalent(const RunResult& ref, const PipeResult& got,
                                       const ModelConfig& cfg) {
  ASSERT_TRUE(got.status.ok()) << got.status.to_string();
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << "step " << i;
  ASSERT_EQ(got.norms.size(), ref.norms.size());
  for (size_t i = 0; i < ref.norms.size(); ++i)
    EXPECT_NEAR(got.norms[i], ref.norms[i], 1e-4 * ref.norms[i]) << "gradient norm, step " << i;
  ModelGraph m = build_model(cfg, kBatch, kSeq, ModelMode::train);
  const std::vector<ValueId>& all = m.graph.params();
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, values] : got.params) {
    const size_t i = static_cast<size_t>(
        std::find(all.begin(), all.end(), m.graph.find_param(name)) - all.begin());
    ASSERT_LT(i, ref.params.size()) << name;
    ASSERT_EQ(values.size(), ref.params[i].size()) << name;
    for (size_t k = 0; k < values.size(); ++k)
      if (std::abs(values[k] - ref.params[i][k]) > worst) {
        worst = std::abs(values[k] - ref.params[i][k]);
        worst_name = name;
      }
  }
  EXPECT_LE(worst, 5e-5) << "largest parameter difference, in " << worst_name;
  EXPECT_EQ(got.arena_measured, got.arena_planned) << "stage arena and stash";
  EXPECT_GT(got.p2p_buffer_bytes, 0);
  EXPECT_LE(got.p2p_buffer_bytes, got.p2p_planned) << "send buffers in use, against the plan";
}

}  // namespace tessera::testing_equivalence
