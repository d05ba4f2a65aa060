// Activation recomputation changes where the backward pass gets its activations, not what it
// computes: the same loss and gradients bit for bit on the CPU backend, with less arena.
// (ZeRO-3 on in-process ranks: distributed_step_test.cc.)
#include <cstring>

#include "equivalence.h"

namespace tessera {
namespace {

using namespace testing_equivalence;

TEST(RecomputeStep, SameLossAndGradientsBitForBit) {
  CpuBackend cpu;
  ModelGraph m = build_model(tiny_gpt(), kBatch, kSeq, ModelMode::train);
  TrainStep plain(m, cpu, adamw());
  TrainStep rec(m, cpu, adamw(), RecomputePolicy::full);
  int clones = 0;
  for (const Node& n : rec.graph().nodes()) clones += n.recompute;
  ASSERT_GT(clones, 0);
  EXPECT_EQ(&plain.graph(), &m.graph);
  plain.executor().init_params(kSeed);
  rec.executor().init_params(kSeed);
  std::vector<int32_t> x, y;
  for (int s = 0; s < 3; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    global_batch(s, 0, &x, &y);
    rec.executor().paint_arena();
    const float a = plain.forward_backward(x.data(), y.data());
    const float b = rec.forward_backward(x.data(), y.data());
    EXPECT_EQ(rec.executor().measured_high_water(), rec.executor().plan().arena_bytes);
    EXPECT_EQ(std::memcmp(&a, &b, sizeof(float)), 0) << a << " vs " << b;
    for (size_t i = 0; i < m.graph.params().size(); ++i) {
      const size_t bytes = static_cast<size_t>(m.graph.type(m.graph.params()[i]).bytes());
      EXPECT_EQ(std::memcmp(plain.grad(i), rec.grad(i), bytes), 0)
          << "gradient of " << m.graph.name_of(m.graph.params()[i]);
    }
    plain.apply(kLr, 0.5, 1);
    rec.apply(kLr, 0.5, 1);
  }
  EXPECT_LT(rec.executor().plan().arena_bytes, plain.executor().plan().arena_bytes);
}

}  // namespace
}  // namespace tessera
