// Activation recomputation: the pass's structure (clones, what the backward reads), its
// effect on the planned arena and on FLOPs, ZeRO-3 gathers for the clones, and the Plan key.
#include "parallel/recompute.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "models/model.h"
#include "parallel/program.h"

namespace tessera {
namespace {

bool is_source(OpKind k) {
  return k == OpKind::parameter || k == OpKind::input || k == OpKind::fill;
}

// An activation of a block as the forward pass produced it.
bool original_activation(const Graph& g, ValueId v) {
  const Node& p = g.producer(v);
  return !p.backward && !p.recompute && p.layer >= 0 && !is_source(p.op);
}

// Reads by backward nodes of original block activations other than the block boundaries (a
// block's output, which is the next block's input: read by a forward node of another layer).
int stray_activation_reads(const Graph& g) {
  std::set<ValueId> boundary;
  for (const Node& n : g.nodes())
    if (!n.backward)
      for (ValueId v : n.inputs)
        if (original_activation(g, v) && g.producer(v).layer != n.layer) boundary.insert(v);
  int stray = 0;
  for (const Node& n : g.nodes())
    if (n.backward)
      for (ValueId v : n.inputs) stray += original_activation(g, v) && !boundary.count(v);
  return stray;
}

Graph recomputed(const Graph& g) {
  Result<Graph> r = apply_recompute(g, RecomputePolicy::full);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : Graph();
}

class RecomputeTest : public testing::TestWithParam<const char*> {};

TEST_P(RecomputeTest, BackwardReadsClonesOnly) {
  ModelGraph m = build_model(*find_preset(GetParam()), 4, 16, ModelMode::train);
  const Graph& g = m.graph;
  Graph r = recomputed(g);
  ASSERT_TRUE(verify(r).ok()) << verify(r).to_string();
  // The original backward reads the block's activations; the recomputed one only the clones.
  EXPECT_GT(stray_activation_reads(g), 0);
  EXPECT_EQ(stray_activation_reads(r), 0);

  size_t last_forward = 0;
  for (size_t i = 0; i < r.nodes().size(); ++i)
    if (!r.nodes()[i].backward && !r.nodes()[i].recompute) last_forward = i;
  std::set<int> layers;
  int clones = 0;
  for (size_t i = 0; i < r.nodes().size(); ++i) {
    const Node& n = r.nodes()[i];
    if (!n.recompute) continue;
    ++clones;
    layers.insert(n.layer);
    EXPECT_FALSE(n.backward);
    EXPECT_FALSE(is_source(n.op)) << op_name(n.op);
    EXPECT_GT(i, last_forward) << "clone %" << i << " is not in the backward pass";
    // A clone reads clones, parameters, fills or other layers' values: never the originals of
    // its own block.
    for (ValueId v : n.inputs)
      EXPECT_FALSE(original_activation(r, v) && r.producer(v).layer == n.layer)
          << "clone %" << i << " at " << n.scope << " reads %" << v;
  }
  EXPECT_EQ(static_cast<int>(layers.size()), static_cast<int>(find_preset(GetParam())->n_layer));
  EXPECT_GT(clones, 10 * static_cast<int>(layers.size()));

  // Parameters, inputs, loss and logits keep their ids; gradients keep their parameters.
  EXPECT_EQ(r.params(), g.params());
  EXPECT_EQ(r.inputs(), g.inputs());
  EXPECT_EQ(r.loss(), g.loss());
  EXPECT_EQ(r.type(m.logits).shape, g.type(m.logits).shape);
  EXPECT_EQ(r.outputs().size(), g.outputs().size());
  ASSERT_EQ(r.param_grads().size(), g.param_grads().size());
  for (auto [p, grad] : r.param_grads()) {
    EXPECT_EQ(r.name_of(p), g.name_of(p));
    EXPECT_EQ(r.type(grad).shape, g.type(p).shape);
    EXPECT_TRUE(r.producer(grad).backward || r.producer(grad).op == OpKind::fill);
  }

  // Extra FLOPs: the blocks' forward pass, less what the backward does not need: the MLP's
  // output projection (its output feeds only the residual add, whose VJP reads no input) and
  // the residual add itself (a few B*T*C).
  double block_forward = 0, not_needed = 0;
  for (const Node& n : g.nodes()) {
    if (n.backward || n.layer < 0) continue;
    block_forward += node_flops(g, n);
    if (n.scope.ends_with(".mlp.proj") || n.scope.ends_with(".mlp.down"))
      not_needed += node_flops(g, n);
  }
  ASSERT_GT(not_needed, 0.1 * block_forward);
  const double extra = r.total_flops() - g.total_flops();
  EXPECT_LE(extra, block_forward - not_needed);
  EXPECT_GE(extra, 0.98 * (block_forward - not_needed));
  EXPECT_EQ(r.forward_flops(), g.forward_flops());

  // Applying it again changes nothing; policy none copies.
  Graph twice = recomputed(r);
  EXPECT_EQ(twice.nodes().size(), r.nodes().size());
  EXPECT_EQ(apply_recompute(g, RecomputePolicy::none).value().nodes().size(), g.nodes().size());
}

TEST_P(RecomputeTest, LowersUnderEveryPlanWithoutFallbacks) {
  ModelGraph m = build_model(*find_preset(GetParam()), 4, 16, ModelMode::train);
  for (Plan plan : {Plan::data_parallel(1), Plan::data_parallel(2), Plan::data_parallel(4, 2),
                    Plan::data_parallel(4, 3), Plan::hybrid_sharded(2, 2)}) {
    plan.recompute = RecomputePolicy::full;
    SCOPED_TRACE(plan.describe());
    Result<Program> p = lower(m.graph, plan);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_TRUE(verify(p.value().local()).ok());
    EXPECT_TRUE(p.value().part.fallbacks.empty()) << p.value().part.fallbacks.front();
    EXPECT_EQ(p.value().part.global_to_local.size(), m.graph.values().size());
    for (size_t i = 0; i < m.graph.params().size(); ++i)
      EXPECT_EQ(p.value().part.params[i].global, m.graph.params()[i]);
    int clones = 0;
    for (const Node& n : p.value().local().nodes()) clones += n.recompute;
    EXPECT_GT(clones, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, RecomputeTest, testing::Values("gpt-tiny", "llama-tiny"));

// Selective: the outputs of matmuls and attention stay where the forward left them; only the
// cheap ops between them (norms, activations, residual adds, reshapes, transposes) are cloned,
// for a few percent more FLOPs.
TEST_P(RecomputeTest, SelectiveClonesOnlyTheCheapOps) {
  ModelGraph m = build_model(*find_preset(GetParam()), 4, 16, ModelMode::train);
  const Graph& g = m.graph;
  Result<Graph> sel = apply_recompute(g, RecomputePolicy::selective);
  ASSERT_TRUE(sel.ok()) << sel.status().to_string();
  const Graph& r = sel.value();
  std::set<int> layers;
  for (const Node& n : r.nodes()) {
    if (!n.recompute) continue;
    layers.insert(n.layer);
    EXPECT_NE(n.op, OpKind::matmul) << n.scope;
    EXPECT_NE(n.op, OpKind::attention) << n.scope;
  }
  EXPECT_EQ(static_cast<int>(layers.size()), static_cast<int>(find_preset(GetParam())->n_layer));
  // The backward reads original activations of its block only where matmul or attention made
  // them (or at block boundaries, as under full).
  for (const Node& n : r.nodes()) {
    if (!n.backward || n.layer < 0) continue;
    for (ValueId v : n.inputs) {
      const Node& p = r.producer(v);
      if (!original_activation(r, v) || p.layer != n.layer) continue;
      EXPECT_TRUE(p.op == OpKind::matmul || p.op == OpKind::attention)
          << n.scope << " reads the original " << op_name(p.op) << " of " << p.scope;
    }
  }
  double block_forward = 0;
  for (const Node& n : g.nodes())
    if (!n.backward && n.layer >= 0) block_forward += node_flops(g, n);
  const double extra = r.total_flops() - g.total_flops();
  EXPECT_GT(extra, 0);
  EXPECT_LT(extra, 0.05 * block_forward);
  EXPECT_LT(extra, recomputed(g).total_flops() - g.total_flops());
}

TEST(Recompute, ZeroThreeClonesReadBackwardGathers) {
  ModelGraph m = build_model(*find_preset("gpt-tiny"), 4, 16, ModelMode::train);
  Plan plan = Plan::data_parallel(2, 3);
  plan.recompute = RecomputePolicy::full;
  Program p = lower(m.graph, plan).value();
  const Graph& l = p.local();
  // Every parameter read by a clone comes from a gather issued for the backward pass, so the
  // forward gathers die with the forward pass.
  int reads = 0;
  for (const Node& n : l.nodes()) {
    for (ValueId v : n.inputs) {
      const Node& src = l.producer(v);
      if (!is_collective(n.op)) {
        EXPECT_NE(src.op, OpKind::parameter) << n.scope << " reads a flat ZeRO-3 block";
      }
      if (!n.recompute || src.op != OpKind::all_gather) continue;
      ++reads;
      EXPECT_TRUE(src.backward) << n.scope << " reads the forward gather %" << v;
    }
  }
  EXPECT_GT(reads, 0);
  // One gather per (parameter, pass): clones read biases in the backward pass, which the
  // backward without recomputation does not, so there are more gathers than without.
  Graph r = recomputed(m.graph);
  std::set<std::pair<ValueId, bool>> uses;
  for (const Node& n : r.nodes())
    for (ValueId v : n.inputs)
      if (r.producer(v).op == OpKind::parameter) uses.insert({v, n.backward || n.recompute});
  int gathers = 0;
  for (const Node& n : l.nodes()) gathers += n.op == OpKind::all_gather;
  EXPECT_EQ(gathers, static_cast<int>(uses.size()));
  plan.recompute = RecomputePolicy::none;
  const Program without = lower(m.graph, plan).value();
  int plain = 0;
  for (const Node& n : without.local().nodes()) plain += n.op == OpKind::all_gather;
  EXPECT_GT(gathers, plain);
}

// Several layers, a sizeable batch and a small vocabulary: activations dominate the arena.
ModelConfig deep_narrow(const char* family) {
  ModelConfig c = *find_preset(std::string(family) == "gpt" ? "gpt-tiny" : "llama-tiny");
  c.vocab_size = 512;
  c.n_layer = 6;
  return c;
}

TEST(Recompute, ShrinksThePlannedArena) {
  for (const char* family : {"gpt", "llama"}) {
    SCOPED_TRACE(family);
    ModelGraph m = build_model(deep_narrow(family), 16, 64, ModelMode::train);
    const int64_t plain = plan_memory(m.graph).arena_bytes;
    const int64_t rec = plan_memory(recomputed(m.graph)).arena_bytes;
    EXPECT_LT(rec, plain);
    EXPECT_LT(static_cast<double>(rec), 0.5 * static_cast<double>(plain))
        << "6 layers: one block's activations plus 6 block inputs instead of 6 blocks";
    for (Plan plan : {Plan::data_parallel(1), Plan::data_parallel(2, 3)}) {
      const int64_t a = lower(m.graph, plan).value().memory.arena_bytes;
      plan.recompute = RecomputePolicy::full;
      const int64_t b = lower(m.graph, plan).value().memory.arena_bytes;
      EXPECT_LT(b, a) << plan.describe();
    }
  }
  // The tiny presets too (two layers, a 50257-word vocabulary).
  for (const char* preset : {"gpt-tiny", "llama-tiny"}) {
    ModelGraph m = build_model(*find_preset(preset), 8, 64, ModelMode::train);
    EXPECT_LT(plan_memory(recomputed(m.graph)).arena_bytes, plan_memory(m.graph).arena_bytes)
        << preset;
  }
}

TEST(Recompute, SelectiveArenaLiesBetweenNoneAndFull) {
  for (const char* family : {"gpt", "llama"}) {
    SCOPED_TRACE(family);
    ModelGraph m = build_model(deep_narrow(family), 16, 64, ModelMode::train);
    const int64_t none = plan_memory(m.graph).arena_bytes;
    const int64_t sel =
        plan_memory(apply_recompute(m.graph, RecomputePolicy::selective).value()).arena_bytes;
    const int64_t full = plan_memory(recomputed(m.graph)).arena_bytes;
    std::printf("%s arena: none %lld, selective %lld, full %lld bytes\n", family, (long long)none,
                (long long)sel, (long long)full);
    EXPECT_LT(sel, none);
    EXPECT_GT(sel, full);
  }
}

// Plan::recompute_layers: only the first N blocks are recomputed; the arena shrinks with N.
TEST(Recompute, FirstLayersOnly) {
  for (const char* family : {"gpt", "llama"}) {
    SCOPED_TRACE(family);
    ModelGraph m = build_model(deep_narrow(family), 16, 64, ModelMode::train);
    const int blocks = deep_narrow(family).n_layer;
    int64_t previous = plan_memory(m.graph).arena_bytes;
    for (int layers = 0; layers <= blocks; ++layers) {
      Result<Graph> g = apply_recompute(m.graph, RecomputePolicy::full, nullptr, layers);
      ASSERT_TRUE(g.ok()) << g.status().to_string();
      std::set<int> cloned;
      for (const Node& n : g->nodes())
        if (n.recompute) cloned.insert(n.layer);
      EXPECT_EQ(static_cast<int>(cloned.size()), layers);
      if (!cloned.empty()) {
        EXPECT_EQ(*cloned.rbegin(), layers - 1);
      }
      const int64_t arena = plan_memory(*g).arena_bytes;
      if (layers == 0) {
        EXPECT_EQ(arena, previous);
      } else {
        EXPECT_LE(arena, previous) << layers << " blocks";
      }
      previous = arena;
    }
    EXPECT_EQ(previous, plan_memory(recomputed(m.graph)).arena_bytes);  // every block: full
    EXPECT_LT(previous, plan_memory(m.graph).arena_bytes);
    Result<Graph> too_many = apply_recompute(m.graph, RecomputePolicy::full, nullptr, blocks + 1);
    ASSERT_FALSE(too_many.ok());
    EXPECT_NE(
        too_many.status().message().find("but the model has " + std::to_string(blocks) + " blocks"),
        std::string::npos)
        << too_many.status().to_string();
  }
}

TEST(Recompute, NeedsATrainingGraph) {
  ModelGraph m = build_model(*find_preset("gpt-tiny"), 2, 8, ModelMode::loss);
  Result<Graph> r = apply_recompute(m.graph, RecomputePolicy::full);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no loss and gradients"), std::string::npos);
}

TEST(PlanRecompute, JsonRoundTripAndOldFiles) {
  Plan p = Plan::data_parallel(4, 3);
  p.recompute = RecomputePolicy::full;
  nlohmann::json j = plan_to_json(p);
  EXPECT_EQ(j.at("recompute"), "full");
  Result<Plan> q = plan_from_json(j);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q.value().recompute, RecomputePolicy::full);
  EXPECT_EQ(q.value().describe(), "dp=4 zero=3 recompute=full");
  EXPECT_EQ(Plan::data_parallel(4, 3).describe(), "dp=4 zero=3");
  // A file written before the key existed.
  j.erase("recompute");
  q = plan_from_json(j);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q.value().recompute, RecomputePolicy::none);
  j["recompute"] = "selective";
  EXPECT_EQ(plan_from_json(j).value().recompute, RecomputePolicy::selective);
  j["recompute"] = "some";
  Status s = plan_from_json(j).status();
  EXPECT_NE(s.message().find("'recompute'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("none, full, selective"), std::string::npos) << s.message();
  EXPECT_FALSE(parse_recompute("FULL").ok());
  // The first N blocks only.
  j["recompute"] = "full";
  j["recompute_layers"] = 12;
  q = plan_from_json(j);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->recompute_layers, 12);
  EXPECT_EQ(plan_to_json(*q).at("recompute_layers"), 12);
  EXPECT_EQ(q->describe(), "dp=4 zero=3 recompute=full (first 12 blocks)");
  j["recompute"] = "none";
  s = plan_from_json(j).status();
  EXPECT_NE(s.message().find("recompute_layers = 12 but recompute is none"), std::string::npos)
      << s.message();
  j["recompute"] = "full";
  j["recompute_layers"] = -3;
  EXPECT_FALSE(plan_from_json(j).ok());
  j["recompute_layers"] = "all";
  s = plan_from_json(j).status();
  EXPECT_NE(s.message().find("'recompute_layers' must be an integer"), std::string::npos)
      << s.message();
  EXPECT_EQ(parse_recompute("none").value(), RecomputePolicy::none);
}

}  // namespace
}  // namespace tessera
