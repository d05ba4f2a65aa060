// Pipeline plans on in-process ranks (threads over the local transport) against one rank: every
// schedule, uneven cuts, virtual stages, GPT (tied embeddings across the first and last stage)
// and LLaMA, with data and tensor parallelism beside, in f32, bf16 and fp16; planned = measured
// stage memory.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>

#include "comm/local_comm.h"
#include "opaque_backend.h"
#include "pipeline_equivalence.h"

namespace tessera {
namespace {

using namespace testing_equivalence;

// Runs every rank of `plan` on in-process threads (fp16: from `loss_scale` where > 0).
std::vector<PipeResult> run_pipeline(const Plan& plan, const ModelConfig& cfg, int steps,
                                     double loss_scale = 0) {
  const int n = plan.mesh.size();
  std::vector<std::unique_ptr<Communicator>> comms = make_local_comms(n);
  std::vector<PipeResult> ranks(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      comms[r]->set_timeout(60);
      ranks[size_t(r)] = run_pipeline_rank(*comms[r], plan, steps, cfg, nullptr, loss_scale);
    });
  for (std::thread& t : threads) t.join();
  return ranks;
}

void expect_pipeline_matches(const Plan& plan, const ModelConfig& cfg, int steps = 8) {
  SCOPED_TRACE(plan.describe());
  RunResult ref = run_single(steps, plan.micro_batches, cfg);
  ModelGraph m = build_model(cfg, kBatch, kSeq, ModelMode::train);
  const std::vector<PipeResult> ranks = run_pipeline(plan, cfg, steps);
  std::map<std::string, int> seen;
  for (size_t r = 0; r < ranks.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    expect_pipeline_equivalent(ref, ranks[r], cfg);
    for (const auto& [name, values] : ranks[r].params) ++seen[name];
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
  // Three chunks per stage (the planner tries every count that cuts a stage's blocks evenly).
  expect_pipeline_matches(pipeline(2, 1, 1, ScheduleKind::interleaved, 4, 3), layers(gpt, 6));
}

// Stages on memory the host cannot address: activations and gradients cross stages through
// host messages copied in and out by the backend, stash slots are backend buffers, the tied
// embedding's gradient is summed through host copies; every rank equals its CPU run bit for
// bit (1F1B and zero-bubble, pp 2 x dp 2 with ZeRO-1).
TEST(PipelineRunner, StagesRunOnMemoryTheHostCannotAddress) {
  const ModelConfig gpt = layers(tiny_gpt(), 4);
  for (const Plan& plan : {pipeline(2, 1, 1, ScheduleKind::one_f_one_b, 4),
                           pipeline(2, 2, 1, ScheduleKind::zb_h1, 4)}) {
    SCOPED_TRACE(plan.describe());
    const int n = plan.mesh.size();
    std::vector<PipeResult> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    for (bool opaque_memory : {false, true}) {
      std::vector<std::unique_ptr<Communicator>> comms = make_local_comms(n);
      std::vector<std::thread> threads;
      for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
          OpaqueBackend opaque;
          (opaque_memory ? got : want)[size_t(r)] =
              run_pipeline_rank(*comms[r], plan, 3, gpt, opaque_memory ? &opaque : nullptr);
        });
      for (std::thread& t : threads) t.join();
    }
    for (int r = 0; r < n; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      ASSERT_TRUE(got[size_t(r)].status.ok()) << got[size_t(r)].status.to_string();
      EXPECT_EQ(got[size_t(r)].losses, want[size_t(r)].losses);
      EXPECT_EQ(got[size_t(r)].norms, want[size_t(r)].norms);
      EXPECT_EQ(got[size_t(r)].params, want[size_t(r)].params);
      EXPECT_EQ(got[size_t(r)].arena_measured, want[size_t(r)].arena_measured);
    }
  }
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

// Sequence parallelism inside the stages: each tensor-parallel rank sends and receives its
// piece of the sequence (the boundary rows split over tp as well as dp), the middle chunks of
// an interleaved pipeline included.
TEST(PipelineRunner, SequenceParallelStagesMatchOneRank) {
  const ModelConfig llama = layers(tiny_llama(), 4);
  Plan sp = with_megatron_llama(pipeline(2, 1, 2, ScheduleKind::interleaved, 2, 2), llama);
  sp.sequence_parallel = true;
  expect_pipeline_matches(sp, llama);
  Plan sp3d = with_megatron_llama(pipeline(2, 2, 2, ScheduleKind::one_f_one_b, 2), llama);
  sp3d.sequence_parallel = true;
  expect_pipeline_matches(sp3d, llama, 4);
}

// The low-precision cases: GPT (its tied embedding on the first and last stage) under 1F1B,
// interleaved and zb-h1 with ZeRO-1 over dp 2 (the masters synced), and LLaMA with tp 2.
struct LowPrecisionCase {
  Plan plan;
  ModelConfig cfg;
};
std::vector<LowPrecisionCase> low_precision_cases(DType dtype) {
  ModelConfig gpt = layers(tiny_gpt(), 4);
  ModelConfig llama = layers(tiny_llama(), 2);
  gpt.dtype = llama.dtype = dtype;
  return {{pipeline(2, 1, 1, ScheduleKind::one_f_one_b, 4), gpt},
          {pipeline(2, 1, 1, ScheduleKind::interleaved, 4, 2), gpt},
          {pipeline(2, 2, 1, ScheduleKind::zb_h1, 2), gpt},
          {with_megatron_llama(pipeline(2, 1, 2, ScheduleKind::one_f_one_b, 2), llama), llama}};
}

// Every rank of case c for `steps` against one rank of the same precision: the losses and
// norms within 2e-4 and 5e-3 (relative), the stage arena planned to the byte. Returns the ranks.
std::vector<PipeResult> expect_follows_one_rank(const LowPrecisionCase& c, int steps) {
  const RunResult ref = run_single(steps, c.plan.micro_batches, c.cfg);
  std::vector<PipeResult> got = run_pipeline(c.plan, c.cfg, steps);
  double worst_loss = 0, worst_norm = 0;
  for (size_t r = 0; r < got.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const PipeResult& g = got[r];
    EXPECT_TRUE(g.status.ok()) << g.status.to_string();
    EXPECT_EQ(g.losses.size(), ref.losses.size());
    for (size_t i = 0; i < std::min(ref.losses.size(), g.losses.size()); ++i) {
      worst_loss = std::max(worst_loss, std::abs(g.losses[i] / ref.losses[i] - 1.0));
      worst_norm = std::max(worst_norm, std::abs(g.norms[i] / ref.norms[i] - 1.0));
    }
    EXPECT_EQ(g.arena_measured, g.arena_planned) << "stage arena and stash";
    EXPECT_LE(g.p2p_buffer_bytes, g.p2p_planned);
  }
  if (std::getenv("TESSERA_VERBOSE"))
    std::printf("%s %s: losses within %.2e, norms within %.2e of one rank\n",
                dtype_name(c.cfg.dtype), c.plan.describe().c_str(), worst_loss, worst_norm);
  EXPECT_LT(worst_loss, 2e-4) << "losses against the one-rank run of the same precision";
  EXPECT_LT(worst_norm, 5e-3) << "gradient norms against the one-rank run of the same precision";
  return got;
}

// bf16 stages: bf16 parameters, activations and gradients (sent between stages as stored), f32
// master weights and AdamW state on each stage, each micro-batch's gradients summed in f32
// (rounded to bf16 once before a data- or tensor-parallel reduction). The losses and norms
// follow the one-rank bf16 run (the same arithmetic but for where the tied embedding's two
// gradients and the micro-batches' sums are rounded), the stage arena is planned to the
// byte and is about half the f32 stage's.
TEST(PipelineRunner, Bf16StagesFollowOneRankBf16) {
  for (const LowPrecisionCase& c : low_precision_cases(DType::bf16)) {
    SCOPED_TRACE(c.plan.describe() + " " + c.cfg.family);
    ModelConfig f32 = c.cfg;
    f32.dtype = DType::f32;
    const std::vector<PipeResult> full = run_pipeline(c.plan, f32, 1);
    const std::vector<PipeResult> got = expect_follows_one_rank(c, 6);
    for (size_t r = 0; r < got.size(); ++r)
      EXPECT_LT(got[r].arena_planned, 0.6 * full[r].arena_planned)
          << "rank " << r << ": bf16 against f32 stage arena";
  }
}

// fp16 stages: one dynamic loss scale for the whole pipeline. The last stage seeds its loss
// with it, the gradients crossing stages carry it, and the norm over every stage decides: the
// losses and norms follow one fp16 rank (whose scale they keep, 2^16). A scale too large for
// the gradients overflows them on some stage and skips the step on every stage (no update, the
// scale halved on each), and the run goes on from there.
TEST(PipelineRunner, Fp16StagesShareOneLossScale) {
  for (const LowPrecisionCase& c : low_precision_cases(DType::f16)) {
    SCOPED_TRACE(c.plan.describe() + " " + c.cfg.family);
    for (const PipeResult& g : expect_follows_one_rank(c, 6))
      for (size_t i = 0; i < g.loss_scales.size(); ++i) {
        EXPECT_EQ(g.loss_scales[i], 65536.0) << "step " << i;
        EXPECT_FALSE(g.skipped[i]) << "step " << i;
      }
  }
  const ModelConfig gpt = low_precision_cases(DType::f16)[0].cfg;
  // 2^40: the scaled gradients overflow fp16 (65,504), on the last stage first.
  const Plan plan = pipeline(2, 1, 1, ScheduleKind::one_f_one_b, 4);
  const std::vector<PipeResult> init = run_pipeline(plan, gpt, 0);
  const std::vector<PipeResult> over = run_pipeline(plan, gpt, 2, std::ldexp(1.0, 40));
  for (size_t r = 0; r < over.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_TRUE(over[r].status.ok()) << over[r].status.to_string();
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(over[r].skipped[i]) << "step " << i;
      EXPECT_EQ(over[r].norms[i], 0.0) << "step " << i;
      EXPECT_EQ(over[r].loss_scales[i], std::ldexp(1.0, 39 - static_cast<int>(i))) << i;
    }
    EXPECT_EQ(over[r].params, init[r].params) << "no stage updated";
  }
}

TEST(PipelineProgram, SequenceParallelStagesSendTheirSequencePiece) {
  const ModelConfig llama = layers(tiny_llama(), 2);
  ModelGraph m = build_model(llama, kBatch, kSeq, ModelMode::train);
  Plan plan = with_megatron_llama(pipeline(2, 1, 2, ScheduleKind::one_f_one_b, 2), llama);
  Result<PipelineProgram> whole = lower_pipeline(m.graph, plan);
  plan.sequence_parallel = true;
  Result<PipelineProgram> split = lower_pipeline(m.graph, plan);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  ASSERT_TRUE(split.ok()) << split.status().to_string();
  EXPECT_GT(whole->chunks[0].send_bytes, 0);
  EXPECT_EQ(split->chunks[0].send_bytes * 2, whole->chunks[0].send_bytes);
}

}  // namespace
}  // namespace tessera
