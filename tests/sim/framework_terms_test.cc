// Every spelling of sharding, precision and recomputation the frameworks use, mapped to what it
// means in a Plan; the unknown and the unmodelled refused by name.
#include "sim/framework_terms.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

void expect_sharding(const std::string& text, int zero, bool hsdp = false, int shard = 0) {
  auto t = parse_sharding_term(text);
  ASSERT_TRUE(t.ok()) << text << ": " << t.status().to_string();
  EXPECT_EQ(t->zero, zero) << text;
  EXPECT_EQ(t->hsdp, hsdp) << text;
  EXPECT_EQ(t->shard, shard) << text;
}

TEST(FrameworkTerms, ShardingSpellings) {
  for (const char* none :
       {"none", "none (ZeRO-0)", "NO_SHARD", "FSDP NO_SHARD", "DDP", "ZeRO-0", "stage 0", "off"})
    expect_sharding(none, 0);
  for (const char* one :
       {"ZeRO-1", "ZeRO-1 (DS)", "zero stage 1", "DeepSpeed stage 1", "P_os",
        "distributed optimizer", "Megatron-Core distributed optimizer",
        "--use-distributed-optimizer", "use_distributed_optimizer", "DistributedOptimizer",
        "sharded optimizer", "ZeroRedundancyOptimizer", "optimizer state sharding"})
    expect_sharding(one, 1);
  for (const char* two : {"ZeRO-2", "zero2", "ZeRO stage 2", "stage 2", "P_os+g", "SHARD_GRAD_OP",
                          "FSDP SHARD_GRAD_OP", "fsdp shard-grad-op"})
    expect_sharding(two, 2);
  for (const char* three :
       {"ZeRO-3", "ZeRO-3 (DeepSpeed)", "zero_3", "stage 3", "P_os+g+p", "FULL_SHARD",
        "FSDP FULL_SHARD", "FSDP FULL_SHARD (+backward prefetch, rate limiter)", "FSDP", "FSDP2",
        "fully_shard", "MaxText fsdp", "full shard"})
    expect_sharding(three, 3);
  expect_sharding("HYBRID_SHARD", 3, true);
  expect_sharding("FSDP HYBRID_SHARD", 3, true);
  expect_sharding("_HYBRID_SHARD_ZERO2", 2, true);
  expect_sharding("HSDP", 3, true);
  expect_sharding("HSDP shard degree 8", 3, true, 8);
  expect_sharding("FSDP2 dp_shard=16", 3, true, 16);
  expect_sharding("torchtitan data_parallel_shard_degree 32", 3, true, 32);
  expect_sharding("HSDP SHARD_GRAD_OP", 2, true);
  expect_sharding("HSDP (ZeRO stage 2)", 2, true);
  expect_sharding("FSDP full_shard 64 GPUs", 3);  // a GPU count is no shard degree
  expect_sharding("DDP + ZeRO-1", 1);
  expect_sharding("DDP with ZeroRedundancyOptimizer", 1);
  expect_sharding("no TP; ZeRO-3", 3);
  EXPECT_FALSE(parse_sharding_term("dp_shard=99999999999").ok());  // no overflow
  for (const char* refused : {"ZeRO-2 (P_os+g) + ZeRO-R", "ZeRO-R"}) {
    auto t = parse_sharding_term(refused);
    ASSERT_FALSE(t.ok()) << refused;
    EXPECT_NE(t.status().message().find("ZeRO-R"), std::string::npos);
  }
  auto unknown = parse_sharding_term("tensor-sliced magic");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("'tensor-sliced magic' is not a spelling"),
            std::string::npos);
  EXPECT_NE(unknown.status().hint().find("FULL_SHARD"), std::string::npos);
}

TEST(FrameworkTerms, PrecisionSpellings) {
  for (const char* fp8 :
       {"FP8 (TE)", "amp_fp8 (MP mode DEFAULT)", "float8 tensorwise", "float8 rowwise",
        "fp8 delayed scaling", "Transformer Engine FP8 hybrid", "E4M3/E5M2"}) {
    auto p = parse_precision_term(fp8);
    ASSERT_TRUE(p.ok()) << fp8;
    EXPECT_TRUE(p->fp8) << fp8;
    EXPECT_EQ(p->dtype, DType::bf16) << fp8;
  }
  for (const auto& [text, dtype] :
       std::vector<std::pair<const char*, DType>>{{"bf16", DType::bf16},
                                                  {"amp_bf16 (MP mode DEFAULT)", DType::bf16},
                                                  {"bf16 (MP mode PURE)", DType::bf16},
                                                  {"bf16 (BF16Optimizer)", DType::bf16},
                                                  {"bfloat16", DType::bf16},
                                                  {"mixed (bf16/fp16)", DType::bf16},
                                                  {"fp16", DType::f16},
                                                  {"mixed fp16", DType::f16},
                                                  {"mixed precision (16-bit)", DType::f16},
                                                  {"float16", DType::f16},
                                                  {"half", DType::f16},
                                                  {"amp", DType::f16},
                                                  {"apex O2", DType::f16},
                                                  {"fp32", DType::f32},
                                                  {"TF32", DType::f32},
                                                  {"single precision", DType::f32}}) {
    auto p = parse_precision_term(text);
    ASSERT_TRUE(p.ok()) << text << ": " << p.status().to_string();
    EXPECT_EQ(p->dtype, dtype) << text;
    EXPECT_FALSE(p->fp8) << text;
  }
  auto mixed = parse_precision_term("mixed");
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("in which format"), std::string::npos);
}

// The frameworks whose pipeline sends block the sending stage: those on DeepSpeed's pipeline
// engine; Megatron-LM's sends wait with the receive the stage needs anyway.
TEST(FrameworkTerms, FrameworksWhosePipelineSendsBlock) {
  for (const char* blocks : {"Megatron-DeepSpeed", "DeepSpeed + Megatron-LM",
                             "GPT-NeoX (Megatron + DeepSpeed)", "deepspeed"})
    EXPECT_TRUE(framework_blocks_pipeline_sends(blocks)) << blocks;
  for (const char* overlaps :
       {"Megatron-LM", "Megatron-LM (PTD-P)", "Megatron-LM + DeepSpeed ZeRO-3",
        "NeMo 24.07 (Megatron-Core, Transformer Engine)", "torchtitan", ""})
    EXPECT_FALSE(framework_blocks_pipeline_sends(overlaps)) << overlaps;
}

// Pipeline stages as the frameworks cut them, by blocks: DeepSpeed's engine fills each stage in
// turn to the fullest stage's count (BigScience's 78 blocks on 12 stages: 7 each, 1 on the
// last), Megatron's family evenly (per chunk with virtual stages); others are balanced by cost.
TEST(FrameworkTerms, PipelinesCutAsTheFrameworkCutsThem) {
  EXPECT_EQ(framework_pipeline_cut("Megatron-DeepSpeed", 78, 12),
            (std::vector<int>{7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 1}));
  EXPECT_EQ(framework_pipeline_cut("Megatron-DeepSpeed", 72, 12), std::vector<int>(12, 6));
  EXPECT_EQ(framework_pipeline_cut("GPT-NeoX (Megatron + DeepSpeed)", 10, 4),
            (std::vector<int>{3, 3, 3, 1}));
  // 9 blocks greedily by 3 would leave the fourth stage empty: the even cut.
  EXPECT_EQ(framework_pipeline_cut("DeepSpeed + Megatron-LM", 9, 4),
            (std::vector<int>{3, 2, 2, 2}));
  EXPECT_EQ(framework_pipeline_cut("Megatron-LM (PTD-P)", 96, 24), std::vector<int>(24, 4));
  EXPECT_EQ(framework_pipeline_cut("NeMo 24.07 (Megatron-Core, Transformer Engine)", 40, 3),
            (std::vector<int>{14, 13, 13}));
  for (const char* balanced : {"torchtitan", "PyTorch FSDP", ""})
    EXPECT_TRUE(framework_pipeline_cut(balanced, 72, 12).empty()) << balanced;
  EXPECT_TRUE(framework_pipeline_cut("Megatron-LM", 3, 4).empty());  // fewer blocks than chunks
}

// The frameworks that fuse a GEMM's bias and GELU into the product, as Tessera does: Megatron's
// family and llm.c; PyTorch FSDP, Composer and JAX run them as kernels of their own.
TEST(FrameworkTerms, FrameworksThatFuseBiasAndGelu) {
  for (const char* fuses :
       {"Megatron-LM (PTD-P)", "Megatron-DeepSpeed",
        "NeMo 24.07 (Megatron-Core, Transformer Engine)", "GPT-NeoX (Megatron + DeepSpeed)",
        "llm.c (CUDA/cuDNN, ZeRO-1 via -z 1)", ""})
    EXPECT_TRUE(framework_fuses_epilogues(fuses)) << fuses;
  for (const char* separate :
       {"Composer + PyTorch FSDP (llm-foundry)", "PyTorch FSDP", "JAX/Pathways", "torchtitan"})
    EXPECT_FALSE(framework_fuses_epilogues(separate)) << separate;
}

// Attention around a score matrix in memory: runs published before FlashAttention reached the
// frameworks (2023), unless the framework names a fused kernel or had one (llm-foundry).
TEST(FrameworkTerms, RunsBeforeFlashAttentionMaterializeTheScores) {
  for (const auto& [framework, year] :
       std::vector<std::pair<const char*, int>>{{"Megatron-LM", 2021},
                                                {"Megatron-DeepSpeed", 2022},
                                                {"PyTorch FSDP", 2022},
                                                {"DeepSpeed + Megatron-LM", 2022},
                                                {"JAX/Pathways", 2022}})
    EXPECT_TRUE(framework_materializes_attention(framework, year)) << framework << " " << year;
  for (const auto& [framework, year] : std::vector<std::pair<const char*, int>>{
           {"Megatron-LM", 2023},
           {"Megatron-LM", 0},
           {"", 2021},
           {"Composer + PyTorch FSDP (llm-foundry)", 2022},
           {"PyTorch FSDP (fms-fsdp, SDPA FlashAttention-2)", 2022},
           {"NeMo 24.07 (Megatron-Core, Transformer Engine)", 2022},
           {"llm.c (CUDA/cuDNN, ZeRO-1 via -z 1)", 2022}})
    EXPECT_FALSE(framework_materializes_attention(framework, year)) << framework << " " << year;
}

// Megatron's gradient-accumulation fusion (from 2022): Megatron-LM, Megatron-Core, NeMo; not
// where DeepSpeed's engine holds the gradients, nor PyTorch FSDP.
TEST(FrameworkTerms, MegatronFusesGradientAccumulation) {
  for (const auto& [framework, year] : std::vector<std::pair<const char*, int>>{
           {"Megatron-LM", 2022},
           {"Megatron-Core r0.8.0", 2024},
           {"NeMo 24.07 (Megatron-Core, Transformer Engine)", 2024}})
    EXPECT_TRUE(framework_fuses_grad_accumulation(framework, year)) << framework << " " << year;
  for (const auto& [framework, year] :
       std::vector<std::pair<const char*, int>>{{"Megatron-LM", 2021},
                                                {"Megatron-LM", 0},
                                                {"Megatron-DeepSpeed", 2022},
                                                {"DeepSpeed + Megatron-LM", 2022},
                                                {"Megatron-LM + DeepSpeed ZeRO-3", 2022},
                                                {"Composer + PyTorch FSDP (llm-foundry)", 2023},
                                                {"", 2024}})
    EXPECT_FALSE(framework_fuses_grad_accumulation(framework, year)) << framework << " " << year;
}

// fp16 gradients summed in fp16: Megatron-LM (gradient buffers in the parameters' dtype unless
// --accumulate-allreduce-grads-in-fp32) and DeepSpeed's fp16 engines; not Megatron-Core, NeMo,
// PyTorch FSDP or an unnamed framework.
TEST(FrameworkTerms, FrameworksSummingF16GradientsInF16) {
  for (const char* f : {"Megatron-LM", "Megatron-LM (PTD-P)", "Megatron-DeepSpeed",
                        "DeepSpeed + Megatron-LM", "GPT-NeoX (DeepSpeed)"})
    EXPECT_TRUE(framework_sums_f16_gradients_in_f16(f)) << f;
  for (const char* f : {"Megatron-Core r0.8.0", "NeMo 24.07 (Megatron-Core, Transformer Engine)",
                        "Composer + PyTorch FSDP (llm-foundry)", "PyTorch FSDP", ""})
    EXPECT_FALSE(framework_sums_f16_gradients_in_f16(f)) << f;
}

TEST(FrameworkTerms, RecomputeSpellings) {
  for (const auto& [text, policy] : std::vector<std::pair<const char*, RecomputePolicy>>{
           {"full", RecomputePolicy::full},
           {"full (activation checkpointing)", RecomputePolicy::full},
           {"activation checkpointing", RecomputePolicy::full},
           {"gradient_checkpointing", RecomputePolicy::full},
           {"--checkpoint-activations", RecomputePolicy::full},
           {"--recompute-granularity full", RecomputePolicy::full},
           {"every layer", RecomputePolicy::full},
           {"selective", RecomputePolicy::selective},
           {"--recompute-granularity selective", RecomputePolicy::selective},
           {"core attention", RecomputePolicy::selective},
           {"none", RecomputePolicy::none},
           {"none (-r 0)", RecomputePolicy::none},
           {"off", RecomputePolicy::none},
           {"disabled", RecomputePolicy::none},
           {"false", RecomputePolicy::none}}) {
    auto r = parse_recompute_term(text);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status().to_string();
    EXPECT_EQ(r->policy, policy) << text;
  }
  for (const char* some : {"selective (every n blocks)", "every 2nd layer", "partial"}) {
    auto r = parse_recompute_term(some);
    ASSERT_FALSE(r.ok()) << some;
    EXPECT_NE(r.status().message().find("some blocks only"), std::string::npos);
  }
  EXPECT_FALSE(parse_recompute_term("sometimes").ok());
}

}  // namespace
}  // namespace tessera
