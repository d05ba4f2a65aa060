// Mixture-of-experts models (models/moe.cc): Mixtral's parameter count, the experts' capacity,
// a mixture of identical experts computing what the dense model does, dropped routes counted,
// the load-balancing loss of a uniform router, and the config's checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "models/model.h"
#include "preset_util.h"
#include "runtime/executor.h"

namespace tessera {
namespace {

// Mixtral-8x7B as published (the Hugging Face checkpoint's tensors).
TEST(Moe, MixtralHasThePublishedParameterCount) {
  ModelConfig c = preset("mixtral-8x7b");
  EXPECT_EQ(count_params(c), 46702792704);
  EXPECT_EQ(build_model(c, 1, 2, ModelMode::logits).graph.param_count(), 46702792704);
}

// Per example: ceil(factor x tokens x k / E), at least 1 and at most every token.
TEST(Moe, CapacityIsPerExampleAndBounded) {
  ModelConfig c = preset("moe-tiny");       // 8 experts, 2 per token, factor 1.25
  EXPECT_EQ(c.expert_capacity(1, 64), 20);  // 1.25 * 64 * 2 / 8
  EXPECT_EQ(c.expert_capacity(4, 64), 80);
  c.capacity_factor = 4.0;  // E / k: every route finds a slot
  EXPECT_EQ(c.expert_capacity(2, 64), 128);
  c.capacity_factor = 100.0;
  EXPECT_EQ(c.expert_capacity(2, 64), 128);
  c.capacity_factor = 0.001;
  EXPECT_EQ(c.expert_capacity(3, 64), 3);
}

struct Outcome {
  std::vector<float> logits;
  float loss = 0, kept = 0;
  int64_t routes = 0;
};

// One loss-mode run on fixed tokens; `setup` writes parameters after the seeded init.
template <class F>
Outcome run_model(const ModelConfig& c, int64_t batch, int64_t seq, F setup) {
  ModelGraph m = build_model(c, batch, seq, ModelMode::loss, /*keep_logits=*/true);
  CpuBackend cpu;
  Executor ex(m.graph, cpu);
  ex.init_params(5);
  setup(m.graph, ex);
  std::vector<int32_t> tokens(static_cast<size_t>(batch * seq)), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7919) % 50257);
    targets[i] = static_cast<int32_t>((i * 104729 + 3) % 50257);
  }
  ex.set_input(kTokensInput, tokens.data());
  ex.set_input(kTargetsInput, targets.data());
  ex.run();
  Outcome r;
  r.logits.resize(static_cast<size_t>(m.graph.type(m.logits).shape.numel()));
  ex.read(m.logits, r.logits.data());
  r.loss = ex.read_scalar(m.loss);
  for (const auto& [name, v] : m.graph.metrics())
    if (name == kMoeKeptMetric) r.kept = ex.read_scalar(v);
  r.routes = m.moe_routes;
  return r;
}

float* param(const Graph& g, Executor& ex, const std::string& name) {
  const ValueId v = g.find_param(name);
  EXPECT_GE(v, 0) << name;
  return ex.data<float>(v);
}

// With every expert a copy of one MLP and every token routed to all of them, the mixture is
// that MLP (the routing weights sum to 1): its logits are the dense model's.
TEST(Moe, IdenticalExpertsComputeTheDenseModel) {
  ModelConfig dense = preset("llama-tiny");
  ModelConfig moe = dense;
  moe.n_experts = 2;
  moe.experts_per_token = 2;
  moe.capacity_factor = 1.0;  // E / k: nothing dropped
  const int64_t B = 2, T = 16, C = dense.n_embd, F = dense.ffn();
  std::map<std::string, std::vector<float>> values;  // the dense model's, by name
  Outcome want = run_model(dense, B, T, [&](const Graph& g, Executor& ex) {
    for (ValueId p : g.params()) {
      const float* d = ex.data<float>(p);
      values[g.name_of(p)].assign(d, d + g.type(p).shape.numel());
    }
  });
  Outcome got = run_model(moe, B, T, [&](const Graph& g, Executor& ex) {
    for (ValueId p : g.params()) {
      const std::string& name = g.name_of(p);
      auto it = values.find(name);
      if (it != values.end()) {
        std::memcpy(ex.data<float>(p), it->second.data(), it->second.size() * sizeof(float));
        continue;
      }
      // "h.L.moe.experts.W" <- every expert a copy of "h.L.mlp.W.weight".
      const size_t at = name.find(".moe.experts.");
      if (at == std::string::npos) continue;  // the router: any weights do
      const std::vector<float>& w =
          values.at(name.substr(0, at) + ".mlp." + name.substr(at + 13) + ".weight");
      for (int64_t e = 0; e < moe.n_experts; ++e)
        std::memcpy(ex.data<float>(p) + e * F * C, w.data(), w.size() * sizeof(float));
    }
  });
  ASSERT_EQ(got.logits.size(), want.logits.size());
  double worst = 0;
  for (size_t j = 0; j < got.logits.size(); ++j)
    worst = std::max(worst, static_cast<double>(std::fabs(got.logits[j] - want.logits[j])));
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(got.kept, static_cast<float>(got.routes));
  EXPECT_EQ(got.routes, B * T * 2 * moe.n_layer);
}

// A router of zeros sends equal probability everywhere: the balance loss is
// E x sum_e (routes to e / tokens) x 1/E = k per block, so the loss adds coef x k.
TEST(Moe, UniformRouterBalanceLossIsK) {
  ModelConfig c = preset("moe-tiny");
  c.capacity_factor = 4.0;
  auto zero_routers = [&](const Graph& g, Executor& ex) {
    for (int64_t l = 0; l < c.n_layer; ++l)
      std::memset(param(g, ex, "h." + std::to_string(l) + ".moe.router.weight"), 0,
                  static_cast<size_t>(c.n_experts * c.n_embd) * sizeof(float));
  };
  Outcome with = run_model(c, 2, 8, zero_routers);
  c.router_aux_loss_coef = 0;
  Outcome without = run_model(c, 2, 8, zero_routers);
  EXPECT_NEAR(with.loss - without.loss, 0.02 * 2, 1e-5);
}

// A capacity below the even share drops routes; the count says how many.
TEST(Moe, SmallCapacityDropsRoutesAndCountsThem) {
  ModelConfig c = preset("moe-tiny");
  c.capacity_factor = 0.25;  // 4 slots per expert for 64 routes of 32 tokens
  Outcome r = run_model(c, 1, 32, [](const Graph&, Executor&) {});
  EXPECT_EQ(r.routes, 32 * 2 * 2);
  EXPECT_LE(r.kept, 2 * 8 * 4);  // two blocks of 8 experts x 4 slots
  EXPECT_GT(r.kept, 0);
}

TEST(Moe, ValidateNamesTheKey) {
  ModelConfig c = preset("moe-tiny");
  ASSERT_TRUE(validate(c).ok());
  ModelConfig k = c;
  k.experts_per_token = 9;
  EXPECT_NE(validate(k).message().find("experts_per_token"), std::string::npos);
  ModelConfig f = c;
  f.capacity_factor = 0;
  EXPECT_NE(validate(f).message().find("capacity_factor"), std::string::npos);
  ModelConfig g = preset("gpt-tiny");
  g.n_experts = 4;
  g.experts_per_token = 1;
  EXPECT_NE(validate(g).message().find("llama"), std::string::npos);
  ModelConfig d = preset("llama-tiny");
  d.experts_per_token = 2;
  EXPECT_NE(validate(d).message().find("n_experts"), std::string::npos);
}

}  // namespace
}  // namespace tessera
