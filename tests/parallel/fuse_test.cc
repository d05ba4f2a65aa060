// The fusion pass: which epilogues and residual norms it fuses in a GPT's local graph (one rank,
// tensor parallel, recomputed blocks), what it leaves alone, and the fused ops' sharding rules. The
// numerics (fused = unfused to the bit in f32) are checked by tests/runtime/step_runner_test.cc.
#include "parallel/fuse.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "models/model.h"
#include "parallel/program.h"

namespace tessera {
namespace {

std::map<OpKind, int> count_ops(const Graph& g) {
  std::map<OpKind, int> c;
  for (const Node& n : g.nodes()) ++c[n.op];
  return c;
}

Program lowered(const char* model, Plan plan) {
  ModelGraph m = build_model(*find_preset(model), 4, 16, ModelMode::train);
  Result<Program> p = lower(m.graph, plan);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return std::move(p.value());
}

TEST(Fuse, MakesEveryGptBlocksEpilogues) {
  const int layers = static_cast<int>(find_preset("gpt-tiny")->n_layer);
  Plan plan = Plan::data_parallel(1);
  std::map<OpKind, int> c = count_ops(lowered("gpt-tiny", plan).local());
  // qkv, attn.proj and mlp.proj take a bias; mlp.fc a bias and GELU, whose gradient and the
  // bias gradient fold into the backward product.
  EXPECT_EQ(c[OpKind::matmul_bias], 3 * layers);
  EXPECT_EQ(c[OpKind::matmul_bias_gelu], layers);
  EXPECT_EQ(c[OpKind::matmul_dgelu_bgrad], layers);
  EXPECT_EQ(c[OpKind::matmul_bgrad], 3 * layers);  // the other biases' gradients
  // Each residual add and the norm after it (ln_2, the next block's ln_1, ln_f), forward and
  // backward; block 0's ln_1 reads the embeddings' sum, a broadcast of the position table.
  EXPECT_EQ(c[OpKind::add_layernorm], 2 * layers);
  EXPECT_EQ(c[OpKind::layernorm_grad_add], 2 * layers);
  EXPECT_EQ(c[OpKind::layernorm], 1);
  EXPECT_EQ(c[OpKind::gelu], 0);
  EXPECT_EQ(c[OpKind::gelu_grad], 0);
  EXPECT_EQ(c[OpKind::sum_to], 1);  // only the position table's gradient, over the batch
  EXPECT_TRUE(verify(lowered("gpt-tiny", plan).local()).ok());

  plan.fuse = false;
  c = count_ops(lowered("gpt-tiny", plan).local());
  EXPECT_EQ(c[OpKind::matmul_bias] + c[OpKind::matmul_bias_gelu] + c[OpKind::matmul_dgelu_bgrad] +
                c[OpKind::matmul_bgrad],
            0);
  EXPECT_EQ(c[OpKind::gelu], layers);
}

// gpt-tiny's blocks in Megatron's layout over tp 2: qkv and mlp.fc split on their output
// columns (their biases with them), attn.proj and mlp.proj on their input columns.
Plan megatron_gpt_tiny() {
  Plan plan = Plan::tensor_parallel(1, 2);
  const size_t tp = static_cast<size_t>(plan.mesh.axis_index("tp"));
  auto split = [&](const std::string& name, int dim) {
    plan.params[name] = plan.placements_of("");
    plan.params[name][tp] = Placement::shard(dim);
  };
  for (int64_t l = 0; l < find_preset("gpt-tiny")->n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    for (const char* col : {"attn.qkv", "mlp.fc"}) {
      split(h + col + ".weight", 0);
      split(h + col + ".bias", 0);
    }
    split(h + "attn.proj.weight", 1);
    split(h + "mlp.proj.weight", 1);
  }
  return plan;
}

// Row-parallel products are Partial: their all-reduce comes before the bias, which stays an
// add. Column-parallel ones (qkv, mlp.fc) fuse with their block of the bias.
TEST(Fuse, LeavesRowParallelProductsToTheirCollective) {
  const int layers = static_cast<int>(find_preset("gpt-tiny")->n_layer);
  const Program p = lowered("gpt-tiny", megatron_gpt_tiny());
  std::map<OpKind, int> c = count_ops(p.local());
  EXPECT_EQ(c[OpKind::matmul_bias], layers);  // qkv
  EXPECT_EQ(c[OpKind::matmul_bias_gelu], layers);
  EXPECT_EQ(c[OpKind::matmul_dgelu_bgrad], layers);
  EXPECT_EQ(c[OpKind::matmul_bgrad], 3 * layers);
  for (const Node& n : p.local().nodes())
    if (n.op == OpKind::matmul_bias) {
      EXPECT_EQ(n.scope.find(".proj"), std::string::npos) << n.scope;
    }
}

TEST(Fuse, RecomputedBlocksAreFusedToo) {
  const int layers = static_cast<int>(find_preset("gpt-tiny")->n_layer);
  Plan plan = Plan::data_parallel(1);
  plan.recompute = RecomputePolicy::full;
  std::map<OpKind, int> c = count_ops(lowered("gpt-tiny", plan).local());
  EXPECT_EQ(c[OpKind::matmul_bias_gelu], 2 * layers);  // the forward's and the recomputed
  EXPECT_EQ(c[OpKind::matmul_dgelu_bgrad], layers);
}

// LLaMA has no biases and SwiGLU: no epilogue to fuse; its residual adds join their rmsnorms.
TEST(Fuse, LlamaFusesItsResidualNormsOnly) {
  const int layers = static_cast<int>(find_preset("llama-tiny")->n_layer);
  std::map<OpKind, int> c = count_ops(lowered("llama-tiny", Plan::data_parallel(1)).local());
  EXPECT_EQ(c[OpKind::matmul_bias] + c[OpKind::matmul_bias_gelu] + c[OpKind::matmul_dgelu_bgrad] +
                c[OpKind::matmul_bgrad],
            0);
  EXPECT_EQ(c[OpKind::add_rmsnorm], 2 * layers);
  EXPECT_EQ(c[OpKind::rmsnorm_grad_add], 2 * layers);
  EXPECT_EQ(c[OpKind::rmsnorm], 1);  // block 0's first reads the embedding, not a sum
}

TEST(Fuse, PlanKeyRoundTrips) {
  Plan p = Plan::data_parallel(2);
  p.fuse = false;
  Result<Plan> back = plan_from_json(plan_to_json(p));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_FALSE(back->fuse);
  Result<Plan> bad = plan_from_json(
      nlohmann::json::parse(R"({"mesh": [{"name": "dp", "size": 1}], "fuse": "yes"})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("fuse"), std::string::npos) << bad.status().message();
}

// x [4, 8] @ w[16, 8]^T + bias [16] along one mesh axis.
bool bias_rule(Placement x, Placement w, Placement bias, std::vector<Placement>* out) {
  const std::vector<TensorType> in = {
      {Shape{4, 8}, DType::f32}, {Shape{16, 8}, DType::f32}, {Shape{16}, DType::f32}};
  const std::vector<TensorType> outs = {{Shape{4, 16}, DType::f32}};
  const std::vector<Placement> pl = {x, w, bias};
  const Attrs a = MatmulAttrs{.transpose_b = true};
  return op_def(OpKind::matmul_bias).sharding({a, in, outs, pl}, out);
}

TEST(Fuse, TheBiasRuleRefusesAPartialProduct) {
  using P = Placement;
  std::vector<P> out;
  // Split contraction: each rank's product is Partial, and a bias would be added per rank.
  EXPECT_FALSE(bias_rule(P::shard(1), P::shard(1), P::replicate(), &out));
  // Column split: the bias split with the product's columns.
  ASSERT_TRUE(bias_rule(P::replicate(), P::shard(0), P::shard(0), &out));
  EXPECT_EQ(out[0], P::shard(1));
  EXPECT_FALSE(bias_rule(P::replicate(), P::shard(0), P::replicate(), &out));
  // Row split: the bias whole.
  ASSERT_TRUE(bias_rule(P::shard(0), P::replicate(), P::replicate(), &out));
  EXPECT_EQ(out[0], P::shard(0));
  EXPECT_FALSE(bias_rule(P::shard(0), P::replicate(), P::shard(0), &out));
}

}  // namespace
}  // namespace tessera
