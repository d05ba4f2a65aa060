// The words training frameworks use for a plan's knobs, mapped to what they mean in a Plan:
// how `validate` reads a published run's sharding, precision and recomputation, whatever
// framework the paper or table was written in.
//
//   TS_ASSIGN_OR_RETURN(ShardingTerm s, parse_sharding_term("HYBRID_SHARD"));  // ZeRO-3, HSDP
//   TS_ASSIGN_OR_RETURN(PrecisionTerm p, parse_precision_term("float8 rowwise"));  // fp8
//   TS_ASSIGN_OR_RETURN(RecomputeTerm r, parse_recompute_term("--recompute-granularity full"));
//
// Spellings are matched case-insensitively, '-', '_' and spaces alike. Sharding:
//   none, NO_SHARD, DDP, ZeRO-0 .................................. no sharding
//   ZeRO-1, stage 1, P_os, distributed optimizer (Megatron-Core, NeMo),
//     use_distributed_optimizer, sharded optimizer, ZeroRedundancyOptimizer .. ZeRO-1
//   ZeRO-2, stage 2, P_os+g, SHARD_GRAD_OP ........................ ZeRO-2
//   ZeRO-3, stage 3, P_os+g+p, FULL_SHARD, FSDP (PyTorch's default strategy), FSDP2,
//     fully_shard, MaxText's fsdp ................................... ZeRO-3
//   HYBRID_SHARD, HSDP, _HYBRID_SHARD_ZERO2, FSDP2 with a shard degree (dp_shard=N,
//     "shard degree 8", torchtitan's data_parallel_shard_degree) ... ZeRO-3 (ZeRO-2 for
//     _ZERO2) within groups of the shard degree, replicated across them (HSDP); without a
//     degree, the group is a node, as PyTorch's default
//   ZeRO-R (partitioned activations with model parallelism) ....... refused: not modeled
// Precision:
//   fp8, float8 (tensorwise, rowwise), delayed scaling, Transformer Engine's FP8 (hybrid
//     E4M3/E5M2), amp_fp8 ........................................... FP8 GEMMs beside bf16
//   bf16, bfloat16, amp_bf16, BF16Optimizer, pure bf16 ............... bf16 mixed precision
//   fp16, float16, half, amp (PyTorch's default autocast), apex O1/O2, 16-bit ... fp16 mixed
//   fp32, float32, tf32, single ....................................... fp32
//   "mixed" alone names no format: refused
// Recomputation:
//   full, activation checkpointing, gradient checkpointing, checkpoint_activations, every
//     block/layer, --recompute-granularity full ...................... every block
//   selective, --recompute-granularity selective, core attention ..... selective
//   none, no, off, disabled, false, -r 0 .............................. none
//   some blocks only ("selective (every n blocks)", "every 2nd layer") refused: not modeled
// An empty text is "not published" (the caller fills it as the planner would); a text that
// matches none of these is refused naming it and the spellings known.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "ir/dtype.h"
#include "parallel/plan.h"

namespace tessera {

struct ShardingTerm {
  int zero = 0;  // ZeRO stage 0-3
  bool hsdp = false;
  int shard = 0;  // HSDP: ranks per shard group; 0 when the text gives none
};

struct PrecisionTerm {
  DType dtype = DType::bf16;
  bool fp8 = false;  // the blocks' GEMMs in FP8 beside `dtype`
};

struct RecomputeTerm {
  RecomputePolicy policy = RecomputePolicy::none;
};

// A spelling as the parsers compare it: lowercase, with '-' and runs of spaces or '_' as one
// '_' ("Full Shard" -> "full_shard", "Tensor-Model-Parallel-Size" ->
// "tensor_model_parallel_size").
std::string normalized_term(const std::string& text);

// Whether a framework's pipeline sends block the sending stage until they are done: DeepSpeed's
// pipeline engine (its instructions run one after another, the send of an activation a
// synchronous p2p before the receive of the next gradient), so Megatron-DeepSpeed, GPT-NeoX and
// MT-NLG too. Not Megatron-LM's schedules: each batches a send with the receive the stage waits
// for anyway, so the send is hidden behind that wait; nor Megatron-Core, NeMo, the others, or an
// unnamed framework.
bool framework_blocks_pipeline_sends(const std::string& framework);

// How the framework cuts `blocks` transformer blocks into `chunks` pipeline chunks (stages x
// virtual stages, in model order; Plan::stage_layers), counting blocks and not what else a
// chunk runs, so the first chunk holds the embedding and the last the LM head and the loss on
// top of theirs. Empty where the framework's cut is not known here: Tessera then balances the
// chunks by cost (pipeline_program.h).
// - DeepSpeed's pipeline engine (Megatron-DeepSpeed, GPT-NeoX, MT-NLG: partition_method
//   'type:transformer' and its kin) gives each stage in turn as many blocks as the fullest
//   stage must hold, ceil(blocks / chunks), so the last takes what is left (BigScience's 78
//   blocks on 12 stages: 7 each, 1 on the last).
// - Megatron-LM, Megatron-Core and NeMo give every chunk blocks / chunks (Megatron-LM requires
//   that it divide; otherwise the first chunks take one more).
// Either way every chunk holds at least one block; where the greedy cut would leave one empty,
// the even one.
std::vector<int> framework_pipeline_cut(const std::string& framework, int blocks, int chunks);

// Whether the framework can interleave a pipeline's stages over several model chunks each
// (Megatron's interleaved 1F1B: Megatron-LM, Megatron-Core, NeMo); DeepSpeed's pipeline engine
// (Megatron-DeepSpeed, GPT-NeoX) cannot.
bool framework_interleaves_pipelines(const std::string& framework);

// Whether the framework fuses a GEMM's bias and GELU (and their gradients) into the product, as
// Tessera's fusion pass does (parallel/fuse.h): Megatron's bias-GELU fusion (Megatron-LM,
// Megatron-Core, NeMo, Megatron-DeepSpeed, GPT-NeoX) and llm.c's cuBLASLt epilogues. Others
// (PyTorch FSDP, Composer, JAX) run them as kernels of their own; an unnamed framework is taken
// to fuse, as Tessera does.
bool framework_fuses_epilogues(const std::string& framework);

// Whether a run published in `year` (0: unknown) by `framework` ran attention as kernels around
// a score matrix in memory (AttentionKernel::materialized) rather than one fused kernel.
// FlashAttention was published in mid-2022 and reached the frameworks in 2023 (Megatron-LM's
// --use-flash-attn, PyTorch 2.0's scaled_dot_product_attention), so a run published up to 2022
// materialized its scores, unless its framework names a fused kernel (FlashAttention, SDPA,
// cuDNN, Transformer Engine) or is one that had one then (MosaicML's llm-foundry/Composer).
// An unknown year or an unnamed framework is taken to fuse, as Tessera does.
bool framework_materializes_attention(const std::string& framework, int year);

// Whether the framework's weight-gradient GEMMs add into the f32 gradient sums of several
// micro-batches themselves (SimOptions::fused_grad_accumulation): Megatron-LM's
// --gradient-accumulation-fusion (APEX's fused_weight_gradient_dense, on by default from 2022),
// so Megatron-Core and NeMo too; not where DeepSpeed's engine holds the gradients
// (Megatron-DeepSpeed, "Megatron-LM + DeepSpeed ZeRO-3"), nor PyTorch's autograd (FSDP), nor a
// run published before 2022 or in an unknown year.
bool framework_fuses_grad_accumulation(const std::string& framework, int year);

// Whether the framework, training in fp16, holds each parameter's gradient sum over the
// micro-batches in fp16 (2 bytes; SimOptions::f16_gradient_sums) rather than f32 as Tessera's
// runtime does: Megatron-LM's gradient buffers take the parameters' dtype unless
// --accumulate-allreduce-grads-in-fp32 (off by default; forced on only for bf16), and
// DeepSpeed's fp16 engines accumulate into the parameters' fp16 gradients (Megatron-DeepSpeed,
// GPT-NeoX). Not Megatron-Core or NeMo, whose fp16 defaults are not established here, and no
// bf16 run (Megatron and DeepSpeed's BF16_Optimizer sum those in f32).
bool framework_sums_f16_gradients_in_f16(const std::string& framework);

Result<ShardingTerm> parse_sharding_term(const std::string& text);
Result<PrecisionTerm> parse_precision_term(const std::string& text);
Result<RecomputeTerm> parse_recompute_term(const std::string& text);

}  // namespace tessera
