// The search for parameter placements on a tensor axis (DESIGN.md "Tensor layouts and
// redistribution": the Megatron layout is found, not spelled). Model code never names a
// layout; this pass tries placements of one transformer block's parameters, partitions the
// graph under each, and keeps the cheapest (each kind of block in turn: T5 has an encoder and
// a decoder block):
//
//   SearchCost cost{.flops_per_byte = 2000};          // device FLOP/s per tp-link byte/s
//   TS_ASSIGN_OR_RETURN(BlockLayout b, search_block_layout(one_layer_graph, plan, cost));
//   plan.params = expand_block_layout(b, full_graph, plan);   // the same choice in every block
//
// Every matrix of block 0 (Node::layer == 0) is tried as Replicate, Shard(0) and Shard(1) on
// the tensor axis (all combinations: 3^k, k = 4 for GPT, 7 for LLaMA); for each, every vector
// (biases, norm weights) starts as Shard(0) where its module's matrix is column-split (a bias
// follows its matrix, "h.0.attn.qkv.bias" with "h.0.attn.qkv.weight") and Replicate otherwise,
// and is then flipped, one at a time, where that lowers the cost. A candidate's cost is
// the local FLOPs of one step plus flops_per_byte times the bytes the tensor axis sends (the
// step time on a roofline in FLOP units), ties broken by parameter bytes per rank; with a
// memory budget (SearchCost::state_budget_bytes: simulate and validate give the device's), a
// candidate whose parameters' state exceeds it loses to every one that fits. A
// candidate the shapes cannot take (a degree that does not divide heads or widths) is
// skipped; when every sharded one is, the search is an error naming a dim that refused and
// the degrees that divide it. A parameter of any block gets the placement of the searched
// parameter whose name is the same but for the block number ("h.7.attn.qkv.weight" that of
// "h.0.attn.qkv.weight"); blocks whose names differ otherwise are of different kinds, each
// searched on its first block. A block of more than 4 matrices (3^4 combinations; GPT's) is
// searched a module at a time (LLaMA: attention, feed-forward; T5's decoder: self-attention,
// cross-attention, feed-forward), each module's combinations with the others fixed, twice:
// on every LLaMA preset at tp 2/4/8, with and without sequence parallelism, at 2,048 and
// 8,192 tokens, this finds what all 3^7 combinations found, from 654 candidates instead of
// 6,565 (measured before shared weights' gradients became batch-folding matmuls, which made
// whole weights cheaper under sequence parallelism; not measured again since).
//
// With the block chosen, each matrix outside the blocks (the embedding tables and LM head)
// tries Shard(0) and Shard(1), one at a time, kept where it lowers the cost: a table split on
// its rows is the vocab-parallel embedding, and a tied or separate head split on the
// vocabulary gives vocab-parallel logits and cross-entropy (partition.h).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "models/model.h"
#include "parallel/plan.h"

namespace tessera {

struct SearchCost {
  double flops_per_byte = 2000;  // FLOP/s of a device over bytes/s of a tensor-axis link
  // Memory: the bytes a rank may hold for its parameters' state (0: no limit), the state's
  // bytes per parameter element (parameters, gradients and optimizer state, as the plan's
  // precision and ZeRO stage store them: state_bytes_per_element below) and the blocks a rank
  // holds (its pipeline stage's). A candidate whose state (the searched blocks' times blocks
  // over the kinds searched, plus the parameters outside the blocks) exceeds the budget loses
  // to any that fits: whole weights
  // can cost less time than split ones (no tensor-axis traffic under sequence parallelism)
  // and hold tp times the bytes.
  double state_budget_bytes = 0;
  double state_bytes_per_element = 16;
  double blocks = 1;
};

// The bytes a rank holds per parameter element of `plan` with parameters of `dtype`: the
// parameter itself (divided over the ZeRO group at stage 3), its gradient (an f32 accumulator
// with several micro-batches; at stage 2 and above divided) and AdamW's f32 moments plus, for
// bf16/f16, the f32 master (divided at stage 1 and above; none on the device where the plan
// offloads the optimizer).
double state_bytes_per_element(const Plan& plan, DType dtype);

struct BlockLayout {
  // The parameters of the first block of each kind, in graph order, and their placements
  // (one per mesh axis); kind_sizes[k] of them are kind k's (GPT: one kind; T5: the encoder's
  // block, then the decoder's).
  std::vector<std::string> names;
  std::vector<std::vector<Placement>> placements;
  std::vector<size_t> kind_sizes;
  // The parameters outside the blocks (embeddings, LM head, final norm), in graph order.
  std::vector<std::string> outer_names;
  std::vector<std::vector<Placement>> outer_placements;
  // Why a parameter outside the blocks could not split (a vocabulary the degree does not
  // divide), one line each.
  std::vector<std::string> notes;
  double cost = 0;          // FLOPs + flops_per_byte * tensor-axis bytes, per step
  double state_bytes = 0;   // the parameters' state per rank (SearchCost's estimate)
  bool fits = true;         // state_bytes within SearchCost::state_budget_bytes
  double local_flops = 0;   // per rank, per micro-batch
  double tensor_bytes = 0;  // sent per rank per micro-batch over the tensor axes
  int candidates = 0;       // partitions tried
};

// `g` is a training graph (a one-block model is enough and fast); `plan` has exactly one
// tensor axis. Errors name what is missing.
Result<BlockLayout> search_block_layout(const Graph& g, const Plan& plan, const SearchCost& cost);

// The searched placements applied to every block of `g` (by name but for the block number),
// and the placements outside the blocks, as Plan::params.
Result<std::map<std::string, std::vector<Placement>>> expand_block_layout(const BlockLayout& b,
                                                                          const Graph& g,
                                                                          const Plan& plan);

// The search on a one-block copy of model `cfg` (global micro-batch `batch` x `seq`), its
// choice written into plan->params for every block of `full` (the model's training graph).
Result<BlockLayout> place_tensor_parallel(const ModelConfig& cfg, int64_t batch, int64_t seq,
                                          const Graph& full, const SearchCost& cost, Plan* plan);

}  // namespace tessera
