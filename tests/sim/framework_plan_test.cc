// Plans as Megatron-Core/NeMo, DeepSpeed, torchtitan, MaxText and PyTorch FSDP configurations
// write them, read into the degrees, sharding, recomputation and precision they mean; unknown
// keys and bad values refused by name.
#include "sim/framework_plan.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace tessera {
namespace {

FrameworkPlan read(const char* text) {
  Result<FrameworkPlan> p = read_framework_plan(nlohmann::json::parse(text));
  EXPECT_TRUE(p.ok()) << text << ": " << p.status().to_string();
  return p.ok() ? *p : FrameworkPlan{};
}

std::string refusal(const char* text) {
  Result<FrameworkPlan> p = read_framework_plan(nlohmann::json::parse(text));
  EXPECT_FALSE(p.ok()) << text;
  return p.ok() ? "" : p.status().to_string();
}

TEST(FrameworkPlan, MegatronCore) {
  const FrameworkPlan p = read(
      R"({"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 4,
          "context_parallel_size": 2, "expert_model_parallel_size": 1,
          "use_distributed_optimizer": true, "recompute_granularity": "selective",
          "sequence_parallel": true, "bf16": true, "num_microbatches": 16})");
  EXPECT_EQ(p.tp, 8);
  EXPECT_EQ(p.pp, 4);
  EXPECT_EQ(p.cp, 2);
  EXPECT_EQ(p.ep, 1);
  EXPECT_EQ(p.dp, 0);  // the ranks left
  EXPECT_TRUE(p.sharding_given);
  EXPECT_EQ(p.sharding.zero, 1);
  EXPECT_EQ(p.recompute, "selective");
  EXPECT_TRUE(p.sequence_parallel);
  EXPECT_EQ(p.precision, "bf16");
  EXPECT_EQ(p.micro_batches, 16);
  // "false" says no distributed optimizer.
  const FrameworkPlan off = read(R"({"use_distributed_optimizer": false})");
  EXPECT_TRUE(off.sharding_given);
  EXPECT_EQ(off.sharding.zero, 0);
  EXPECT_EQ(off.tp, 0);  // not given: the command's
  EXPECT_FALSE(read(R"({"tp": 2})").sharding_given);
}

TEST(FrameworkPlan, DeepSpeedNestedSections) {
  const FrameworkPlan p = read(
      R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
          "bf16": {"enabled": true}, "fp16": {"enabled": false},
          "gradient_accumulation_steps": 4, "activation_checkpointing": true})");
  EXPECT_EQ(p.sharding.zero, 3);
  EXPECT_TRUE(p.offload_optimizer);
  EXPECT_EQ(p.precision, "bf16");
  EXPECT_EQ(p.micro_batches, 4);
  EXPECT_EQ(p.recompute, "full");
  EXPECT_FALSE(read(R"({"zero_optimization": {"offload_optimizer": {"device": "none"}}})")
                   .offload_optimizer);
  EXPECT_NE(refusal(R"({"offload": "optimizer",
                         "zero_optimization": {"offload_optimizer": {"device": "none"}}})")
                .find("says optimizer but"),
            std::string::npos);
  // "stage" means the ZeRO stage only under zero_optimization.
  EXPECT_NE(refusal(R"({"stage": 2})").find("unknown key 'stage'"), std::string::npos);
  EXPECT_NE(refusal(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})")
                .find("'zero_optimization.offload_optimizer.device' is 'nvme'; the optimizer "
                      "offloads to host memory only"),
            std::string::npos);
}

TEST(FrameworkPlan, TorchtitanDataDegrees) {
  // FSDP over 8 ranks: ZeRO-3, dp 8.
  FrameworkPlan p = read(
      R"({"parallelism": {"data_parallel_shard_degree": 8, "tensor_parallel_degree": 2},
          "activation_checkpoint": {"mode": "full"}, "mixed_precision_param": "bfloat16",
          "float8": "rowwise"})");
  EXPECT_EQ(p.tp, 2);
  EXPECT_EQ(p.dp, 8);
  EXPECT_EQ(p.sharding.zero, 3);
  EXPECT_FALSE(p.sharding.hsdp);
  EXPECT_EQ(p.recompute, "full");
  EXPECT_EQ(p.precision, "fp8");  // FP8 GEMMs beside bf16
  // HSDP: shard groups of 8, 4 replicas.
  p = read(R"({"data_parallel_shard_degree": 8, "data_parallel_replicate_degree": 4})");
  EXPECT_EQ(p.dp, 32);
  EXPECT_TRUE(p.sharding.hsdp);
  EXPECT_EQ(p.sharding.shard, 8);
  EXPECT_EQ(p.replicas, 4);
  // -1: the ranks left (the shard degree, with 2 replicas).
  p = read(R"({"data_parallel_shard_degree": -1, "data_parallel_replicate_degree": 2})");
  EXPECT_EQ(p.dp, 0);
  EXPECT_TRUE(p.sharding.hsdp);
  EXPECT_EQ(p.replicas, 2);
  // A shard degree of 1 shards nothing: replicas alone are plain data parallelism.
  p = read(R"({"data_parallel_shard_degree": 1, "data_parallel_replicate_degree": 4})");
  EXPECT_EQ(p.dp, 4);
  EXPECT_FALSE(p.sharding_given);
  EXPECT_NE(refusal(R"({"data_parallel_shard_degree": -1, "data_parallel_replicate_degree": -1})")
                .find("both -1"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"data_parallel_shard_degree": 8, "sharding": "ZeRO-1"})")
                .find("the shard degree shards with ZeRO-3"),
            std::string::npos);
}

TEST(FrameworkPlan, MaxTextAndFsdp) {
  FrameworkPlan p = read(R"({"ici_fsdp_parallelism": 4, "ici_tensor_parallelism": 2,
                             "ici_data_parallelism": 2, "dtype": "bfloat16"})");
  EXPECT_EQ(p.tp, 2);
  EXPECT_EQ(p.dp, 8);
  EXPECT_TRUE(p.sharding.hsdp);
  EXPECT_EQ(p.sharding.shard, 4);
  EXPECT_EQ(p.replicas, 2);
  EXPECT_FALSE(p.ep_beside_dp);
  // MaxText's expert axis is one of its own, not carved out of the data ranks.
  EXPECT_TRUE(read(R"({"ici_expert_parallelism": 2, "ici_data_parallelism": 4})").ep_beside_dp);
  EXPECT_FALSE(read(R"({"expert_model_parallel_size": 2, "dp": 4})").ep_beside_dp);
  // "dp": -1 (the ranks left) goes with any shard degree.
  EXPECT_EQ(read(R"({"dp": -1, "data_parallel_shard_degree": 8})").dp, 8);
  p = read(R"({"sharding_strategy": "SHARD_GRAD_OP", "mixed_precision": "fp16", "dp": 16})");
  EXPECT_EQ(p.sharding.zero, 2);
  EXPECT_EQ(p.dp, 16);
  EXPECT_EQ(p.precision, "f16");
  p = read(R"({"fsdp": "HYBRID_SHARD dp_shard=8", "gradient_checkpointing": false})");
  EXPECT_TRUE(p.sharding.hsdp);
  EXPECT_EQ(p.sharding.shard, 8);
  EXPECT_EQ(p.recompute, "none");
}

TEST(FrameworkPlan, RefusesWhatItCannotRead) {
  EXPECT_NE(refusal(R"({"tensor_model_paralel_size": 8})")
                .find("unknown key 'tensor_model_paralel_size'"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"tp": "eight"})").find("'tp' must be a whole number, got \"eight\""),
            std::string::npos);
  EXPECT_NE(refusal(R"({"tp": 0})").find("'tp' must be between 1 and"), std::string::npos);
  EXPECT_NE(refusal(R"({"tp": -1})").find("'tp' must be between 1 and"), std::string::npos);
  EXPECT_NE(refusal(R"({"sharding": "ZeRO-R"})").find("ZeRO-R"), std::string::npos);
  EXPECT_NE(refusal(R"({"recompute": "every 2nd layer"})").find("plan: 'recompute'"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"precision": "mixed"})").find("plan: 'precision'"), std::string::npos);
  // Two keys of one knob must agree (whatever their order in the file).
  EXPECT_NE(refusal(R"({"bf16": true, "fp16": true})").find("'bf16' says bf16 but 'fp16' says f16"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"tp": 2, "tensor_model_parallel_size": 4})")
                .find("'tensor_model_parallel_size' says 4 but 'tp' says 2"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"float8": true, "fp16": true})").find("says bf16 but"), std::string::npos);
  EXPECT_NE(refusal(R"({"dp": 4, "data_parallel_shard_degree": 8})")
                .find("'dp' says 4 data-parallel ranks, the shard and replicate degrees 8"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"fsdp": true, "data_parallel_shard_degree": 1})")
                .find("a shard degree of 1 with a sharding of ZeRO-3"),
            std::string::npos);
  // Agreeing keys are one setting.
  EXPECT_EQ(read(R"({"tp": 4, "tensor_model_parallel_size": 4, "float8": true, "bf16": true})").tp,
            4);
  EXPECT_NE(refusal(R"({"sequence_parallel": 1})").find("must be true or false"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"zero": 4})").find("not a spelling of a sharding"), std::string::npos);
  EXPECT_TRUE(is_framework_plan(nlohmann::json::parse(R"({"tp": 2})")));
  EXPECT_FALSE(is_framework_plan(nlohmann::json::parse(R"({"mesh": []})")));
}

}  // namespace
}  // namespace tessera
