// The placement search on a tensor axis: the Megatron layout of a LLaMA block comes out of
// the costs (FLOPs saved against bytes sent), and its communication is the analytic count.
#include "parallel/sharding_search.h"

#include <gtest/gtest.h>

#include <chrono>

#include "models/model.h"
#include "parallel/program.h"

namespace tessera {
namespace {

std::string placement_on(const BlockLayout& b, const std::string& suffix, size_t axis) {
  for (size_t i = 0; i < b.names.size(); ++i)
    if (b.names[i].size() >= suffix.size() &&
        b.names[i].compare(b.names[i].size() - suffix.size(), suffix.size(), suffix) == 0)
      return b.placements[i][axis].to_string();
  for (size_t i = 0; i < b.outer_names.size(); ++i)
    if (b.outer_names[i] == suffix) return b.outer_placements[i][axis].to_string();
  return "absent";
}

TEST(ShardingSearch, FindsTheMegatronLayoutOfALlamaBlock) {
  ModelConfig c = *find_preset("llama2-7b");
  c.n_layer = 1;
  const int64_t B = 1, T = 4096, C = c.n_embd;
  ModelGraph m = build_model(c, B, T, ModelMode::train);
  Plan plan = Plan::tensor_parallel(1, 8);
  auto t0 = std::chrono::steady_clock::now();
  Result<BlockLayout> b = search_block_layout(m.graph, plan, SearchCost{2000});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  std::printf("%d candidates in %.2f s; cost %.4g FLOP-equivalents\n", b->candidates, secs,
              b->cost);
  const size_t tp = 1;
  for (const char* col :
       {"attn.q.weight", "attn.k.weight", "attn.v.weight", "mlp.gate.weight", "mlp.up.weight"})
    EXPECT_EQ(placement_on(*b, col, tp), "S(0)") << col;  // column-parallel [out, in]
  for (const char* row : {"attn.o.weight", "mlp.down.weight"})
    EXPECT_EQ(placement_on(*b, row, tp), "S(1)") << row;  // row-parallel
  for (const char* norm : {"attn_norm.weight", "mlp_norm.weight", "norm.weight"})
    EXPECT_EQ(placement_on(*b, norm, tp), "R") << norm;
  // The 32000-word vocabulary splits 8 ways: a vocab-parallel head (an eighth of its FLOPs).
  // The untied embedding stays whole: a split saves no FLOPs and costs an all-reduce (the
  // cost counts time, not memory).
  EXPECT_EQ(placement_on(*b, "lm_head.weight", tp), "S(0)");
  EXPECT_EQ(placement_on(*b, "tok_emb", tp), "R");
  EXPECT_TRUE(b->notes.empty());
  // One all-reduce of the [B*T, C] activations per block half, forward and backward, and one
  // of the head's input gradient: a ring over 8 ranks sends 2 * 7/8 of each. The
  // cross-entropy sends each row's block logsumexp to the 7 others (all-gather) and
  // all-reduces the target logits.
  const double act = 2.0 * 7 / 8 * static_cast<double>(B * T * C) * 4;
  const double rows = static_cast<double>(B * T) * 4;
  const double analytic = 5 * act + 7 * rows + 2.0 * 7 / 8 * rows;
  EXPECT_DOUBLE_EQ(b->tensor_bytes, analytic);
}

// With sequence parallelism the same layout moves each block half's activations as a
// reduce-scatter and an all-gather instead of an all-reduce (a ring over 8 ranks sends 7/8 of
// the tensor for each). A block sends 10 such pieces: forward, 2 all-gathers before the
// column-parallel matmuls and 2 reduce-scatters after the row-parallel ones; backward, 2
// all-gathers of the output gradient, 2 all-gathers again of the normalized inputs for the
// weight gradients (not kept from the forward pass) and 2 reduce-scatters. The first block
// sends 2 fewer: the replicated embedding reaches q, k and v whole (the stream is split at
// the first residual add, for free). Outside the block, 4: the final norm's output gathered
// for the head and again for the head's weight gradient (as in the blocks), its input
// gradient reduce-scattered, the embedding's output gradient gathered. The norm weights' gradients,
// now partial sums over the sequence, are all-reduced; the cross-entropy sends what it sent before.
TEST(ShardingSearch, SequenceParallelMovesReduceScattersAndAllGathers) {
  ModelConfig c = *find_preset("llama2-7b");
  c.n_layer = 1;
  const int64_t B = 1, T = 4096, C = c.n_embd;
  ModelGraph m = build_model(c, B, T, ModelMode::train);
  Plan plan = Plan::tensor_parallel(1, 8);
  plan.sequence_parallel = true;
  Result<BlockLayout> b = search_block_layout(m.graph, plan, SearchCost{2000});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const size_t tp = 1;
  for (const char* col :
       {"attn.q.weight", "attn.k.weight", "attn.v.weight", "mlp.gate.weight", "mlp.up.weight"})
    EXPECT_EQ(placement_on(*b, col, tp), "S(0)") << col;
  for (const char* row : {"attn.o.weight", "mlp.down.weight"})
    EXPECT_EQ(placement_on(*b, row, tp), "S(1)") << row;
  EXPECT_EQ(placement_on(*b, "lm_head.weight", tp), "S(0)");
  EXPECT_EQ(placement_on(*b, "tok_emb", tp), "R");
  for (const char* norm : {"attn_norm.weight", "mlp_norm.weight", "norm.weight"})
    EXPECT_EQ(placement_on(*b, norm, tp), "R") << norm;
  const double piece = 7.0 / 8 * static_cast<double>(B * T * C) * 4;  // one gather or scatter
  const double rows = static_cast<double>(B * T) * 4;
  const double norm_grads = 3 * 2.0 * 7 / 8 * static_cast<double>(C) * 4;
  const double analytic = (10 - 2 + 4) * piece + 7 * rows + 2.0 * 7 / 8 * rows + norm_grads;
  EXPECT_DOUBLE_EQ(b->tensor_bytes, analytic);
}

// Under sequence parallelism at a large micro-batch, whole MLP weights cost less time than
// split ones (no tensor-axis traffic around them; the weight gradients' all-reduce is smaller
// than the activations' gathers) and hold tp times the bytes: on the 20 layers of a stage of 4
// of Llama 3 70B that is more state than an 80 GB device holds, so with the device's memory as the
// budget the search splits them (Megatron's layout) and says the state fits.
TEST(ShardingSearch, WholeWeightsThatDoNotFitLoseToSplitOnes) {
  ModelConfig c = *find_preset("llama3-70b");
  c.n_layer = 1;
  ModelGraph m = build_model(c, 8, 8192, ModelMode::train);
  Plan plan = Plan::tensor_parallel(1, 8);
  plan.sequence_parallel = true;
  plan.micro_batches = 8;
  const size_t tp = 1;
  SearchCost fast{2000};
  Result<BlockLayout> b = search_block_layout(m.graph, plan, fast);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(placement_on(*b, "mlp.up.weight", tp), "R");  // time alone: whole
  SearchCost budget = fast;
  budget.state_budget_bytes = 80e9;
  budget.state_bytes_per_element = state_bytes_per_element(plan, DType::bf16);
  budget.blocks = 20;                                            // a stage of 4
  EXPECT_DOUBLE_EQ(budget.state_bytes_per_element, 2 + 4 + 12);  // bf16, f32 grads, AdamW
  Result<BlockLayout> f = search_block_layout(m.graph, plan, budget);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  for (const char* col : {"mlp.gate.weight", "mlp.up.weight", "attn.q.weight"})
    EXPECT_EQ(placement_on(*f, col, tp), "S(0)") << col;
  EXPECT_EQ(placement_on(*f, "mlp.down.weight", tp), "S(1)");
  EXPECT_TRUE(f->fits);
  EXPECT_LE(f->state_bytes, 80e9);
  EXPECT_GT(f->cost, b->cost);
  // A budget nothing meets: the candidate that holds the least.
  budget.state_budget_bytes = 1e9;
  Result<BlockLayout> none = search_block_layout(m.graph, plan, budget);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->fits);
  EXPECT_EQ(placement_on(*none, "mlp.up.weight", tp), "S(0)");
  EXPECT_EQ(placement_on(*none, "tok_emb", tp), "S(0)");  // split too, to hold less
  // ZeRO-1 over 4 data ranks divides the optimizer's bytes; ZeRO-3 everything.
  Plan z = Plan::tensor_parallel(4, 8, 1);
  EXPECT_DOUBLE_EQ(state_bytes_per_element(z, DType::bf16), 2 + 2 + 12.0 / 4);
  z.zero = 3;
  EXPECT_DOUBLE_EQ(state_bytes_per_element(z, DType::f32), (4 + 4 + 8) / 4.0);
  // An offloaded optimizer's state is in host memory.
  z.offload = OffloadPolicy::optimizer;
  EXPECT_DOUBLE_EQ(state_bytes_per_element(z, DType::bf16), (2 + 2) / 4.0);
}

// GPT's fused QKV projection stores its rows per head (models/model.h), so a row split of
// it hands each rank whole heads: the search finds column-parallel QKV and fc (with their
// biases), row-parallel attention and MLP projections.
TEST(ShardingSearch, FindsTheMegatronLayoutOfAGptBlock) {
  ModelConfig c = *find_preset("gpt3-175b");
  c.n_layer = 1;
  const int64_t B = 1, T = 2048, C = c.n_embd;
  ModelGraph m = build_model(c, B, T, ModelMode::train);
  Result<BlockLayout> b = search_block_layout(m.graph, Plan::tensor_parallel(1, 8), SearchCost{});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const size_t tp = 1;
  for (const char* col : {"attn.qkv.weight", "attn.qkv.bias", "mlp.fc.weight", "mlp.fc.bias"})
    EXPECT_EQ(placement_on(*b, col, tp), "S(0)") << col;
  for (const char* row : {"attn.proj.weight", "mlp.proj.weight"})
    EXPECT_EQ(placement_on(*b, row, tp), "S(1)") << row;
  for (const char* rep :
       {"ln_1.weight", "ln_1.bias", "attn.proj.bias", "ln_2.weight", "ln_2.bias", "mlp.proj.bias"})
    EXPECT_EQ(placement_on(*b, rep, tp), "R") << rep;
  // 50257 words do not split 8 ways: the tied embedding stays whole, and the search says why.
  EXPECT_EQ(placement_on(*b, "wte", tp), "R");
  ASSERT_EQ(b->notes.size(), 1u);
  EXPECT_NE(b->notes[0].find("wte [50257,12288] stays Replicate"), std::string::npos)
      << b->notes[0];
  const double analytic = 4 * 2.0 * 7 / 8 * static_cast<double>(B * T * C) * 4;
  EXPECT_DOUBLE_EQ(b->tensor_bytes, analytic);
}

// T5 has two kinds of block, and a decoder block of 10 matrices (searched module by module):
// both get the Megatron layout, self-attention included, whose position bias (computed whole
// from its table) is sliced on the heads for free rather than the heads gathered.
TEST(ShardingSearch, FindsTheMegatronLayoutOfT5sEncoderAndDecoderBlocks) {
  ModelConfig c = *find_preset("t5-11b");
  c.n_layer = 1;
  ModelGraph m = build_model(c, 1, 512, ModelMode::train);
  auto t0 = std::chrono::steady_clock::now();
  Result<BlockLayout> b = search_block_layout(m.graph, Plan::tensor_parallel(1, 8), SearchCost{});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  std::printf("%d candidates in %.2f s\n", b->candidates, secs);
  EXPECT_EQ(b->kind_sizes, (std::vector<size_t>{9, 13}));  // the encoder's final norm included
  const size_t tp = 1;
  for (const char* block : {"encoder.block.0.", "decoder.block.0."}) {
    for (const std::string col :
         {"attn.q.weight", "attn.k.weight", "attn.v.weight", "mlp.wi.weight"})
      EXPECT_EQ(placement_on(*b, block + col, tp), "S(0)") << block << col;
    for (const std::string row : {"attn.o.weight", "mlp.wo.weight"})
      EXPECT_EQ(placement_on(*b, block + row, tp), "S(1)") << block << row;
  }
  for (const char* col : {"cross.q.weight", "cross.k.weight", "cross.v.weight"})
    EXPECT_EQ(placement_on(*b, col, tp), "S(0)") << col;
  EXPECT_EQ(placement_on(*b, "cross.o.weight", tp), "S(1)");
}

TEST(ShardingSearch, SpreadsOverEveryBlockAndLowers) {
  ModelConfig c = *find_preset("llama-tiny");
  ModelGraph one = build_model(
      [&] {
        ModelConfig d = c;
        d.n_layer = 1;
        return d;
      }(),
      2, 64, ModelMode::train);
  ModelGraph all = build_model(c, 2, 64, ModelMode::train);
  Plan plan = Plan::tensor_parallel(2, 2);
  // On a model this small a plain all-reduce costs more than the FLOPs it saves unless the
  // link is fast: say so.
  Result<BlockLayout> b = search_block_layout(one.graph, plan, SearchCost{1});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  Result<std::map<std::string, std::vector<Placement>>> params =
      expand_block_layout(*b, all.graph, plan);
  ASSERT_TRUE(params.ok()) << params.status().to_string();
  size_t in_blocks = 0;
  for (const auto& [name, pl] : *params) in_blocks += name.rfind("h.", 0) == 0;
  EXPECT_EQ(in_blocks, static_cast<size_t>(7 * c.n_layer));
  // Outside the blocks: 50257 head rows do not split over 2, so the head splits its columns
  // (its input's slice is free; the logits are all-reduced), which pays on this fast link.
  EXPECT_EQ(params->at("lm_head.weight")[1], Placement::shard(1));
  EXPECT_EQ(params->at("h.1.mlp.down.weight")[1], Placement::shard(1));
  plan.params = *params;
  Result<Program> p = lower(all.graph, plan);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  // A slow link (a byte costs a million FLOPs): replicating everything is cheapest.
  Result<BlockLayout> slow =
      search_block_layout(one.graph, Plan::tensor_parallel(2, 2), SearchCost{1e6});
  ASSERT_TRUE(slow.ok());
  EXPECT_EQ(slow->tensor_bytes, 0);
}

TEST(ShardingSearch, ADegreeNothingDividesIsAnErrorNamingTheDegreesThatWork) {
  ModelGraph m = build_model(*find_preset("llama-tiny"), 2, 64, ModelMode::train);
  Result<BlockLayout> b = search_block_layout(m.graph, Plan::tensor_parallel(1, 3), SearchCost{});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("can be sharded 3 ways over tp"), std::string::npos)
      << b.status().message();
  EXPECT_NE(b.status().hint().find("1, 2, 4, 8"), std::string::npos) << b.status().hint();
}

TEST(ShardingSearch, NeedsOneTensorAxis) {
  ModelGraph m = build_model(*find_preset("llama-tiny"), 2, 64, ModelMode::train);
  Result<BlockLayout> b = search_block_layout(m.graph, Plan::data_parallel(2), SearchCost{});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("exactly one tensor axis"), std::string::npos);
}

}  // namespace
}  // namespace tessera
