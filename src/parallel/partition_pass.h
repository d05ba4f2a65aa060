// The partition pass's internals (parallel/partition.h is the interface), shared by its
// source files: partition.cc (the walk over the graph, conversions, ZeRO gathers and gradient
// buckets) and partition_layouts.cc (vocab and sequence parallelism).
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "parallel/partition.h"
#include "parallel/redistribute.h"

namespace tessera::partition_detail {

using Placements = std::vector<Placement>;  // one per mesh axis

// in_backward_pass (ir/graph.h): under ZeRO-3 recomputed forward nodes read the parameters
// gathered for the backward pass, so the forward gathers are freed after the forward pass.

class Pass {
 public:
  Pass(const Graph& g, const Plan& plan, TokenShape tokens)
      : g_(g),
        plan_(plan),
        seq_b_(tokens.batch > 0 ? tokens.batch : -1),
        seq_t_(tokens.seq > 0 ? tokens.seq : -1) {
    for (const MeshAxis& a : plan.mesh.axes()) sizes_.push_back(a.size);
    out_.global_to_local.assign(g.values().size(), -1);
    gpl_.assign(g.values().size(), Placements(sizes_.size(), Placement::replicate()));
    batch_free_ = input_free_values(g);
  }

  Result<Partitioned> run();

 private:
  Status visit(NodeId id);
  Result<ValueId> emit(OpKind op, Attrs attrs, std::vector<ValueId> ins, const Node& like,
                       const std::vector<Placements>& out_pl, const std::vector<Shape>& expect);
  Result<Shape> local_shape(const Shape& global, const Placements& pl,
                            const std::string& what) const;
  Result<ValueId> to_replicate(ValueId local, const Shape& global, int axis, const Node& like);
  // A value whole on mesh axis `axis` as a partial sum there, for free: each rank's n-th.
  Result<ValueId> to_partial(ValueId local, size_t axis, const Node& like);
  // Converts a local value laid out as its recorded placements into `target` (redistribute(),
  // each step lowered to collectives and the reshapes/transposes that pack them). `bucket`
  // collects the collectives emitted.
  Result<ValueId> convert(ValueId local, const Shape& global, const Placements& target,
                          const Node& like, std::vector<NodeId>* bucket = nullptr);
  Result<ValueId> lower_step(const CommStep& s, ValueId v, const Node& like,
                             std::vector<NodeId>* bucket);
  // The rank group over the mesh axes `axes` (indices), and this rank's index in it, from
  // axis_index: row-major over the axes in mesh order, as a dim split over several axes is laid
  // out (parallel/layout.h).
  GroupAttrs group_over(const std::vector<size_t>& axes) const;
  Result<ValueId> index_in(const GroupAttrs& group, const Node& like);
  // Vocab parallelism: the mesh axes (of more than one rank) that split the vocabulary of an
  // embedding or cross-entropy node, and its lowering to the vocab-parallel ops (ops_vocab.cc).
  std::vector<size_t> vocab_axes(const Node& n, const std::vector<ValueId>& ins,
                                 std::vector<Placements>* out_pl);
  Result<std::vector<ValueId>> lower_vocab(const Node& n, Attrs a, const std::vector<ValueId>& ins,
                                           const std::vector<Placements>& out_pl,
                                           const std::vector<Shape>& expect,
                                           const std::vector<size_t>& axes);
  // Expert parallelism (partition_experts.cc): on the expert axis k, where the op's rule refused
  // the inputs' placements `pk`, moves one activation to another split dim that `try_rule`
  // (which fills `res`) accepts, by all_to_all; sets out_pl's axis k. False: no such move.
  Result<bool> move_to_experts(const Node& n, size_t k, const Placements& pk,
                               const std::vector<Placements>& lazy,
                               const std::vector<TensorType>& in_types,
                               const std::function<bool(const Placements&)>& try_rule,
                               const std::vector<Placement>& res, std::vector<ValueId>* ins,
                               std::vector<Placements>* out_pl);
  // Context parallelism (partition_context.cc): the mesh axes (of more than one rank) that split
  // the sequence of a rope or attention node, and its lowering: the node with its sequence
  // block index, attention with the keys and values gathered over those axes (their gradients
  // reduce-scattered back), or passed round them (ring).
  std::vector<size_t> sequence_block_axes(const Node& n, const std::vector<ValueId>& ins) const;
  Result<ValueId> reorder_halves(ValueId v, Shape shape, int dim, int64_t n, bool to_sequence,
                                 const Node& like);
  Result<std::vector<ValueId>> lower_sequence_blocks(const Node& n, const Attrs& given,
                                                     std::vector<ValueId> ins,
                                                     const std::vector<Placements>& out_pl,
                                                     const std::vector<Shape>& expect,
                                                     const std::vector<size_t>& axes);
  // Plan::context_attention ring: attention (or its gradient) one key chunk at a time round
  // `group`; `ins` ends with the queries' block index.
  Result<std::vector<ValueId>> lower_ring_attention(const Node& n, const Attrs& a,
                                                    const GroupAttrs& group,
                                                    std::vector<ValueId> ins,
                                                    const std::vector<Placements>& out_pl,
                                                    const std::vector<Shape>& expect);
  // Sequence parallelism on tensor axis k, for a node whose sharding rule refused the inputs'
  // placements `pk` (DESIGN.md "Tensor layouts and redistribution"): first the sequence dim of
  // [B, T, ...] activations (Partial reduce-scattered onto it, Replicate sliced for free),
  // then gathering sequence-split inputs while the others (parameters) stay as they are.
  // Returns true with `ins` converted and `res` the rule's output placements.
  Result<bool> split_sequence(const Node& n, size_t k, const Placements& pk,
                              const std::vector<TensorType>& in_types,
                              const std::vector<TensorType>& out_types, std::vector<ValueId>* ins,
                              std::vector<Placement>* res);
  // convert() of one axis for split_sequence, shared by the consumers of a value: a sequence
  // gathered for two matmuls of one pass is gathered once, a split is made once.
  // [B, T, ...]: an activation with the sequence in dim 1.
  bool is_sequence(const Shape& s) const {
    return seq_t_ > 0 && s.rank() >= 2 && s[0] == seq_b_ && s[1] == seq_t_;
  }
  Result<ValueId> sequence_convert(ValueId v, const Shape& global, size_t k, Placement p,
                                   const Node& like);
  // How a graph input or boundary output of type `t` is laid out: Shard(0) on the data axes,
  // and under sequence parallelism floating [B, T, ...] activations Shard(1) on the tensor axes
  // too ([B*T, ...] rows: Shard(0)).
  Placements boundary_placements(const TensorType& t) const;
  Status issue_gathers(NodeId upto);
  Result<ValueId> issue_gather(size_t param, bool backward, const Node& like);
  Status flush_bucket();

  const Graph& g_;
  const Plan& plan_;
  // Sequence parallelism: the global batch and sequence length ([B, T] token inputs).
  int64_t seq_b_ = -1, seq_t_ = -1;
  Partitioned out_;
  std::vector<int> sizes_;
  std::vector<Placements> gpl_;   // placement of each global value
  std::vector<char> batch_free_;  // per global value: computed from parameters and constants

  // ZeRO-3 gathers: (first use node, param index, backward), in issue order.
  struct Use {
    NodeId node;
    size_t param;
    bool backward;
  };
  std::vector<Use> uses_;
  size_t next_use_ = 0;
  std::deque<std::pair<NodeId, int64_t>> in_flight_;  // (first use, bytes)
  std::map<std::pair<size_t, bool>, ValueId> gathered_;
  std::map<ValueId, size_t> param_index_;  // global param -> index in out_.params

  // Fills read only by later nodes are emitted at each reader, already in the placement the
  // reader needs: a Replicate fill of the global shape would otherwise be planned (and run)
  // before being relabeled — for a [B, T, C] zero under data parallelism, B times too large.
  std::set<ValueId> lazy_fills_;
  std::map<ValueId, size_t> grad_of_;  // global grad value -> param index
  // Ids (global value) of an embedding whose table is split on the vocabulary -> the axes that
  // split it: the embedding's gradient (same ids) takes the same split.
  std::map<ValueId, std::vector<size_t>> vocab_ids_;
  // Sequence parallelism: the conversions already emitted (value, target placements, pass ->
  // converted value).
  std::map<std::string, ValueId> seq_converted_;
  // Expert parallelism: the all-to-all moves already emitted (local value and target
  // placements -> moved value), shared by the forward and backward passes.
  std::map<std::string, ValueId> expert_moved_;
  std::vector<size_t> pending_;  // params whose gradient waits in the open bucket
  int64_t pending_bytes_ = 0;
};

}  // namespace tessera::partition_detail
