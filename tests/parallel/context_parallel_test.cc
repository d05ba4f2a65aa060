// Context parallelism (Plan::context_axis): the partition of a LLaMA step whose sequences are
// split over a "cp" axis.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "models/model.h"
#include "parallel/program.h"

namespace tessera {
namespace {

// Every op runs on its chunk of the sequence (no fallback gathers anything); each attention
// gathers its keys and values over cp, again in the backward pass, and reduce-scatters their
// gradients; the parameters' gradients and the loss are all-reduced over cp; and the
// activations shrink.
TEST(ContextParallel, LlamaSplitsEverySequenceAndGathersOnlyKeysAndValues) {
  const ModelConfig c = *find_preset("llama-tiny");
  const int64_t B = 2, T = 64;
  ModelGraph m = build_model(c, B, T, ModelMode::train);
  Plan plan = Plan::data_parallel(1);
  ASSERT_TRUE(add_context_axis(&plan, 2).ok());
  EXPECT_EQ(plan.describe(), "dp=1 x cp=2 zero=0 context-parallel");
  Result<Program> p = lower(m.graph, plan);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_TRUE(p->part.fallbacks.empty()) << p->part.fallbacks.front();
  std::map<std::string, int> attention;  // "<op> <axes>" of the collectives in attention scopes
  int grad_reductions = 0, other = 0;
  for (const Node& n : p->part.local.nodes()) {
    if (!is_collective(n.op)) continue;
    const std::string key = std::string(op_name(n.op)) + " " + n.attr<GroupAttrs>().axes;
    if (n.scope.size() > 5 && n.scope.compare(n.scope.size() - 5, 5, ".attn") == 0) {
      ++attention[key];
    } else if (key == "all_reduce cp") {
      ++grad_reductions;
    } else {
      ++other;
    }
  }
  const int layers = static_cast<int>(c.n_layer);
  EXPECT_EQ(attention["all_gather cp"], 4 * layers);      // k and v, forward and backward
  EXPECT_EQ(attention["reduce_scatter cp"], 2 * layers);  // dk and dv
  EXPECT_EQ(attention.size(), 2u);
  EXPECT_EQ(grad_reductions, static_cast<int>(m.graph.params().size()) + 1);  // and the loss
  EXPECT_EQ(other, 0);
  // Each rank's token inputs and every [B, T, ...] activation hold half the sequence.
  const ValueId tokens = p->part.local.find_input(kTokensInput);
  EXPECT_EQ(p->part.local.type(tokens).shape, (Shape{B, T / 2}));
  Result<Program> one = lower(m.graph, Plan::data_parallel(1));
  ASSERT_TRUE(one.ok());
  EXPECT_LT(p->memory.arena_bytes, one->memory.arena_bytes * 0.8);
}

// Ring attention (Plan::context_attention ring): no all-gather or reduce-scatter in attention;
// over n ranks each attention shifts its keys and values n - 1 times in the forward pass, again
// in the backward pass, where the key and value gradient sums take n more shifts each; the plan
// file names it, and an unknown form is refused by name.
TEST(ContextParallel, RingAttentionPassesChunksRoundTheRanks) {
  const ModelConfig c = *find_preset("llama-tiny");
  ModelGraph m = build_model(c, 2, 64, ModelMode::train);
  Plan plan = Plan::data_parallel(1);
  ASSERT_TRUE(add_context_axis(&plan, 4).ok());
  plan.context_attention = ContextAttention::ring;
  EXPECT_EQ(plan.describe(), "dp=1 x cp=4 zero=0 context-parallel (ring)");
  Result<Program> p = lower(m.graph, plan);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  std::map<std::string, int> attention;
  int merges = 0;
  for (const Node& n : p->part.local.nodes()) {
    merges += n.op == OpKind::attention_merge;
    if (!is_collective(n.op) || n.scope.size() < 5 ||
        n.scope.compare(n.scope.size() - 5, 5, ".attn") != 0)
      continue;
    ++attention[std::string(op_name(n.op)) + " " + n.attr<GroupAttrs>().axes];
  }
  const int layers = static_cast<int>(c.n_layer), n = 4;
  EXPECT_EQ(attention["ring_shift cp"], layers * (2 * (n - 1) + 2 * (n - 1) + 2 * n));
  EXPECT_EQ(attention.size(), 1u);
  EXPECT_EQ(merges, layers * (n - 1));
  // Two chunks of keys and values in hand, not the sequence: a smaller arena than gathering.
  Plan gather = plan;
  gather.context_attention = ContextAttention::gather;
  Result<Program> g = lower(m.graph, gather);
  ASSERT_TRUE(g.ok());
  EXPECT_LE(p->memory.arena_bytes, g->memory.arena_bytes);
  Result<Plan> back = plan_from_json(plan_to_json(plan));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->context_attention, ContextAttention::ring);
  nlohmann::json bad = plan_to_json(plan);
  bad["context_attention"] = "allgather";
  EXPECT_NE(plan_from_json(bad).status().message().find("'allgather' is not one of: gather, ring"),
            std::string::npos);
}

// A plan file names the context axis and its order; ZeRO shards over it; a sequence that does not
// split, a zigzag order over a learned position table, T5's biased attention, a second context
// axis and a context axis with pipeline stages are refused by name.
TEST(ContextParallel, PlansNameTheAxisAndRefuseWhatDoesNotSplit) {
  Plan plan = Plan::tensor_parallel(2, 2);
  ASSERT_TRUE(add_context_axis(&plan, 2).ok());
  EXPECT_EQ(plan.mesh.to_string(), "{dp: 2, cp: 2, tp: 2}");  // tp innermost
  // ZeRO shards over the context ranks too: they hold replicas of the parameters.
  EXPECT_EQ(plan.zero_axes, (std::vector<std::string>{"dp", "cp"}));
  plan.context_order = ContextOrder::zigzag;
  Result<Plan> back = plan_from_json(plan_to_json(plan));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->context_axis, "cp");
  EXPECT_EQ(back->context_group(), 2);
  EXPECT_EQ(back->context_order, ContextOrder::zigzag);
  nlohmann::json bad = plan_to_json(plan);
  bad["context_order"] = "ring";
  EXPECT_NE(plan_from_json(bad).status().message().find("'ring' is not one of"), std::string::npos);
  EXPECT_NE(add_context_axis(&plan, 2).message().find("already"), std::string::npos);
  ModelGraph m = build_model(*find_preset("llama-tiny"), 2, 63, ModelMode::train);
  Plan cp = Plan::data_parallel(1);
  ASSERT_TRUE(add_context_axis(&cp, 2).ok());
  Result<Program> odd = lower(m.graph, cp);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("sequence length 63 does not split over 2"),
            std::string::npos)
      << odd.status().to_string();
  // Zigzag halves: 62 tokens split over 2 ranks but not into 4 halves; GPT's learned position
  // table cannot follow the permuted order.
  cp.context_order = ContextOrder::zigzag;
  Result<Program> halves =
      lower(build_model(*find_preset("llama-tiny"), 2, 62, ModelMode::train).graph, cp);
  ASSERT_FALSE(halves.ok());
  EXPECT_NE(halves.status().message().find("in 2 x 2 zigzag halves"), std::string::npos)
      << halves.status().to_string();
  Result<Program> gpt =
      lower(build_model(*find_preset("gpt-tiny"), 2, 64, ModelMode::train).graph, cp);
  ASSERT_FALSE(gpt.ok());
  EXPECT_NE(gpt.status().message().find("'wpe' is a learned position table"), std::string::npos)
      << gpt.status().to_string();
  cp.context_order = ContextOrder::contiguous;
  Result<Program> t5 =
      lower(build_model(*find_preset("t5-tiny"), 2, 40, ModelMode::train).graph, cp);
  ASSERT_FALSE(t5.ok());
  EXPECT_NE(t5.status().message().find("attention with a position bias"), std::string::npos)
      << t5.status().to_string();
  // With pipeline stages: the context axis inside the pipeline's (pp x dp x cp).
  Plan pp = Plan::pipeline_parallel(2, 1, 1);
  ASSERT_TRUE(add_context_axis(&pp, 2).ok());
  EXPECT_TRUE(validate(pp, 4).ok()) << validate(pp, 4).to_string();
  EXPECT_EQ(pp.describe().rfind("pp=2 x dp=1 x cp=2", 0), 0u) << pp.describe();
}

}  // namespace
}  // namespace tessera
