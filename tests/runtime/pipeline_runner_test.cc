// Pipeline plans on in-process ranks (threads over the local transport) against one rank: every
// schedule, uneven cuts, virtual stages, GPT (tied embeddings across the first and last stage)
// and LLaMA, with data and tensor parallelism beside; planned = measured stage memory.
#include "runtime/pipeline_runner.h"

#include <map>
#include <thread>

#include "comm/local_comm.h"
#include "equivalence.h"

namespace tessera {
namespace {

using namespace testing_equivalence;

struct PipeResult {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> params;  // the whole tensors of this stage's chunks
  int64_t arena_planned = 0, arena_measured = 0;
  int64_t p2p_buffer_bytes = 0;
  Status status;
};

PipeResult run_pipeline_rank(Communicator& world, const Plan& plan, int steps,
                             const ModelConfig& cfg) {
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
  auto made = PipelineRunner::create(m.graph, *pp, cpu, *comms, adamw());
  if (!made.ok()) {
    out.status = made.status();
    return out;
  }
  PipelineRunner& step = **made;
  step.init_params(kSeed);
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
    Result<float> loss = step.forward_backward(xs.data(), ys.data());
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
  }
  out.arena_measured = step.measured_arena_bytes();
  out.arena_planned = pp->stage_arena_bytes[static_cast<size_t>(step.stage())];
  out.p2p_buffer_bytes = step.p2p_buffer_bytes();
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

void expect_pipeline_matches(const Plan& plan, const ModelConfig& cfg, int steps = 8) {
  SCOPED_TRACE(plan.describe());
  RunResult ref = run_single(steps, plan.micro_batches, cfg);
  ModelGraph m = build_model(cfg, kBatch, kSeq, ModelMode::train);
  const int n = plan.mesh.size();
  std::vector<std::unique_ptr<Communicator>> comms = make_local_comms(n);
  std::vector<PipeResult> ranks(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      comms[r]->set_timeout(60);
      ranks[size_t(r)] = run_pipeline_rank(*comms[r], plan, steps, cfg);
    });
  for (std::thread& t : threads) t.join();
  std::map<std::string, int> seen;
  for (size_t r = 0; r < ranks.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const PipeResult& got = ranks[r];
    ASSERT_TRUE(got.status.ok()) << got.status.to_string();
    ASSERT_EQ(got.losses.size(), ref.losses.size());
    for (size_t i = 0; i < ref.losses.size(); ++i)
      EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << "step " << i;
    double worst = 0;
    std::string worst_name;
    for (const auto& [name, values] : got.params) {
      const auto& all = m.graph.params();
      const size_t i = static_cast<size_t>(
          std::find(all.begin(), all.end(), m.graph.find_param(name)) - all.begin());
      ASSERT_LT(i, ref.params.size()) << name;
      ASSERT_EQ(values.size(), ref.params[i].size()) << name;
      for (size_t k = 0; k < values.size(); ++k)
        if (std::abs(values[k] - ref.params[i][k]) > worst) {
          worst = std::abs(values[k] - ref.params[i][k]);
          worst_name = name;
        }
      ++seen[name];
    }
    EXPECT_LE(worst, 5e-5) << "largest parameter difference, in " << worst_name;
    EXPECT_EQ(got.arena_measured, got.arena_planned) << "stage arena and stash";
    EXPECT_GT(got.p2p_buffer_bytes, 0);
  }
  EXPECT_EQ(seen.size(), m.graph.params().size()) << "every parameter on some stage";
}

ModelConfig layers(ModelConfig c, int n) {
  c.n_layer = n;
  return c;
}

Plan pipeline(int pp, int dp, int tp, ScheduleKind kind, int micro, int virtual_stages = 1,
              std::vector<int> stage_layers = {}) {
  Plan p = Plan::pipeline_parallel(pp, dp, tp, /*zero=*/dp > 1 ? 1 : 0);
  p.schedule = kind;
  p.micro_batches = micro;
  p.virtual_stages = virtual_stages;
  p.stage_layers = std::move(stage_layers);
  return p;
}

TEST(PipelineRunner, EveryScheduleMatchesOneRank) {
  const ModelConfig gpt = layers(tiny_gpt(), 4);
  expect_pipeline_matches(pipeline(2, 1, 1, ScheduleKind::gpipe, 2), gpt);
  expect_pipeline_matches(pipeline(2, 1, 1, ScheduleKind::one_f_one_b, 4), gpt);
  expect_pipeline_matches(pipeline(2, 1, 1, ScheduleKind::zb_h1, 4), gpt);
  expect_pipeline_matches(pipeline(2, 1, 1, ScheduleKind::interleaved, 4, 2), gpt);
}

TEST(PipelineRunner, UnevenCutsAndLlamaMatchOneRank) {
  expect_pipeline_matches(pipeline(3, 1, 1, ScheduleKind::one_f_one_b, 3, 1, {2, 1, 1}),
                          layers(tiny_gpt(), 4));
  expect_pipeline_matches(pipeline(2, 1, 1, ScheduleKind::one_f_one_b, 4, 1, {1, 2}),
                          layers(tiny_llama(), 3));
  expect_pipeline_matches(pipeline(2, 1, 1, ScheduleKind::zb_h1, 2), layers(tiny_llama(), 2));
}

TEST(PipelineRunner, DataAndTensorParallelStagesMatchOneRank) {
  const ModelConfig gpt = layers(tiny_gpt(), 2);
  expect_pipeline_matches(pipeline(2, 2, 1, ScheduleKind::one_f_one_b, 2), gpt);
  const ModelConfig llama = layers(tiny_llama(), 2);
  expect_pipeline_matches(
      with_megatron_llama(pipeline(2, 1, 2, ScheduleKind::one_f_one_b, 2), llama), llama);
  // 3-D: pp 2 x dp 2 x tp 2, ZeRO-1.
  expect_pipeline_matches(
      with_megatron_llama(pipeline(2, 2, 2, ScheduleKind::one_f_one_b, 2), llama), llama, 4);
}

}  // namespace
}  // namespace tessera
