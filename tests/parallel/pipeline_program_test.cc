// Lowering a pipeline plan (parallel/pipeline_program.h): chunks, per-stage memory under the
// schedule, tied parameters, the zb-h1 split of the backward; the plan's pipeline fields.
#include "parallel/pipeline_program.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <numeric>

#include "models/model.h"
#include "parallel/sharding_search.h"

namespace tessera {
namespace {

ModelConfig tiny(const char* preset, int layers) {
  ModelConfig c = *find_preset(preset);
  c.n_layer = layers;
  c.vocab_size = 96;
  return c;
}

Plan pipeline(int pp, ScheduleKind kind, int micro, int dp = 1) {
  Plan p = Plan::pipeline_parallel(pp, dp, 1, 0);
  p.schedule = kind;
  p.micro_batches = micro;
  return p;
}

TEST(PipelineProgram, StagesHoldTheirChunksAndTheScheduleStash) {
  ModelGraph m = build_model(tiny("gpt-tiny", 4), 2, 8, ModelMode::train);
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb_h1}) {
    SCOPED_TRACE(schedule_name(kind));
    Result<PipelineProgram> r = lower_pipeline(m.graph, pipeline(2, kind, 4));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const PipelineProgram& pp = r.value();
    ASSERT_EQ(pp.chunks.size(), 2u);
    EXPECT_EQ(std::accumulate(pp.per_chunk.begin(), pp.per_chunk.end(), 0), 4);
    EXPECT_EQ(pp.chunks[1].first_block, pp.per_chunk[0]);
    // The stash crosses: the residual stream [B, T, C] per micro-batch, sent by chunk 0.
    EXPECT_EQ(pp.chunks[0].send_bytes, 2 * 8 * 64 * 4);
    EXPECT_EQ(pp.chunks[1].send_bytes, 0);
    for (int s = 0; s < 2; ++s) {
      const ChunkProgram& c = pp.chunks[static_cast<size_t>(s)];
      EXPECT_GT(c.stash_bytes, 0);
      EXPECT_LT(c.stash_bytes, c.program.memory.arena_bytes);
      // Phases: forward and backward, and zb-h1's weight gradients apart with a stash of their
      // own. The forward's arena holds no gradients: smaller than the whole micro-step's.
      const size_t phases = kind == ScheduleKind::zb_h1 ? 3 : 2;
      ASSERT_EQ(c.phases.graphs.size(), phases);
      EXPECT_EQ(c.weight_stash_bytes > 0, kind == ScheduleKind::zb_h1);
      int64_t arena = 0;
      EXPECT_LT(c.phase_memory[kForwardPhase].arena_bytes, c.program.memory.arena_bytes);
      for (const MemoryPlan& mp : c.phase_memory) arena = std::max(arena, mp.arena_bytes);
      const size_t st = static_cast<size_t>(s);
      EXPECT_EQ(pp.stage_stash_bytes[st],
                pp.in_flight[st] * c.stash_bytes + pp.weight_in_flight[st] * c.weight_stash_bytes);
      EXPECT_EQ(pp.stage_arena_bytes[st], arena + pp.stage_stash_bytes[st]);
      EXPECT_EQ(pp.stage_persistent_bytes[static_cast<size_t>(s)], c.program.persistent_bytes());
    }
    // 1F1B keeps p - s micro-batches on stage s; zb-h1 min(p, m) (deferred W's keep theirs);
    // GPipe all of them.
    const int want0 = kind == ScheduleKind::gpipe ? 4 : 2;
    const int want1 = kind == ScheduleKind::gpipe ? 4 : kind == ScheduleKind::zb_h1 ? 2 : 1;
    EXPECT_EQ(pp.in_flight[0], want0);
    EXPECT_EQ(pp.in_flight[1], want1);
    // Send buffers: stage 0 sends activations (one buffer per micro-batch it holds in flight),
    // stage 1 their gradients (one per micro-batch stage 0 holds in flight), of one residual
    // stream each.
    EXPECT_EQ(pp.activation_sends[0].slots, want0);
    EXPECT_EQ(pp.activation_sends[0].slot_bytes, 2 * 8 * 64 * 4);
    EXPECT_EQ(pp.gradient_sends[0].slots, 0);
    EXPECT_EQ(pp.activation_sends[1].slots, 0);
    EXPECT_EQ(pp.gradient_sends[1].slots, want0);
    EXPECT_EQ(pp.gradient_sends[1].slot_bytes, 2 * 8 * 64 * 4);
    EXPECT_EQ(pp.stage_p2p_bytes[0], want0 * 2 * 8 * 64 * 4);
    EXPECT_EQ(pp.stage_p2p_bytes[1], want0 * 2 * 8 * 64 * 4);
    // GPT-2's wte is on both stages: its gradient is summed between them.
    EXPECT_EQ(pp.shared_param_bytes, 4 * 96 * 64);
  }
  // LLaMA's head is its own parameter: nothing shared.
  ModelGraph l = build_model(tiny("llama-tiny", 2), 2, 8, ModelMode::train);
  Result<PipelineProgram> r = lower_pipeline(l.graph, pipeline(2, ScheduleKind::one_f_one_b, 2));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->shared_param_bytes, 0);
}

TEST(PipelineProgram, RecomputationShrinksTheStash) {
  ModelGraph m = build_model(tiny("gpt-tiny", 4), 2, 8, ModelMode::train);
  Plan p = pipeline(2, ScheduleKind::one_f_one_b, 4);
  p.stage_layers = {2, 2};
  Result<PipelineProgram> plain = lower_pipeline(m.graph, p);
  p.recompute = RecomputePolicy::full;
  Result<PipelineProgram> full = lower_pipeline(m.graph, p);
  // Only block 0 recomputed (recompute_layers counts from the model's first block).
  p.recompute_layers = 1;
  Result<PipelineProgram> first = lower_pipeline(m.graph, p);
  ASSERT_TRUE(plain.ok() && full.ok() && first.ok());
  EXPECT_LT(full->chunks[0].stash_bytes, plain->chunks[0].stash_bytes);
  EXPECT_LT(full->chunks[1].stash_bytes, plain->chunks[1].stash_bytes);
  EXPECT_LT(first->chunks[0].stash_bytes, plain->chunks[0].stash_bytes);
  EXPECT_GT(first->chunks[0].stash_bytes, full->chunks[0].stash_bytes);
  EXPECT_EQ(first->chunks[1].stash_bytes, plain->chunks[1].stash_bytes);
}

// zb-h1's W part: the weight-gradient matmuls; the input-gradient ones are B.
TEST(PipelineProgram, WeightGradientNodesAreTheBackwardsWPart) {
  ModelGraph m = build_model(tiny("gpt-tiny", 4), 2, 8, ModelMode::train);
  Result<PipelineProgram> r = lower_pipeline(m.graph, pipeline(2, ScheduleKind::zb_h1, 2));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (const ChunkProgram& c : r->chunks) {
    const Graph& g = c.program.local();
    int w = 0, b = 0;
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& n = g.nodes()[i];
      if (!n.backward || n.op != OpKind::matmul || n.layer < 0) continue;
      // A matmul whose output is a parameter's gradient is W.
      bool feeds_param_grad = false;
      for (auto [param, grad] : g.param_grads()) feeds_param_grad |= grad == n.outputs[0];
      if (feeds_param_grad) {
        EXPECT_TRUE(c.weight_grad[i]) << n.scope;
      }
      (c.weight_grad[i] ? w : b) += 1;
    }
    EXPECT_GT(w, 0);
    EXPECT_GT(b, 0);  // dX of every block, including chunk 0's first (the embedding's input)
  }
}

// Gradients are reduced once per step: the gradient collectives are the reduce phase (run on
// the gradients summed over the micro-batches), and the per-micro-batch phases have none.
TEST(PipelineProgram, GradientsAreReducedInAPhaseOfTheirOwn) {
  ModelGraph m = build_model(tiny("gpt-tiny", 2), 4, 8, ModelMode::train);
  for (ScheduleKind kind : {ScheduleKind::one_f_one_b, ScheduleKind::zb_h1}) {
    SCOPED_TRACE(schedule_name(kind));
    Plan plan = pipeline(2, kind, 4, /*dp=*/2);
    plan.zero = 1;
    Result<PipelineProgram> r = lower_pipeline(m.graph, plan);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    for (const ChunkProgram& c : r->chunks) {
      const int last = kind == ScheduleKind::zb_h1 ? kWeightPhase : kBackwardPhase;
      ASSERT_EQ(c.reduce_phase, last + 1);
      ASSERT_EQ(c.phases.graphs.size(), static_cast<size_t>(last + 2));
      int64_t grads = 0, reductions = 0;
      for (const ParamLayout& pl : c.program.part.params) grads += 4 * pl.local_shape.numel();
      for (size_t ph = 0; ph < c.phases.graphs.size(); ++ph)
        for (const Node& n : c.phases.graphs[ph].nodes()) {
          if (!is_collective(n.op) || n.attr<GroupAttrs>().axes != "dp") continue;
          if (static_cast<int>(ph) == c.reduce_phase) {
            ++reductions;
          } else {
            // Only the loss (a scalar, on the last chunk's forward) crosses dp per micro-batch.
            EXPECT_EQ(ph, static_cast<size_t>(kForwardPhase)) << op_name(n.op);
            EXPECT_EQ(c.phases.graphs[ph].type(n.outputs[0]).shape.numel(), 1);
          }
        }
      EXPECT_GT(reductions, 0);
      // The unreduced gradients are summed over the micro-batches in a pool that, once the
      // reduce phase has read them, holds the reduced gradients (every one computed there):
      // one f32 copy of the gradients per rank, not two.
      size_t unreduced = 0;
      for (int64_t at : c.unreduced_offset) unreduced += at >= 0;
      for (int64_t at : c.reduced_grad_offset) EXPECT_GE(at, 0);
      const int64_t align = ChunkProgram::kGradPoolAlign;
      EXPECT_GE(c.grad_pool_bytes, grads);
      EXPECT_LE(c.grad_pool_bytes,
                grads + align * static_cast<int64_t>(c.program.part.params.size() + unreduced));
      EXPECT_EQ(c.program.param_bytes + c.program.optim_bytes + c.grad_pool_bytes,
                r->stage_persistent_bytes[&c - r->chunks.data()]);
    }
  }
  // Nothing to reduce on one data-parallel rank: no reduce phase.
  Result<PipelineProgram> one = lower_pipeline(m.graph, pipeline(2, ScheduleKind::one_f_one_b, 4));
  ASSERT_TRUE(one.ok());
  for (const ChunkProgram& c : one->chunks) EXPECT_EQ(c.reduce_phase, -1);
}

TEST(PipelineProgram, BadCutsAndSchedulesAreErrors) {
  ModelGraph m = build_model(tiny("gpt-tiny", 4), 2, 8, ModelMode::train);
  Plan p = pipeline(2, ScheduleKind::one_f_one_b, 4);
  p.stage_layers = {1, 2};
  Result<PipelineProgram> r = lower_pipeline(m.graph, p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("sum to 3 blocks, but the model has 4"), std::string::npos)
      << r.status().to_string();
  Plan five = pipeline(5, ScheduleKind::one_f_one_b, 5);
  EXPECT_FALSE(lower_pipeline(m.graph, five).ok());  // 5 chunks, 4 blocks
  Plan inter = pipeline(2, ScheduleKind::interleaved, 3);
  inter.virtual_stages = 2;
  r = lower_pipeline(m.graph, inter);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("multiple"), std::string::npos) << r.status().to_string();
  inter.micro_batches = 4;
  r = lower_pipeline(m.graph, inter);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->chunks.size(), 4u);  // one block each; chunk k on stage k % 2
  EXPECT_EQ(stage_of_chunk(*r, 3), 1);
}

TEST(PipelinePlan, JsonRoundTripAndRefusals) {
  Plan p = Plan::pipeline_parallel(4, 2, 2, 1);
  p.schedule = ScheduleKind::interleaved;
  p.virtual_stages = 2;
  p.stage_layers = {1, 2, 2, 1, 1, 2, 2, 1};
  p.micro_batches = 8;
  ASSERT_TRUE(validate(p, 16).ok()) << validate(p, 16).to_string();
  EXPECT_EQ(p.chunks(), 8);
  EXPECT_EQ(p.describe(),
            "pp=4 x dp=2 x tp=2 zero=1 micro_batches=8 schedule=interleaved virtual_stages=2 "
            "stage_layers=1,2,2,1,1,2,2,1");
  Result<Plan> back = plan_from_json(plan_to_json(p));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->pipeline_axis, "pp");
  EXPECT_EQ(back->schedule, ScheduleKind::interleaved);
  EXPECT_EQ(back->virtual_stages, 2);
  EXPECT_EQ(back->stage_layers, p.stage_layers);
  // The gradient norm is summed over the stages too.
  EXPECT_EQ(p.grad_norm_axes(), (std::vector<std::string>{"pp", "dp", "tp"}));

  auto refused = [](Plan q, const char* what) {
    Status s = validate(q);
    ASSERT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.to_string();
  };
  Plan z = Plan::pipeline_parallel(2, 2, 1, 3);
  refused(z, "ZeRO-3 with pipeline parallelism is refused");
  z.zero = 2;
  refused(z, "ZeRO-2 with pipeline parallelism is refused");
  Plan v = Plan::pipeline_parallel(2, 1, 1);
  v.virtual_stages = 2;
  refused(v, "needs the interleaved schedule");
  Plan l = Plan::pipeline_parallel(2, 1, 1);
  l.stage_layers = {1, 1, 1};
  refused(l, "lists 3 chunks but the pipeline has 2");
  nlohmann::json j = plan_to_json(Plan::pipeline_parallel(2, 1, 1));
  j["schedule"] = "zigzag";
  Result<Plan> bad = plan_from_json(j);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("key 'schedule'"), std::string::npos);
}

// Stages are balanced by what one rank of the tensor group computes: a block's FLOPs split
// over the tensor ranks, and an LM head whose vocabulary the group does not divide computed
// whole on every rank (vocab 97 over tp 2), but split once the vocabulary is padded (98).
TEST(PipelineProgram, StagesAreCostedOnOneRankOfTheTensorGroup) {
  for (int64_t rows : {int64_t{97}, int64_t{98}}) {
    ModelConfig c = tiny("gpt-tiny", 4);
    c.vocab_size = 97;
    c.padded_vocab_size = rows == 97 ? 0 : rows;
    ModelGraph m = build_model(c, 2, 8, ModelMode::train);
    Plan plan = Plan::pipeline_parallel(2, 1, 2, 0);
    plan.micro_batches = 2;
    ASSERT_TRUE(place_tensor_parallel(c, 2, 8, m.graph, SearchCost{0}, &plan).ok());
    const LayerCosts global =
        layer_costs(m.graph, [&](const Node& n) { return node_flops(m.graph, n); });
    Result<LayerCosts> rank = rank_layer_flops(m.graph, plan);
    ASSERT_TRUE(rank.ok()) << rank.status().to_string();
    ASSERT_EQ(rank->block.size(), global.block.size());
    for (size_t b = 0; b < global.block.size(); ++b)
      EXPECT_NEAR(rank->block[b] / global.block[b], 0.5, 0.1) << "block " << b;
    // The head and loss: mostly whole on each rank (the norm and loss ops around the head
    // matmul split partly), or half with the padded vocabulary.
    const double after = rank->after / global.after;
    if (rows == 97) {
      EXPECT_GT(after, 0.8) << "the replicated head";
    } else {
      EXPECT_NEAR(after, 0.5, 0.1) << "the vocab-parallel head";
    }
    Result<PipelineProgram> pp = lower_pipeline(m.graph, plan);
    ASSERT_TRUE(pp.ok()) << pp.status().to_string();
    EXPECT_EQ(pp->per_chunk, balance_stages(rank.value(), 2).value());
  }
}

}  // namespace
}  // namespace tessera
