// A plan as a training framework's configuration writes it: the parallel degrees, sharding,
// recomputation, precision and micro-batches under the keys Megatron-Core/NeMo, DeepSpeed,
// torchtitan, MaxText or PyTorch FSDP use, read into what they mean (the values through
// sim/framework_terms.h). `simulate --plan FILE` (and `plan`, `train`) take such a file where
// it has no "mesh" (a Tessera plan file has one).
//
//   {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 4,
//    "use_distributed_optimizer": true, "recompute_granularity": "selective",
//    "sequence_parallel": true, "bf16": true}                         // Megatron-Core
//   {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
//    "bf16": {"enabled": true}, "gradient_accumulation_steps": 4}    // DeepSpeed
//   {"parallelism": {"data_parallel_shard_degree": 8, "tensor_parallel_degree": 2},
//    "activation_checkpoint": {"mode": "full"}, "mixed_precision_param": "bfloat16"}  // torchtitan
//
//   TS_ASSIGN_OR_RETURN(FrameworkPlan p, read_framework_plan(json));
//
// Nested objects are read by their keys' last part ("zero_optimization": {"stage": 3} is
// "stage" under "zero_optimization"). Keys (case and '-'/'_' alike):
//   tensor:    tp, tensor_parallel, tensor_model_parallel_size, tensor_parallel_degree,
//              tensor_parallel_size, ici_tensor_parallelism
//   pipeline:  pp, pipeline_model_parallel_size, pipeline_parallel_degree,
//              pipeline_parallel_size, ici_pipeline_parallelism
//   data:      dp, data_parallel_size, data_parallel_degree; torchtitan's
//              data_parallel_shard_degree (FSDP over that many ranks; HSDP with
//              data_parallel_replicate_degree > 1) and data_parallel_replicate_degree;
//              MaxText's ici_fsdp_parallelism (ZeRO-3 over that many ranks) and
//              ici_data_parallelism (replicas)
//   context:   cp, context_parallel_size, context_parallel_degree, ici_context_parallelism
//   expert:    ep, expert_model_parallel_size, expert_parallel_degree, ici_expert_parallelism
//   sharding:  sharding, sharding_strategy, zero, zero_stage, stage (under zero_optimization),
//              fsdp (a strategy, or true), use_distributed_optimizer (true: ZeRO-1)
//   recompute: recompute, recompute_granularity, activation_checkpointing, mode (under
//              activation_checkpoint), gradient_checkpointing (true/false)
//   precision: precision, mixed_precision, mixed_precision_param, dtype; bf16 / fp16 (true,
//              or {"enabled": true}); float8 (true, or a recipe)
//   offload:   offload ("optimizer"), device (under offload_optimizer: "cpu" offloads; under
//              offload_param, with the optimizer offloaded: the parameters too)
//   others:    sequence_parallel (bool), micro_batches, gradient_accumulation_steps,
//              num_microbatches
// A degree of -1 (torchtitan: "the rest") is left to the ranks. Any other key is refused by
// name, as is a value of the wrong type or a spelling framework_terms does not know, and two
// keys of one knob that disagree (nlohmann::json reads keys in sorted order, so "the later
// key" would mean nothing).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "base/status.h"
#include "sim/framework_terms.h"

namespace tessera {

// Each field 0 or empty where the file does not give it (dp: or gives -1, the ranks left).
struct FrameworkPlan {
  int tp = 0, pp = 0, cp = 0, ep = 0;
  int dp = 0;  // as the framework counts it: the expert-parallel ranks among them, unless
  bool ep_beside_dp = false;  // MaxText's ici_expert_parallelism: an axis of its own
  ShardingTerm sharding;      // with hsdp: shard ranks per group (0: dp / replicas)
  bool sharding_given = false;
  int replicas = 0;  // HSDP's replica groups, where a replicate degree gives them (0: dp / shard)
  std::string recompute;  // a Plan recompute name ("none", "full", "selective"); "": not given
  bool sequence_parallel = false;
  int micro_batches = 0;  // 0: not given
  std::string precision;  // "f32", "bf16", "f16" or "fp8"; "": not given
  bool offload_optimizer = false;
  bool offload_params = false;  // with the optimizer: Plan::offload params
};

// Whether `j` is a plan in a framework's words rather than a Tessera plan (which has "mesh").
bool is_framework_plan(const nlohmann::json& j);
Result<FrameworkPlan> read_framework_plan(const nlohmann::json& j);

}  // namespace tessera
