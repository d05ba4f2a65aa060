// The SPMD partition pass: turns the global training graph (written for one device, global
// batch) into the graph one rank runs on its shards, for a Plan.
//
//   TS_ASSIGN_OR_RETURN(Partitioned part, partition(model.graph, plan));
//   part.local            // local shapes; collectives inserted as all_reduce /
//                         // reduce_scatter / all_gather nodes (ir/ops_comm.cc)
//   part.params[i]        // how parameter i is stored, gathered and reduced on each rank
//
// How it works. Inputs are Shard(0) on every data axis, parameters Replicate (or, under
// ZeRO-3, a flat block gathered before use). Nodes are visited in order; for each mesh axis
// the op's sharding rule (ir/ops_sharding.cc) derives the outputs' placements from the
// inputs'. When the rule refuses, the inputs are converted first: a zero fill becomes
// Partial or a local fill for free, Partial becomes Replicate by all_reduce, Shard(0)
// becomes Replicate by all_gather (each such fallback is listed in `fallbacks`). Local
// shapes divide every sharded dim by its axis size; attributes that hold shapes or global
// counts are localized. Parameter gradients come out Partial on the data axes and are
// reduced in buckets right after the node that completes them — all_reduce, or
// reduce_scatter over the ZeRO axes (+ all_reduce of the block across replicas for HSDP).
// Under ZeRO-3 each parameter is all-gathered before its first use in the forward pass
// and again in the backward pass (where recomputed forward nodes run: Node::recompute), each
// gather issued up to Plan::prefetch_bytes ahead. Recomputation itself is a separate pass
// (recompute.h) that lower() applies before this one.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/placement.h"
#include "parallel/layout.h"
#include "parallel/plan.h"

namespace tessera {

// A contiguous block of a flattened tensor, zero-padded to group * block elements: the piece
// of rank `index` in a group of `group` ranks.
struct FlatShard {
  int group = 1;
  int index = 0;
  int64_t numel = 0;  // of the whole tensor
  int64_t block() const { return (numel + group - 1) / group; }
  int64_t offset() const { return std::min<int64_t>(numel, index * block()); }
  int64_t count() const { return std::min<int64_t>(numel, offset() + block()) - offset(); }
};

struct ParamLayout {
  std::string name;
  Shape global_shape;
  TensorLayout layout;          // on the mesh, from Plan::params (tensor axes); no flat block
  Shape local_shape;            // the piece this rank computes with; ZeRO blocks are cut from it
  ValueId global = -1;          // parameter in the global graph
  ValueId local = -1;           // parameter node in the local graph ([block] when params_sharded)
  ValueId local_grad = -1;      // reduced gradient in the local graph ([block] when grads_sharded)
  bool params_sharded = false;  // stored as a flat block over the ZeRO axes (ZeRO-3)
  bool params_on_host =
      false;                   // the block in host memory (Plan::offload params; SourceAttrs::host)
  bool grads_sharded = false;  // reduced into a flat block (ZeRO-2/3)
  bool optim_sharded = false;  // AdamW state and update on a flat block (ZeRO-1/2/3)
};

struct Partitioned {
  Graph local;
  std::vector<ParamLayout> params;       // in global parameter order
  std::vector<ValueId> global_to_local;  // indexed by global ValueId, -1 if none
  ValueId loss = -1;                     // local, replicated (all-reduced) loss
  // The global graph's metrics (Graph::metrics), local and replicated (all-reduced as the loss).
  std::vector<std::pair<std::string, ValueId>> metrics;
  // The local fills of the global graph's backward seed (Graph::loss_seed; a fill is emitted
  // at each reader, so there may be several): what fp16 loss scaling overwrites.
  std::vector<ValueId> loss_seeds;
  std::vector<std::string> fallbacks;              // nodes that needed a non-free conversion
  std::vector<std::vector<NodeId>> buckets;        // gradient collectives issued together, in order
  std::vector<std::vector<Placement>> placements;  // per local value, per mesh axis
};

// The [batch, sequence] of the model's token inputs, which sequence parallelism splits on. A
// graph with integer [B, T] inputs (tokens, targets) gives it itself; a pipeline chunk between
// the first and the last has none and is told.
struct TokenShape {
  int64_t batch = 0, seq = 0;
};
// The shape of `g`'s first integer [B, T] input; {0, 0} when it has none.
TokenShape token_shape(const Graph& g);

// `g` must be a training graph (append_backward). Errors name the node and the axis.
// Inputs and outputs other than the loss and gradients (a pipeline chunk's boundaries) are
// Shard(0) on the data axes and, under sequence parallelism, split on the sequence over the
// tensor axes too: a pipeline chunk sends and receives its sequence piece, as Megatron does.
Result<Partitioned> partition(const Graph& g, const Plan& plan, TokenShape tokens = {});

}  // namespace tessera
