// Cutting the blocks into pipeline chunks: costs by layer, the balanced cut against brute
// force, and --stage-layers.
#include "parallel/pipeline_stages.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "models/model.h"

namespace tessera {
namespace {

// The smallest possible largest-chunk cost, over every contiguous cut.
double brute_force(const LayerCosts& c, int chunks) {
  const int n = static_cast<int>(c.block.size());
  double best = 1e300;
  std::vector<int> per(static_cast<size_t>(chunks), 1);
  // Enumerate compositions of n into `chunks` positive parts.
  std::function<void(int, int)> go = [&](int k, int left) {
    if (k == chunks - 1) {
      per[static_cast<size_t>(k)] = left;
      std::vector<double> costs = chunk_costs(c, per);
      best = std::min(best, *std::max_element(costs.begin(), costs.end()));
      return;
    }
    for (int v = 1; v <= left - (chunks - 1 - k); ++v) {
      per[static_cast<size_t>(k)] = v;
      go(k + 1, left - v);
    }
  };
  go(0, n);
  return best;
}

TEST(PipelineStages, BalancedCutIsOptimal) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.5, 2.0);
  for (int trial = 0; trial < 200; ++trial) {
    LayerCosts c;
    const int n = 1 + static_cast<int>(rng() % 10);
    for (int i = 0; i < n; ++i) c.block.push_back(u(rng));
    c.before = trial % 3 == 0 ? 0 : u(rng);
    c.after = trial % 2 == 0 ? 0 : 3 * u(rng);
    for (int chunks = 1; chunks <= n; ++chunks) {
      Result<std::vector<int>> per = balance_stages(c, chunks);
      ASSERT_TRUE(per.ok()) << per.status().to_string();
      ASSERT_EQ(static_cast<int>(per->size()), chunks);
      int sum = 0;
      for (int v : *per) {
        EXPECT_GE(v, 1);
        sum += v;
      }
      EXPECT_EQ(sum, n);
      std::vector<double> costs = chunk_costs(c, *per);
      EXPECT_NEAR(*std::max_element(costs.begin(), costs.end()), brute_force(c, chunks), 1e-12)
          << "n=" << n << " chunks=" << chunks;
    }
  }
}

TEST(PipelineStages, EvenBlocksSplitEvenlyAndAHeavyHeadTakesBlocksFromTheLastStage) {
  LayerCosts c;
  c.block.assign(10, 1.0);
  EXPECT_EQ(balance_stages(c, 5).value(), (std::vector<int>{2, 2, 2, 2, 2}));
  // Equal costs either way: the later stages take the extra blocks, since under 1F1B stage s
  // stashes p - s micro-batches and the first stages hold the most.
  EXPECT_EQ(balance_stages(c, 4).value(), (std::vector<int>{2, 2, 3, 3}));
  c.after = 2.0;  // an LM head worth two blocks
  std::vector<int> per = balance_stages(c, 4).value();
  EXPECT_EQ(per.back(), 1) << "the last stage holds the head";
  std::vector<double> costs = chunk_costs(c, per);
  EXPECT_DOUBLE_EQ(*std::max_element(costs.begin(), costs.end()), 3.0);
}

TEST(PipelineStages, LayerCostsOfAModel) {
  ModelConfig cfg = *find_preset("gpt-tiny");
  cfg.n_layer = 4;
  ModelGraph m = build_model(cfg, 2, 16, ModelMode::train);
  LayerCosts c = layer_costs(m.graph, [](const Node&) { return 1.0; });
  ASSERT_EQ(c.block.size(), 4u);
  for (double b : c.block) EXPECT_EQ(b, c.block[0]) << "every block has the same nodes";
  EXPECT_GT(c.before, 0);  // token and position embeddings and their gradients
  EXPECT_GT(c.after, 0);   // final norm, head, loss
  double total = c.before + c.after;
  for (double b : c.block) total += b;
  EXPECT_EQ(total, static_cast<double>(m.graph.nodes().size()));
}

TEST(PipelineStages, TooManyChunksAndBadStageLayersAreErrors) {
  LayerCosts c;
  c.block.assign(4, 1.0);
  Status s = balance_stages(c, 5).status();
  EXPECT_NE(s.message().find("5 model chunks (stages x virtual stages) but the model has 4"),
            std::string::npos)
      << s.to_string();
  EXPECT_EQ(parse_stage_layers("5,6,6,5", 22, 4).value(), (std::vector<int>{5, 6, 6, 5}));
  for (const char* bad :
       {"5,6,6", "5,6,6,6", "5,,6,11", "5,6,x,11", "0,6,6,10", "-1,7,6,10", "5,6,6,5,"}) {
    Result<std::vector<int>> r = parse_stage_layers(bad, 22, 4);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--stage-layers"), std::string::npos) << bad;
    EXPECT_NE(r.status().hint().find("give 4 positive block counts"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace tessera
