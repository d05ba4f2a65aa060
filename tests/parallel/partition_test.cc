// The partition pass and Program lowering: local shapes, inserted collectives, persistent
// bytes per rank and analytic communication bytes for the data-axis strategies.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "models/model.h"
#include "parallel/program.h"

namespace tessera {
namespace {

ModelGraph tiny(const char* preset, int64_t batch = 4, int64_t seq = 16) {
  ModelConfig c = *find_preset(preset);
  return build_model(c, batch, seq, ModelMode::train);
}

int count_ops(const Graph& g, OpKind k) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.op == k;
  return n;
}

int64_t grad_bytes(const Graph& g) {
  int64_t b = 0;
  for (ValueId p : g.params()) b += g.type(p).bytes();
  return b;
}

TEST(Plan, TensorAxesAndPlacementsRoundTripAndBadOnesAreNamed) {
  Plan p = Plan::tensor_parallel(2, 4, 3);
  p.params["h.0.mlp.up.weight"] = {Placement::replicate(), Placement::shard(0)};
  Result<Plan> q = plan_from_json(plan_to_json(p));
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(plan_to_json(q.value()), plan_to_json(p));
  EXPECT_EQ(q->tensor_axes, std::vector<std::string>{"tp"});
  EXPECT_EQ(q->params.at("h.0.mlp.up.weight")[1], Placement::shard(0));
  EXPECT_EQ(q->placements_of("h.0.mlp.down.weight")[1], Placement::replicate());
  const std::string mesh = R"("mesh": [{"name": "dp", "size": 2}, {"name": "tp", "size": 2}])";
  const std::pair<const char*, const char*> bad[] = {
      {R"j("params": 5)j", "must be an object"},
      {R"j("params": {"w": {"xx": "S(0)"}})j", "names axis 'xx'"},
      {R"j("params": {"w": {"tp": "Q(1)"}})j", "placement 'Q(1)' is not R, P or S(dim)"},
      {R"j("params": {"w": {"tp": 3}})j", "must be a string"},
      {R"j("params": {"w": {"tp": "P"}})j", "is Partial on 'tp'"},
      {R"j("params": {"w": {"dp": "S(0)"}})j", "sharded on data axis 'dp'"},
      {R"j("tensor_axes": ["dp"])j", "both a data and a tensor axis"},
  };
  for (const auto& [text, why] : bad) {
    Result<Plan> r = plan_from_json(nlohmann::json::parse("{" + mesh + ", " + text + "}"));
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
  }
  // A placement naming a parameter the model does not have.
  Plan unknown = Plan::tensor_parallel(1, 2);
  unknown.params["h.0.nope.weight"] = {Placement::replicate(), Placement::shard(0)};
  Result<Program> l = lower(tiny("llama-tiny").graph, unknown);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("'h.0.nope.weight' is not in the model"), std::string::npos);
}

TEST(Plan, JsonRoundTrip) {
  Plan p = Plan::hybrid_sharded(2, 4);
  p.micro_batches = 3;
  p.prefetch_bytes = 12345;
  Result<Plan> q = plan_from_json(plan_to_json(p));
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(plan_to_json(q.value()), plan_to_json(p));
  EXPECT_EQ(q.value().mesh.size(), 8);
  EXPECT_EQ(q.value().zero_group(), 4);
  EXPECT_EQ(q.value().describe(), "dp_rep=2 x dp_shard=4 zero=3 (HSDP) micro_batches=3");
}

TEST(Plan, BadPlansNameTheProblem) {
  nlohmann::json j = plan_to_json(Plan::data_parallel(4));
  j["zeroo"] = 1;
  EXPECT_NE(plan_from_json(j).status().message().find("unknown key 'zeroo'"), std::string::npos);
  j = plan_to_json(Plan::data_parallel(4));
  j["zero"] = 5;
  EXPECT_NE(plan_from_json(j).status().message().find("zero stage 5"), std::string::npos);
  j = plan_to_json(Plan::data_parallel(4));
  j["zero_axes"] = {"tp"};
  EXPECT_NE(plan_from_json(j).status().message().find("'tp' is not a mesh axis"),
            std::string::npos);
  // An axis of another name has no role by default (it is not silently a data axis).
  j = plan_to_json(Plan::data_parallel(4));
  j["mesh"] = {{{"name", "dp"}, {"size", 2}}, {{"name", "xp"}, {"size", 2}}};
  j.erase("data_axes");
  j.erase("zero_axes");
  j.erase("tensor_axes");
  EXPECT_NE(plan_from_json(j).status().message().find(
                "mesh axis 'xp' is neither a data, a tensor, the pipeline nor the context axis"),
            std::string::npos)
      << plan_from_json(j).status().message();
  // A value of the wrong JSON type names the key and what it takes.
  j = plan_to_json(Plan::data_parallel(4));
  j["mesh"] = 5;
  EXPECT_EQ(plan_from_json(j).status().message(),
            "plan: key 'mesh' must be a list of {\"name\": ..., \"size\": ...}, got 5");
  j = plan_to_json(Plan::data_parallel(4));
  j["zero"] = "three";
  EXPECT_EQ(plan_from_json(j).status().message(),
            "plan: key 'zero' must be an integer 0-3, got \"three\"");
  Status s = validate(Plan::data_parallel(4), 2);
  EXPECT_NE(s.message().find("has 4 ranks but the job has 2"), std::string::npos);
  EXPECT_NE(s.hint().find("tessera launch -n 4"), std::string::npos) << s.hint();
}

// Sizes and counts are integers in range, never truncated (2.5 ranks, 1e18 ranks), and a plan
// names its mesh (review bad-inputs-7d08d5e N10).
TEST(Plan, NumbersAreReadStrictlyAndTheMeshIsRequired) {
  const std::pair<nlohmann::json, std::string> bad[] = {
      {nlohmann::json::parse(R"([{"name": "dp", "size": 2.5}])"),
       "plan: key 'mesh' takes an integer from 1 to 2147483647, got "
       "[{\"name\":\"dp\",\"size\":2.5}]"},
      {nlohmann::json::parse(R"([{"name": "dp", "size": 1000000000000000000}])"),
       "plan: key 'mesh' takes an integer from 1 to 2147483647, got "
       "[{\"name\":\"dp\",\"size\":1000000000000000000}]"},
      {nlohmann::json::parse(R"([{"name": "dp", "size": 0}])"),
       "plan: key 'mesh' takes an integer from 1 to 2147483647, got "
       "[{\"name\":\"dp\",\"size\":0}]"}};
  for (const auto& [mesh, message] : bad) {
    nlohmann::json j = plan_to_json(Plan::data_parallel(2));
    j["mesh"] = mesh;
    EXPECT_EQ(plan_from_json(j).status().message(), message);
  }
  nlohmann::json j = plan_to_json(Plan::data_parallel(2));
  j["micro_batches"] = 1.5;
  EXPECT_EQ(plan_from_json(j).status().message(),
            "plan: key 'micro_batches' takes an integer from 1 to 2147483647, got 1.5");
  j = plan_to_json(Plan::data_parallel(2));
  j["bucket_bytes"] = 1e30;
  EXPECT_NE(plan_from_json(j).status().message().find("key 'bucket_bytes' takes an integer"),
            std::string::npos);
  j = plan_to_json(Plan::data_parallel(2));
  j.erase("mesh");
  EXPECT_EQ(plan_from_json(j).status().message(), "plan: key 'mesh' is missing");
}

// A directory given as the plan file is one error naming it (it aborted reading it, N3).
TEST(Plan, ADirectoryIsNotAPlanFile) {
  const std::string dir = ::testing::TempDir() + "plan_dir.json";
  std::filesystem::create_directories(dir);
  Result<Plan> r = load_plan(dir);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "plan: cannot read '" + dir + "': Is a directory");
  EXPECT_NE(r.status().hint().find("names a directory"), std::string::npos);
}

TEST(Plan, SequenceParallelRoundTripsAndNeedsATensorAxis) {
  Plan p = Plan::tensor_parallel(2, 4);
  p.sequence_parallel = true;
  Result<Plan> q = plan_from_json(plan_to_json(p));
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_TRUE(q->sequence_parallel);
  EXPECT_EQ(q->describe(), "dp=2 x tp=4 zero=0 sequence-parallel");
  Plan d = Plan::data_parallel(4);
  d.sequence_parallel = true;
  EXPECT_NE(validate(d).message().find("sequence parallelism needs a tensor axis"),
            std::string::npos);
}

// gpt2-small's blocks in Megatron's layout on a plan of one data and one tensor axis: the
// QKV and first MLP projections split on their output columns, the second ones on their rows.
Plan gpt2_small_megatron(Plan p) {
  for (int l = 0; l < 12; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    for (const char* col : {"attn.qkv.weight", "attn.qkv.bias", "mlp.fc.weight", "mlp.fc.bias"})
      p.params[h + col] = {Placement::replicate(), Placement::shard(0)};
    for (const char* row : {"attn.proj.weight", "mlp.proj.weight"})
      p.params[h + row] = {Placement::replicate(), Placement::shard(1)};
  }
  return p;
}

// The Megatron layout of a GPT-2 124M step on tp 2 with and without sequence parallelism:
// the norms' and residual adds' activations are split on the sequence, so the planned arena
// shrinks; the norm and residual values between blocks are Shard(1) on tp. GPT-2's head is the
// replicated token table: with sp each rank computes the logits of its half of the sequence,
// and the table's gradient, a partial sum, is reduced with the other gradients.
TEST(Partition, SequenceParallelSplitsNormsAndResidualsAndShrinksTheArena) {
  ModelGraph m = build_model(*find_preset("gpt2-small"), 4, 256, ModelMode::train);
  Plan tp = gpt2_small_megatron(Plan::tensor_parallel(1, 2));
  Plan sp = tp;
  sp.sequence_parallel = true;
  Result<Program> a = lower(m.graph, tp), b = lower(m.graph, sp);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  std::printf("arena: tp %lld B, tp + sp %lld B\n", (long long)a->memory.arena_bytes,
              (long long)b->memory.arena_bytes);
  EXPECT_LT(b->memory.arena_bytes, a->memory.arena_bytes * 0.95);
  int split = 0, reduce_scatters = 0, all_reduces_of_activations = 0;
  const Partitioned& part = b->part;
  std::vector<NodeId> gradients;  // (a parameter's gradient reduced over tp is no activation)
  for (const std::vector<NodeId>& bucket : part.buckets)
    gradients.insert(gradients.end(), bucket.begin(), bucket.end());
  for (NodeId id = 0; id < static_cast<NodeId>(part.local.nodes().size()); ++id) {
    const Node& n = part.local.node(id);
    const bool acts = n.outputs.size() == 1 &&
                      part.local.type(n.outputs[0]).shape.numel() >= 4 * 256 * 768 / 2 &&
                      std::find(gradients.begin(), gradients.end(), id) == gradients.end();
    // A norm fused with the residual add before it (parallel/fuse.h) normalizes output 1.
    const int normed = n.op == OpKind::add_layernorm ? 1 : 0;
    if ((n.op == OpKind::layernorm || n.op == OpKind::add_layernorm) &&
        part.placements[static_cast<size_t>(n.outputs[static_cast<size_t>(normed)])][1] ==
            Placement::shard(1))
      ++split;
    if (n.op == OpKind::reduce_scatter && n.attr<GroupAttrs>().axes == "tp") ++reduce_scatters;

    if (n.op == OpKind::all_reduce && n.attr<GroupAttrs>().axes == "tp" && acts)
      ++all_reduces_of_activations;
  }
  EXPECT_EQ(split, 2 * 12 - 1 + 1);  // every norm but block 0's first (replicated stream), ln_f
  // 2 forward, 2 backward per block (the tied head is replicated here: the final norm's input
  // gradient is whole on every rank and sliced, not reduced).
  EXPECT_EQ(reduce_scatters, 12 * 4);
  EXPECT_EQ(all_reduces_of_activations, 0);
}

// The sequence is dim 1 of [B, T, C]: with B > 1 each sequence-parallel gather and scatter of
// pieces of at least Plan::piece_bytes is B collectives, one per example, and no transpose
// packs or unpacks them; smaller pieces are packed into one collective.
TEST(Partition, SequenceParallelGathersLargePiecesOneByOne) {
  ModelGraph m = build_model(*find_preset("gpt2-small"), 2, 1024, ModelMode::train);
  Plan sp = gpt2_small_megatron(Plan::tensor_parallel(1, 2));
  sp.sequence_parallel = true;
  auto count = [&](const Plan& plan) {
    Result<Program> p = lower(m.graph, plan);
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    std::pair<int, int> pieced_and_transposes{0, 0};
    if (!p.ok()) return pieced_and_transposes;
    const Graph& g = p->part.local;
    for (const Node& n : g.nodes()) {
      const bool acts = g.type(n.inputs.empty() ? n.outputs[0] : n.inputs[0]).shape.numel() >=
                        1024 * 768;  // a whole or half activation [2, T (/ 2), 768]
      if ((n.op == OpKind::reduce_scatter || n.op == OpKind::all_gather) && acts &&
          n.attr<GroupAttrs>().axes == "tp" && n.attr<GroupAttrs>().segments == 2)
        ++pieced_and_transposes.first;
      if (n.op == OpKind::transpose && acts && g.type(n.inputs[0]).shape.rank() == 3 &&
          g.type(n.inputs[0]).shape.numel() == 2 * 1024 * 768)
        ++pieced_and_transposes.second;
    }
    return pieced_and_transposes;
  };
  const auto [pieced, transposes] = count(sp);  // pieces of 512 x 768 f32: 1.5 MiB
  EXPECT_GE(pieced, 12 * 4);                    // 2 scatters and 2 gathers a block at least
  EXPECT_EQ(transposes, 0);
  sp.piece_bytes = 2 << 20;
  const auto [packed_pieces, packed] = count(sp);
  EXPECT_EQ(packed_pieces, 0);
  EXPECT_GE(packed, 12 * 4);
}

TEST(Mesh, CoordinatesAndGroups) {
  Mesh m({{"a", 2}, {"b", 3}});
  EXPECT_EQ(m.size(), 6);
  EXPECT_EQ(m.coords(4), (std::vector<int>{1, 1}));
  EXPECT_EQ(m.rank_of({1, 2}), 5);
  EXPECT_EQ(m.group_index(5, {"b"}), 2);
  EXPECT_EQ(m.group_index(5, {"a"}), 1);
  EXPECT_EQ(m.group_color(5, {"b"}), m.group_color(3, {"b"}));
  EXPECT_NE(m.group_color(5, {"b"}), m.group_color(2, {"b"}));
}

class PartitionTest : public testing::TestWithParam<const char*> {};

TEST_P(PartitionTest, DataParallelNeedsNoFallback) {
  ModelGraph m = tiny(GetParam());
  for (Plan plan : {Plan::data_parallel(2), Plan::data_parallel(4, 1), Plan::data_parallel(4, 2),
                    Plan::data_parallel(4, 3), Plan::hybrid_sharded(2, 2)}) {
    SCOPED_TRACE(plan.describe());
    Result<Program> r = lower(m.graph, plan);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const Program& p = r.value();
    EXPECT_TRUE(verify(p.local()).ok()) << verify(p.local()).to_string();
    EXPECT_TRUE(p.part.fallbacks.empty()) << p.part.fallbacks.front();
    // Inputs hold this rank's rows.
    const int dp = plan.data_group();
    EXPECT_EQ(p.local().type(p.local().find_input("tokens")).shape, (Shape{4 / dp, 16}));
    // Every gradient is reduced: one collective per parameter (two for HSDP), plus the loss.
    const int n = static_cast<int>(m.graph.params().size());
    const int reductions =
        count_ops(p.local(), OpKind::all_reduce) + count_ops(p.local(), OpKind::reduce_scatter);
    EXPECT_EQ(reductions, (plan.shards_params() && plan.zero_group() < dp ? 2 * n : n) + 1);
    // ZeRO-3 gathers a parameter once for the forward and once for the backward pass if the
    // backward reads it (biases and wpe it does not).
    std::set<std::pair<ValueId, bool>> uses;
    for (const Node& node : m.graph.nodes())
      for (ValueId v : node.inputs)
        if (m.graph.producer(v).op == OpKind::parameter) uses.insert({v, node.backward});
    EXPECT_GT(static_cast<int>(uses.size()), n);
    EXPECT_EQ(count_ops(p.local(), OpKind::all_gather),
              plan.shards_params() ? static_cast<int>(uses.size()) : 0);
    for (const ParamLayout& pl : p.part.params) EXPECT_GE(pl.local_grad, 0) << pl.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PartitionTest, testing::Values("gpt-tiny", "llama-tiny"));

TEST(Program, ZeroThreePersistentBytesAreOneNth) {
  ModelGraph m = tiny("gpt-tiny");
  Plan plain = Plan::data_parallel(4), zero3 = Plan::data_parallel(4, 3);
  const int64_t full = grad_bytes(m.graph);
  // One micro-batch per step: the optimizer reads the gradients in the arena, so parameters
  // and AdamW's m and v persist.
  EXPECT_EQ(lower(m.graph, plain).value().persistent_bytes(), 3 * full);
  // Several: the gradients are accumulated in persistent buffers too.
  plain.micro_batches = zero3.micro_batches = 2;
  Program dp = lower(m.graph, plain).value();
  Program z3 = lower(m.graph, zero3).value();
  EXPECT_EQ(dp.persistent_bytes(), 4 * full);  // params, grads, m, v
  // Blocks are padded to a multiple of 4 elements: at most 3 elements per tensor.
  const int64_t pad = 4 * 3 * 4 * static_cast<int64_t>(m.graph.params().size());
  EXPECT_LE(z3.persistent_bytes() * 4, dp.persistent_bytes() + pad);
  EXPECT_GE(z3.persistent_bytes() * 4, dp.persistent_bytes());
}

// The optimizer offloaded (Plan::offload): the state leaves the device's bytes for the
// host's, and the optimizer list is the gradients out over the link, the norm and AdamW on the
// host, ZeRO-1's sync of each updated tensor, then each tensor back over the link — in an order
// a runner can execute on one stream. The key round-trips; a bad value is named.
TEST(Program, OffloadMovesTheOptimizerStateToTheHost) {
  ModelGraph m = tiny("gpt-tiny");
  const int64_t full = grad_bytes(m.graph);
  Plan plan = Plan::data_parallel(2, 1);
  plan.offload = OffloadPolicy::optimizer;
  const Program p = lower(m.graph, plan).value();
  const Program dev = lower(m.graph, Plan::data_parallel(2, 1)).value();
  EXPECT_EQ(p.optim_bytes, 0);
  EXPECT_EQ(p.persistent_bytes(), full);  // the parameters alone
  EXPECT_GT(dev.optim_bytes, 0);
  // Master of the whole piece; moments and the gradient's copy of this rank's half (padded).
  EXPECT_GE(p.host_bytes, full + 3 * full / 2);
  EXPECT_LE(p.host_bytes, full + 3 * full / 2 + 16 * static_cast<int64_t>(m.graph.params().size()));
  const size_t n = p.part.params.size();
  ASSERT_EQ(p.optimizer.size(), n + 1 + 3 * n);
  for (size_t k = 0; k < n; ++k) {
    EXPECT_EQ(p.optimizer[k].kind, Instruction::grad_to_host);
    EXPECT_EQ(p.optimizer[k].stream, Stream::link);
  }
  EXPECT_EQ(p.optimizer[n].kind, Instruction::grad_norm);
  EXPECT_EQ(p.optimizer[n].stream, Stream::host);
  EXPECT_EQ(p.optimizer[n].deps.size(), n);
  const Instruction::Kind per_tensor[] = {Instruction::optimizer, Instruction::param_sync,
                                          Instruction::param_to_device};
  const Stream streams[] = {Stream::host, Stream::comm, Stream::link};
  for (size_t k = n + 1; k < p.optimizer.size(); ++k) {
    EXPECT_EQ(p.optimizer[k].kind, per_tensor[(k - n - 1) % 3]) << k;
    EXPECT_EQ(p.optimizer[k].stream, streams[(k - n - 1) % 3]) << k;
  }
  EXPECT_TRUE(check_order(p.optimizer).ok());
  EXPECT_NE(print_program(p).find("link    param_to_device"), std::string::npos);

  Result<Plan> q = plan_from_json(plan_to_json(plan));
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->offload, OffloadPolicy::optimizer);
  EXPECT_EQ(q->describe(), "dp=2 zero=1 offload=optimizer");
  nlohmann::json j = plan_to_json(plan);
  j["offload"] = "disk";
  EXPECT_EQ(plan_from_json(j).status().message(),
            "plan: key 'offload': offload 'disk' is not one of: none, optimizer, params");
  // The parameters offload only where ZeRO-3 gathers them; then "params" reads back.
  j["offload"] = "params";
  EXPECT_EQ(plan_from_json(j).status().message(),
            "plan: offloading the parameters needs ZeRO-3 (zero = 1): the device gathers them "
            "from host memory");
  j["zero"] = 3;
  Result<Plan> z3 = plan_from_json(j);
  ASSERT_TRUE(z3.ok()) << z3.status().to_string();
  EXPECT_EQ(z3->describe(), "dp=2 zero=3 offload=params");
  EXPECT_TRUE(z3->offloads_optimizer() && z3->offloads_params());
}

TEST(Program, CommBytesMatchTheRingFormulas) {
  ModelGraph m = tiny("gpt-tiny");
  const double G = static_cast<double>(grad_bytes(m.graph));
  for (int n : {2, 4}) {
    SCOPED_TRACE(n);
    const double ring = 2.0 * (n - 1) / n;
    const double loss = ring * 4;
    Program dp = lower(m.graph, Plan::data_parallel(n)).value();
    EXPECT_NEAR(dp.comm_bytes_per_step, ring * G + loss, 1e-6 * G);
    // ZeRO-3: reduce-scatter (N-1)/N + two all-gathers 2(N-1)/N = 1.5x DP, up to padding.
    Program z3 = lower(m.graph, Plan::data_parallel(n, 3)).value();
    EXPECT_NEAR(z3.comm_bytes_per_step / (ring * G), 1.5, 0.01);
  }
}

TEST(Program, PrefetchLimitBoundsGathersInFlight) {
  ModelGraph m = tiny("gpt-tiny");
  for (int64_t limit : {int64_t{0}, int64_t{1} << 20}) {
    Plan plan = Plan::data_parallel(2, 3);
    plan.prefetch_bytes = limit;
    Program p = lower(m.graph, plan).value();
    const Graph& g = p.local();
    // Bytes of gathers issued but not yet read, at every node.
    int64_t worst = 0;
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      int64_t ahead = 0;
      for (size_t j = 0; j <= i; ++j) {
        const Node& n = g.nodes()[j];
        if (n.op != OpKind::all_gather) continue;
        bool used = false;
        for (size_t k = j + 1; k <= i && !used; ++k)
          for (ValueId v : g.nodes()[k].inputs) used = used || v == n.outputs[0];
        if (!used) ahead += g.type(n.outputs[0]).bytes();
      }
      worst = std::max(worst, ahead);
    }
    int64_t largest = 0;
    for (ValueId v : m.graph.params()) largest = std::max(largest, m.graph.type(v).bytes());
    EXPECT_LE(worst, std::max(limit, int64_t{0}) + largest) << "limit " << limit;
  }
}

// The step runner executes a Program's lists in order on one stream (review R7): lower()
// orders every dependency before its instruction, the optimizer list starts with the gradient
// norm and then has one AdamW per parameter, each ZeRO-1/2 parameter sync right after its
// update; a list whose dependency points forward is named.
TEST(Program, ListsAreInDependencyOrderAndTheOptimizerListIsOnePassPerParameter) {
  ModelGraph m = tiny("gpt-tiny");
  for (Plan plan : {Plan::data_parallel(1), Plan::data_parallel(4, 1), Plan::data_parallel(4, 3),
                    Plan::tensor_parallel(2, 2)}) {
    SCOPED_TRACE(plan.describe());
    Result<Program> r = lower(m.graph, plan);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const Program& p = r.value();
    EXPECT_TRUE(check_order(p.micro_step).ok()) << check_order(p.micro_step).to_string();
    EXPECT_TRUE(check_order(p.optimizer).ok()) << check_order(p.optimizer).to_string();
    ASSERT_FALSE(p.optimizer.empty());
    EXPECT_EQ(p.optimizer.front().kind, Instruction::grad_norm);
    std::vector<int> updates(p.part.params.size(), 0), syncs(p.part.params.size(), 0);
    for (size_t k = 1; k < p.optimizer.size(); ++k) {
      const Instruction& in = p.optimizer[k];
      ASSERT_GE(in.param, 0);
      if (in.kind == Instruction::optimizer) {
        updates[static_cast<size_t>(in.param)]++;
      } else {
        ASSERT_EQ(in.kind, Instruction::param_sync);
        syncs[static_cast<size_t>(in.param)]++;
        ASSERT_EQ(in.deps.size(), 1u);
        EXPECT_EQ(p.optimizer[static_cast<size_t>(in.deps[0])].param, in.param);
      }
    }
    for (size_t i = 0; i < updates.size(); ++i) {
      EXPECT_EQ(updates[i], 1) << p.part.params[i].name;
      const bool synced = p.part.params[i].optim_sharded && !p.part.params[i].params_sharded;
      EXPECT_EQ(syncs[i], synced ? 1 : 0) << p.part.params[i].name;
    }
  }
  std::vector<Instruction> bad(2);
  bad[0].deps = {1};
  const Status s = check_order(bad);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.to_string().find("instruction 0 (compute) depends on instruction 1"),
            std::string::npos)
      << s.to_string();
}

}  // namespace
}  // namespace tessera
