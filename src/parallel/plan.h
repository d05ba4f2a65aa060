// The device mesh and the parallelization plan of a training step.
//
//   Plan p = Plan::data_parallel(4, /*zero=*/3);         // mesh {dp: 4}, FSDP
//   Plan h = Plan::hybrid_sharded(2, 2);                 // mesh {dp_rep: 2, dp_shard: 2}
//   nlohmann::json j = plan_to_json(p);                  // printed by `tessera plan`
//   TS_ASSIGN_OR_RETURN(Plan q, plan_from_json(j));      // accepted by `tessera train --plan`
//
// Data-axis strategies are shardings (DESIGN.md "Parallelism as sharding"): the batch is
// Shard(0) on every data axis; ZeRO stage s shards, along `zero_axes`, the optimizer state
// (s >= 1), the gradients (s >= 2) and the parameters (s >= 3) — each as Shard(0) of the
// flattened tensor, zero-padded to a multiple of the group size. HSDP is ZeRO-3 whose
// zero_axes are a strict subset of the data axes: shard within a group, replicate across.
// `recompute` trades compute for activation memory (parallel/recompute.h).
//
// Tensor axes (`tp`) replicate the batch; parameters are laid out on them by `params`
// (parameter name -> one Placement per mesh axis, Replicate where absent), and the partition
// pass derives every activation's layout from the ops' sharding rules:
//   Plan t = Plan::tensor_parallel(2, 2);                // mesh {dp: 2, tp: 2}
//   t.params["h.0.mlp.up.weight"] = {R, Shard(0)};       // column-parallel [F, C] weight
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "ir/placement.h"
#include "parallel/pipeline_schedule.h"

namespace tessera {

// Activation recomputation (gradient checkpointing): `none` keeps every forward activation
// for the backward pass; `full` keeps only each transformer block's input and recomputes the
// block's forward just before its backward; `selective` keeps the outputs of the FLOP-heavy
// ops (matmuls and attention) and recomputes the cheap ones between them (norms,
// activations, residual adds, reshapes) in the backward (parallel/recompute.h).
enum class RecomputePolicy : uint8_t { none, full, selective };

const char* recompute_name(RecomputePolicy p);  // "none", "full", "selective"
// Errors name the value and the accepted ones.
Result<RecomputePolicy> parse_recompute(std::string_view name);

// ZeRO-Offload (Ren et al. 2021): `optimizer` keeps each rank's f32 master weights and AdamW
// moments in host memory instead of the device's. After the backward pass the gradients go to
// the host, the host's AdamW updates them and the updated parameters come back to the device
// (in its working dtype) before the next forward pass. The device then holds only the
// parameters it computes with, the gradients and the activations. `params` (ZeRO-3 only, the
// ZeRO-Infinity form) offloads the optimizer and also keeps each rank's parameter block in host
// memory: each ZeRO-3 all-gather is fed by a copy of the block over the host link into its
// slot of the gathered tensor, so the device holds parameters only while a gather's output is
// live (the memory plan's arena) and none between steps.
enum class OffloadPolicy : uint8_t { none, optimizer, params };

const char* offload_name(OffloadPolicy p);  // "none", "optimizer", "params"
Result<OffloadPolicy> parse_offload(std::string_view name);

// How context parallelism cuts a sequence over the N ranks of its axis: `contiguous`, rank r
// holds the r-th of N equal chunks (causal attention then gives the last rank the most work:
// its queries see every key); `zigzag`, the sequence is cut into 2N halves and rank r holds
// halves r and 2N-1-r, so every rank's causal work is the same (Megatron's and Llama 3's
// load balancing). Under zigzag the ranks' chunks, in rank order, are the sequence permuted;
// rope and attention take each row's true position, and a model with a learned position
// table (GPT) is refused.
enum class ContextOrder : uint8_t { contiguous, zigzag };

const char* context_order_name(ContextOrder o);  // "contiguous", "zigzag"
Result<ContextOrder> parse_context_order(std::string_view name);

// How attention over a context-parallel sequence meets the other ranks' keys and values:
// `gather`, all-gathered whole before it (Llama 3's form; their gradients reduce-scattered
// back), or `ring`, one chunk at a time passed around the ranks while the attention of the chunk
// in hand runs (ring attention: each rank holds two chunks, not the sequence; the partial
// results merged by their log-sum-exp; in the backward the chunks go round again with their
// gradients' sums).
enum class ContextAttention : uint8_t { gather, ring };

const char* context_attention_name(ContextAttention a);  // "gather", "ring"
Result<ContextAttention> parse_context_attention(std::string_view name);

struct MeshAxis {
  std::string name;
  int size = 1;
  bool operator==(const MeshAxis&) const = default;
};

// Ranks laid out row-major over the axes (the last axis varies fastest).
class Mesh {
 public:
  Mesh() = default;
  explicit Mesh(std::vector<MeshAxis> axes) : axes_(std::move(axes)) {}

  const std::vector<MeshAxis>& axes() const { return axes_; }
  int size() const;                               // number of ranks
  int axis_index(const std::string& name) const;  // -1 when absent
  int axis_size(const std::string& name) const;   // 1 when absent
  std::vector<int> coords(int rank) const;
  int rank_of(const std::vector<int>& coords) const;
  // Index of `rank` within the group spanned by `axes` (row-major over them in mesh order),
  // and the group's size. Ranks with equal coordinates on the other axes form one group.
  int group_index(int rank, const std::vector<std::string>& axes) const;
  int group_size(const std::vector<std::string>& axes) const;
  // A color identifying rank's group over `axes` (equal for ranks of one group).
  int group_color(int rank, const std::vector<std::string>& axes) const;
  std::string to_string() const;  // "{dp_rep: 2, dp_shard: 2}"
  bool operator==(const Mesh&) const = default;

 private:
  std::vector<MeshAxis> axes_;
};

struct Plan {
  Mesh mesh{{{"dp", 1}}};
  std::vector<std::string> data_axes{"dp"};  // the batch is Shard(0) over these
  // ZeRO shards over these (a subset of data_axes, with context_axis: add_context_axis adds it)
  std::vector<std::string> zero_axes{"dp"};
  std::vector<std::string> tensor_axes;  // parameters laid out by `params` over these
  // Per-parameter placements, one per mesh axis; only tensor axes (and the expert axis) may be
  // non-Replicate. (The partition pass places expert weights on the expert axis itself.)
  std::map<std::string, std::vector<Placement>> params;
  int zero = 0;                       // 0: plain data parallel; 1, 2, 3 (FSDP)
  int micro_batches = 1;              // gradient accumulation steps per optimizer step
  int64_t bucket_bytes = 4 << 20;     // gradient reduction bucket size
  int64_t prefetch_bytes = 16 << 20;  // FSDP: gathered parameter bytes in flight ahead of use
  // A gather or scatter of a dim with others before it (sequence parallelism's [B, T / tp, C]):
  // one collective per piece where each rank's piece holds at least this many bytes, else the
  // pieces packed by a transpose into one collective (parallel/partition.cc).
  int64_t piece_bytes = 1 << 20;
  RecomputePolicy recompute = RecomputePolicy::none;  // activation recomputation
  // The blocks `recompute` applies to: the first recompute_layers (0 .. n-1) of the model;
  // -1, every block. Recomputing only as many blocks as the memory needs costs less (Megatron's
  // --recompute-num-layers with the block method).
  int recompute_layers = -1;
  OffloadPolicy offload = OffloadPolicy::none;  // where the optimizer state (and params) live
  // The fusion pass (parallel/fuse.h): GEMM epilogues fused into their products (a bias, bias +
  // GELU, GELU's gradient and the bias gradients) and each residual add into the layernorm
  // after it. Off, each runs as its own op (a bf16 product is then rounded before its bias is
  // added).
  bool fuse = true;
  // Sequence parallelism (Korthikanti et al. 2022): on the tensor axes, activations of shape
  // [B, T, ...] between the tensor-parallel regions (norms, residual adds) are split on T; a
  // row-parallel output is reduce-scattered onto T instead of all-reduced, and gathered again
  // before the next column-parallel matmul.
  bool sequence_parallel = false;
  // Pipeline parallelism: the ranks along `pipeline_axis` ("" for none) are the stages; the
  // model is cut into stages x virtual_stages chunks of whole blocks (stage_layers blocks per
  // chunk in model order; empty: balanced by the cost model, parallel/pipeline_stages.h), and
  // the micro-batches flow through them in `schedule`'s order. Every other axis works within
  // a stage. Gradients are reduced once per step, after the last micro-batch.
  std::string pipeline_axis;
  // Context parallelism: the ranks along `context_axis` ("" for none) split the sequence of
  // every example into equal contiguous chunks (the token inputs are Shard(1) on it). Ops
  // outside attention work on their chunk; RoPE takes each chunk's positions; attention
  // gathers the keys and values of the whole sequence over the axis (Llama 3's all-gather
  // form) and masks by global position, and its key and value gradients are reduce-scattered
  // back. Parameters are replicated on the axis and their gradients, partial sums over the
  // chunks, are reduced with the data axes'.
  std::string context_axis;
  ContextOrder context_order = ContextOrder::contiguous;
  ContextAttention context_attention = ContextAttention::gather;
  // Expert parallelism: the expert axis ("" for none) is one of the data axes (the batch is
  // split over it) on which the expert parameters of mixture-of-experts layers
  // (SourceAttrs::experts: [E, ...]) are Shard(0), each rank holding E / n experts. The
  // partition pass moves the experts' token buffers from their split by token slots to their
  // split by experts and back with all_to_all (dispatch and combine). Every other parameter is
  // replicated on it, as on any data axis. ZeRO does not shard over it (zero_axes exclude it).
  std::string expert_axis;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  int virtual_stages = 1;
  std::vector<int> stage_layers;

  static Plan data_parallel(int n, int zero = 0);
  // HSDP: ZeRO-3 within a group of `shards`, replicated over `replicas`; with tp > 1 inside
  // each tensor shard, mesh {dp_rep, dp_shard, tp}.
  static Plan hybrid_sharded(int replicas, int shards, int tp = 1);
  // mesh {dp: dp, tp: tp} (tp innermost: consecutive ranks), every parameter Replicate until
  // `params` says otherwise.
  static Plan tensor_parallel(int dp, int tp, int zero = 0);
  // mesh {pp: pp, dp: dp, tp: tp} (pp outermost: a stage's ranks are consecutive), 1F1B.
  static Plan pipeline_parallel(int pp, int dp, int tp, int zero = 0);

  // Data axes ZeRO does not shard over: HSDP's replica groups, and the expert axis (on which
  // every parameter but the experts' is replicated: their gradient blocks are all-reduced over
  // it, as HSDP's replicas'); empty otherwise.
  std::vector<std::string> replica_axes() const;
  // HSDP: ZeRO within groups of the data ranks, replicated across them (replica axes besides the
  // expert axis).
  bool hsdp() const;
  int zero_group() const { return mesh.group_size(zero_axes); }
  int data_group() const { return mesh.group_size(data_axes); }
  bool shards_optimizer() const { return zero >= 1 && zero_group() > 1; }
  bool shards_grads() const { return zero >= 2 && zero_group() > 1; }
  // (Offloaded parameters are gathered from host memory even on a group of one rank.)
  bool shards_params() const {
    return zero >= 3 && (zero_group() > 1 || offload == OffloadPolicy::params);
  }
  // Both policies offload the optimizer; `params` its parameter blocks too.
  bool offloads_optimizer() const { return offload != OffloadPolicy::none; }
  bool offloads_params() const { return offload == OffloadPolicy::params; }
  int tensor_group() const { return mesh.group_size(tensor_axes); }
  int stages() const { return pipeline_axis.empty() ? 1 : mesh.axis_size(pipeline_axis); }
  int chunks() const { return stages() * virtual_stages; }  // model chunks over all stages
  int context_group() const { return context_axis.empty() ? 1 : mesh.axis_size(context_axis); }
  int expert_group() const { return expert_axis.empty() ? 1 : mesh.axis_size(expert_axis); }
  // `axes` and the context axis (when there is one), in mesh order: the groups over which
  // gradients and the loss are partial sums.
  std::vector<std::string> with_context_axis(const std::vector<std::string>& axes) const;
  // The axes the gradient norm's sum of squares is all-reduced over (mesh order): the ZeRO
  // axes when gradients or optimizer state are sharded, and the tensor axes. Empty: every
  // rank already holds every gradient element.
  std::vector<std::string> grad_norm_axes() const;
  // The placements of parameter `name`: its `params` entry, or Replicate on every axis.
  std::vector<Placement> placements_of(const std::string& name) const;
  // "dp=4 zero=3" / "dp_rep=2 x dp_shard=2 zero=3 (HSDP)" / "dp=2 zero=0 recompute=full"
  std::string describe() const;
};

// Adds a context-parallel axis "cp" of `cp` ranks to `p` (inside the data and pipeline axes,
// outside the tensor axes: a tensor group's ranks stay consecutive) and names it the context
// axis; cp == 1 leaves the plan as it is. Errors when the plan has a context axis already or
// places parameters (their placements would need one more axis).
Status add_context_axis(Plan* p, int cp);

// Adds an expert-parallel axis "ep" of `ep` ranks to `p` (inside the data, pipeline and context
// axes, outside the tensor axes), a data axis that ZeRO does not shard over, and names it the
// expert axis; ep == 1 leaves the plan as it is. Errors as add_context_axis.
Status add_expert_axis(Plan* p, int ep);

// A rank group named by its mesh axes, as collectives' GroupAttrs::axes and MeshComms keys hold it:
// {"dp_rep", "dp_shard"} <-> "dp_rep,dp_shard".
std::string axes_key(const std::vector<std::string>& axes);
std::vector<std::string> axes_of_key(const std::string& key);

// Checks axis names and sizes, that every axis is a data, a tensor, the pipeline or the
// context axis (one of them), that the expert axis is a data axis outside zero_axes,
// zero_axes ⊆ data_axes, parameter placements (one per axis, Shard only on tensor axes and the
// expert axis), the
// ZeRO stage, offload (not with pipeline stages yet), and (when world > 0) that the mesh has
// exactly `world` ranks.
Status validate(const Plan& p, int world = 0);

// "R", "P", "S(d)" (Placement::to_string's form); errors name the text.
Result<Placement> parse_placement(std::string_view text);

nlohmann::json plan_to_json(const Plan& p);
// Errors name the key; unknown keys are refused (typos would otherwise be ignored). Absent
// keys keep their defaults (a file without "recompute" loads as recompute none); a mesh axis
// named "tp" is a tensor axis unless "tensor_axes" says otherwise, every other a data axis.
// "params": {"h.0.mlp.up.weight": {"tp": "S(0)"}} places a parameter by axis name.
Result<Plan> plan_from_json(const nlohmann::json& j);
Result<Plan> load_plan(const std::string& path);

}  // namespace tessera
