// Simulating a pipeline (sim/pipeline_sim.cc): the schedule's bubble on the chunks' own times,
// the stages' memory, one trace thread per stage.
#include <gtest/gtest.h>

#include "cost/cluster_spec.h"
#include "models/model.h"
#include "parallel/pipeline_program.h"
#include "sim/simulator.h"

namespace tessera {
namespace {

// Blocks dominate (a small vocabulary), so the stages are near-even and the bubble near the
// formulas of a uniform pipeline.
ModelGraph wide_model() {
  ModelConfig c = *find_preset("gpt-tiny");
  c.n_layer = 8;
  c.n_embd = 1024;
  c.n_head = 16;
  c.vocab_size = 512;
  c.max_seq_len = 512;
  return build_model(c, 8, 512, ModelMode::train);
}

SimResult run(const Graph& g, ScheduleKind kind, int pp, int m, int v = 1) {
  Plan p = Plan::pipeline_parallel(pp, 1, 1, 0);
  p.schedule = kind;
  p.micro_batches = m;
  p.virtual_stages = v;
  Result<ClusterSpec> c = load_cluster("dgx-a100");
  EXPECT_TRUE(c.ok());
  SimOptions o;
  o.precision = DType::bf16;
  o.trace = true;
  Result<SimResult> r = simulate_plan(g, p, c.value(), o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : SimResult{};
}

TEST(PipelineSim, BubbleFollowsTheSchedule) {
  ModelGraph m = wide_model();
  const int p = 4, mb = 8;
  SimResult gpipe = run(m.graph, ScheduleKind::gpipe, p, mb);
  SimResult f1b = run(m.graph, ScheduleKind::one_f_one_b, p, mb);
  SimResult inter = run(m.graph, ScheduleKind::interleaved, p, mb, 2);
  SimResult zb = run(m.graph, ScheduleKind::zb_h1, p, mb);
  const double formula = (p - 1.0) / (mb + p - 1.0);  // 3/11
  std::printf("bubble: gpipe %.3f 1f1b %.3f interleaved %.3f zb-h1 %.3f (1F1B formula %.3f)\n",
              gpipe.bubble_fraction, f1b.bubble_fraction, inter.bubble_fraction, zb.bubble_fraction,
              formula);
  EXPECT_NEAR(f1b.bubble_fraction, formula, 0.05);
  EXPECT_NEAR(gpipe.step_seconds, f1b.step_seconds, 0.02 * f1b.step_seconds);
  EXPECT_LT(inter.bubble_fraction, 0.75 * f1b.bubble_fraction);  // formula: halved
  EXPECT_LT(zb.bubble_fraction, f1b.bubble_fraction);
  EXPECT_LT(zb.step_seconds, f1b.step_seconds);
  EXPECT_GT(f1b.bubble_seconds, 0);
  EXPECT_NEAR(f1b.compute_seconds + f1b.exposed_comm_seconds + f1b.bubble_seconds, f1b.step_seconds,
              1e-9 * f1b.step_seconds);
  // More micro-batches: a smaller bubble.
  SimResult many = run(m.graph, ScheduleKind::one_f_one_b, p, 32);
  EXPECT_LT(many.bubble_fraction, f1b.bubble_fraction);
  EXPECT_NEAR(many.bubble_fraction, (p - 1.0) / (32 + p - 1.0), 0.05);
}

TEST(PipelineSim, StagesMemoryAndTrace) {
  ModelGraph m = wide_model();
  SimResult f1b = run(m.graph, ScheduleKind::one_f_one_b, 4, 8);
  SimResult gpipe = run(m.graph, ScheduleKind::gpipe, 4, 8);
  ASSERT_EQ(f1b.stage_peak_bytes.size(), 4u);
  // 1F1B: stage s keeps 4 - s micro-batches; GPipe all 8 on every stage.
  EXPECT_GT(f1b.stage_peak_bytes[0], f1b.stage_peak_bytes[2]);
  for (size_t s = 0; s < 4; ++s) EXPECT_GT(gpipe.stage_peak_bytes[s], f1b.stage_peak_bytes[s]);
  EXPECT_EQ(f1b.peak_memory_bytes,
            *std::max_element(f1b.stage_peak_bytes.begin(), f1b.stage_peak_bytes.end()));
  int blocks = 0;
  for (int b : f1b.stage_layers) blocks += b;
  EXPECT_EQ(blocks, 8);
  // One trace thread per stage, each with 2 x 8 actions (F and B of each micro-batch).
  ASSERT_EQ(f1b.streams.size(), 4u);
  EXPECT_EQ(f1b.streams[3], "stage 3");
  std::vector<int> per_stage(4, 0);
  for (const TraceEvent& e : f1b.events) ++per_stage[static_cast<size_t>(e.stream)];
  for (int n : per_stage) EXPECT_EQ(n, 16);
  // Tokens: every micro-batch once.
  EXPECT_EQ(f1b.tokens_per_step, 8.0 * 8 * 512);
}

}  // namespace
}  // namespace tessera
