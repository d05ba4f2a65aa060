// Activation recomputation (full or selective) changes where the backward pass gets its
// activations, not what it computes: the same loss and gradients bit for bit on the CPU
// backend, with less arena.
// (ZeRO-3 on in-process ranks: step_runner_test.cc.)
#include <cstring>

#include "equivalence.h"

namespace tessera {
namespace {

using namespace testing_equivalence;

class RecomputeStep : public testing::TestWithParam<std::tuple<const char*, RecomputePolicy>> {};

// The step runner on a one-rank plan with `policy`.
std::unique_ptr<StepRunner> one_rank(const ModelGraph& m, Backend& cpu, MeshComms* comms,
                                     RecomputePolicy policy) {
  Plan plan = Plan::data_parallel(1);
  plan.recompute = policy;
  Result<MeshComms> c = MeshComms::single(plan);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  *comms = std::move(c).value();
  auto made = StepRunner::create(m.graph, plan, cpu, *comms, adamw());
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return std::move(made).value();
}

TEST_P(RecomputeStep, SameLossAndGradientsBitForBit) {
  CpuBackend cpu;
  const ModelConfig cfg = std::string(std::get<0>(GetParam())) == "gpt" ? tiny_gpt() : tiny_llama();
  ModelGraph m = build_model(cfg, kBatch, kSeq, ModelMode::train);
  MeshComms c_plain, c_rec;
  std::unique_ptr<StepRunner> plain = one_rank(m, cpu, &c_plain, RecomputePolicy::none);
  std::unique_ptr<StepRunner> rec = one_rank(m, cpu, &c_rec, std::get<1>(GetParam()));
  int clones = 0;
  for (const Node& n : rec->program().local().nodes()) clones += n.recompute;
  ASSERT_GT(clones, 0);
  for (const Node& n : plain->program().local().nodes()) EXPECT_FALSE(n.recompute);
  plain->init_params(kSeed);
  rec->init_params(kSeed);
  std::vector<int32_t> x, y;
  for (int s = 0; s < 3; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    global_batch(s, 0, &x, &y);
    rec->executor().paint_arena();
    const float a = plain->forward_backward(token_feed(x.data(), y.data())).value();
    const float b = rec->forward_backward(token_feed(x.data(), y.data())).value();
    EXPECT_EQ(rec->executor().measured_high_water(), rec->executor().plan().arena_bytes);
    EXPECT_EQ(std::memcmp(&a, &b, sizeof(float)), 0) << a << " vs " << b;
    for (size_t i = 0; i < m.graph.params().size(); ++i) {
      const size_t bytes = static_cast<size_t>(m.graph.type(m.graph.params()[i]).bytes());
      EXPECT_EQ(std::memcmp(plain->optimizer().params()[i].grad, rec->optimizer().params()[i].grad,
                            bytes),
                0)
          << "gradient of " << m.graph.name_of(m.graph.params()[i]);
    }
    ASSERT_TRUE(plain->apply(kLr, 0.5).ok());
    ASSERT_TRUE(rec->apply(kLr, 0.5).ok());
  }
  EXPECT_LT(rec->executor().plan().arena_bytes, plain->executor().plan().arena_bytes);
}

INSTANTIATE_TEST_SUITE_P(Policies, RecomputeStep,
                         testing::Combine(testing::Values("gpt", "llama"),
                                          testing::Values(RecomputePolicy::full,
                                                          RecomputePolicy::selective)),
                         [](const auto& i) {
                           return std::string(std::get<0>(i.param)) + "_" +
                                  recompute_name(std::get<1>(i.param));
                         });

}  // namespace
}  // namespace tessera
