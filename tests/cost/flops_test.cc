#include "cost/flops.h"

#include <gtest/gtest.h>

#include "models/model.h"

namespace tessera {
namespace {

TEST(Flops, MegatronCountsRecomputationAsAFourthPass) {
  // Without the attention and vocabulary terms, eq. (3) is 4/3 of the model FLOPs (forward,
  // recomputed forward, 2x backward against forward + 2x backward).
  TransformerShape t{8, 1, 24, 2048, 0};
  EXPECT_NEAR(megatron_flops_with_recompute(t) / megatron_model_flops(t), 4.0 / 3.0, 1e-3);
  // GPT-3 175B, B=1536, s=2048, V=51200: 4.5e18 FLOPs per iteration with recomputation.
  TransformerShape g{1536, 2048, 96, 12288, 51200};
  EXPECT_NEAR(megatron_flops_with_recompute(g), 4.51e18, 0.01e18);
}

TEST(Flops, PalmCountIsSixNPlusAttention) {
  TransformerShape t{4, 1024, 12, 768, 50257};
  double n = 124e6;
  EXPECT_DOUBLE_EQ(palm_model_flops(t, n), (6 * n + 12.0 * 12 * 768 * 1024) * 4 * 1024);
}

TEST(Flops, TheGraphCountMatchesTheAnalyticModelCount) {
  // Tessera's MFU counts the training graph's op FLOPs; for GPT-2 small that is within a few
  // percent of Korthikanti's closed form (which skips layernorm, GELU and the softmax).
  ModelConfig cfg = *find_preset("gpt2-small");
  ModelGraph m = build_model(cfg, 2, 1024, ModelMode::train);
  TransformerShape t{2, 1024, 12, 768, static_cast<double>(cfg.vocab_size)};
  EXPECT_NEAR(m.graph.total_flops() / megatron_model_flops(t), 1.0, 0.05);
}

}  // namespace
}  // namespace tessera
