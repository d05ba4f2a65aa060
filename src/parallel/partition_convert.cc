// Layout conversions in the partition pass (parallel/partition_pass.h): a value's placements
// changed by the CommSteps redistribute() plans, each lowered to local-graph nodes.
#include <algorithm>

#include "parallel/partition_pass.h"
#include "parallel/redistribute.h"

namespace tessera::partition_detail {

Result<ValueId> Pass::to_replicate(ValueId local, const Shape& global, int axis, const Node& like) {
  Placements pl = out_.placements[static_cast<size_t>(local)];
  const Placement p = pl[static_cast<size_t>(axis)];
  pl[static_cast<size_t>(axis)] = Placement::replicate();
  if (sizes_[static_cast<size_t>(axis)] > 1)
    out_.fallbacks.push_back(like.scope + " " + op_name(like.op) + ": " + p.to_string() +
                             " -> R on " + plan_.mesh.axes()[static_cast<size_t>(axis)].name);
  return convert(local, global, pl, like);
}

Result<ValueId> Pass::to_partial(ValueId local, size_t axis, const Node& like) {
  Placements pl = out_.placements[static_cast<size_t>(local)];
  pl[axis] = Placement::partial();
  const ScalarAttrs share{.value = 1.0 / static_cast<double>(sizes_[axis])};
  return emit(OpKind::scale, share, {local}, like, {pl}, {});
}

Result<ValueId> Pass::convert(ValueId local, const Shape& global, const Placements& target,
                              const Node& like, std::vector<NodeId>* bucket) {
  // On an axis of one rank every placement holds the same data: relabel it first, so that a
  // dim split over it and another axis (dp of 1 and ep) is not gathered over the other to
  // undo it.
  Placements& have = out_.placements[static_cast<size_t>(local)];
  for (size_t k = 0; k < have.size(); ++k)
    if (sizes_[k] == 1) have[k] = target[k];
  const TensorLayout from{global, have, {}};
  Result<std::vector<CommStep>> steps = redistribute(from, {global, target, {}}, plan_.mesh);
  if (!steps.ok()) return steps.status().with_context("partition: '" + like.scope + "'");
  for (const CommStep& s : steps.value()) {
    if (s.group == 1) {  // one rank holds everything along the axis: relabel for free
      out_.placements[static_cast<size_t>(local)] = s.after.axes;
      continue;
    }
    TS_ASSIGN_OR_RETURN(local, lower_step(s, local, like, bucket));
  }
  return local;
}

// One CommStep as local-graph nodes. A gather or scatter on dim d of a piece [outer, mid,
// inner] is a flat collective of contiguous blocks; when outer > 1 it is `outer` of them, one
// per piece (GroupAttrs::segments: sequence parallelism's gathers of [B, T / tp, C] with
// B > 1), where each rank's piece holds at least Plan::piece_bytes and the split does not pad.
// Otherwise the blocks are packed ([outer, n, m] -> [n, outer, m]) before a reduce-scatter
// and unpacked after a gather: for small pieces a transpose costs less than a collective's
// latency per piece (gpt-mini, tp 2, 16 x 128 tokens on CPU ranks: 64 KiB pieces, 762 ms a
// step packed, 812 ms piece by piece; gpt2-small at 4 x 1024, 1.5 MiB pieces: the same).
Result<ValueId> Pass::lower_step(const CommStep& s, ValueId v, const Node& like,
                                 std::vector<NodeId>* bucket) {
  GroupAttrs a{.axes = axes_key(s.axes), .size = s.group};
  const Placements& before = s.before.axes;
  const Placements& after = s.after.axes;
  auto reshape = [&](ValueId x, const Shape& to, const Placements& pl) {
    return emit(OpKind::reshape, ShapeAttrs{to.dims()}, {x}, like, {pl}, {to});
  };
  // A permutation that keeps the order of the dims longer than 1 moves no element: a reshape
  // (a view), not a transpose (ep 8 of 8 experts: each rank's block is one expert).
  auto permute = [&](ValueId x, const std::vector<int64_t>& perm,
                     const Placements& pl) -> Result<ValueId> {
    const Shape& from = out_.local.type(x).shape;
    std::vector<int64_t> to, moved;
    for (int64_t p : perm) {
      to.push_back(from[static_cast<int>(p)]);
      if (from[static_cast<int>(p)] > 1) moved.push_back(p);
    }
    if (std::is_sorted(moved.begin(), moved.end())) {
      if (to == from.dims()) return x;
      return reshape(x, Shape(to), pl);
    }
    return emit(OpKind::transpose, TransposeAttrs{perm}, {x}, like, {pl}, {});
  };
  auto swap01 = [&](ValueId x, const Placements& pl) { return permute(x, {1, 0, 2}, pl); };
  auto collective = [&](OpKind op, ValueId x, const Shape& out) -> Result<ValueId> {
    TS_ASSIGN_OR_RETURN(ValueId y, emit(op, a, {x}, like, {after}, {out}));
    if (bucket) bucket->push_back(out_.local.value(y).producer);
    return y;
  };
  const Shape& in = s.in_shape;
  int64_t outer = 1;
  for (int d = 0; d < s.dim; ++d) outer *= in[d];
  // Whether a gather or scatter whose rank's block holds `block` of the `whole` elements runs
  // piece by piece: outer pieces, no padding, each at least Plan::piece_bytes.
  auto by_piece = [&](int64_t block, int64_t whole) {
    const int64_t piece_bytes = block / outer * dtype_size(out_.local.type(v).dtype);
    return outer > 1 && block * s.group == whole && piece_bytes >= plan_.piece_bytes;
  };
  switch (s.kind) {
    case CommStep::all_reduce:
      return collective(OpKind::all_reduce, v, in);
    case CommStep::all_gather: {
      TS_ASSIGN_OR_RETURN(ValueId flat, reshape(v, Shape{in.numel()}, before));
      a.shape = s.out_shape.dims();
      if (outer == 1) return collective(OpKind::all_gather, flat, s.out_shape);
      const int64_t rest = in.numel() / outer;
      if (by_piece(in.numel(), s.out_shape.numel())) {
        a.shape = {outer, s.group, rest};
        a.segments = outer;
        TS_ASSIGN_OR_RETURN(ValueId g,
                            collective(OpKind::all_gather, flat, Shape{outer, s.group, rest}));
        return reshape(g, s.out_shape, after);
      }
      a.shape = {s.group, outer, rest};
      TS_ASSIGN_OR_RETURN(ValueId g,
                          collective(OpKind::all_gather, flat, Shape{s.group, outer, rest}));
      TS_ASSIGN_OR_RETURN(ValueId t, swap01(g, after));
      return reshape(t, s.out_shape, after);
    }
    case CommStep::reduce_scatter: {
      ValueId flat;
      if (outer == 1 || by_piece(s.out_shape.numel(), in.numel())) {
        a.segments = outer;
        TS_ASSIGN_OR_RETURN(flat, reshape(v, Shape{in.numel()}, before));
      } else {
        TS_ASSIGN_OR_RETURN(
            ValueId x3, reshape(v, Shape{outer, s.group, in.numel() / outer / s.group}, before));
        TS_ASSIGN_OR_RETURN(ValueId t, swap01(x3, before));
        TS_ASSIGN_OR_RETURN(flat, reshape(t, Shape{in.numel()}, before));
      }
      TS_ASSIGN_OR_RETURN(ValueId r,
                          collective(OpKind::reduce_scatter, flat, Shape{s.out_shape.numel()}));
      return reshape(r, s.out_shape, after);
    }
    case CommStep::all_to_all: {
      // Dim e (scattered) cut into n blocks, the block index brought to the front: block j is
      // rank j's. What arrives in block i is rank i's piece of dim d (gathered): the block
      // index goes back in front of dim d and merges with it.
      const int d = s.dim, e = s.to_dim, r = in.rank();
      const int64_t n = s.group;
      std::vector<int64_t> split = in.dims();
      split[static_cast<size_t>(e)] /= n;
      split.insert(split.begin() + e, n);
      std::vector<int64_t> front{e};
      for (int i = 0; i <= r; ++i)
        if (i != e) front.push_back(i);
      TS_ASSIGN_OR_RETURN(ValueId x, reshape(v, Shape(split), before));
      TS_ASSIGN_OR_RETURN(x, permute(x, front, before));
      TS_ASSIGN_OR_RETURN(x, collective(OpKind::all_to_all, x, out_.local.type(x).shape));
      std::vector<int64_t> back;  // packed dims: 0 the source rank, 1 + j the piece's dim j
      for (int j = 0; j < d; ++j) back.push_back(1 + j);
      back.push_back(0);
      for (int j = d; j < r; ++j) back.push_back(1 + j);
      TS_ASSIGN_OR_RETURN(x, permute(x, back, after));
      return reshape(x, s.out_shape, after);
    }
    case CommStep::local_slice: {  // this rank's block: its coordinate picks it
      TS_ASSIGN_OR_RETURN(
          ValueId index,
          emit(OpKind::axis_index, GroupAttrs{.axes = a.axes, .size = s.group}, {}, like,
               {Placements(sizes_.size(), Placement::replicate())}, {Shape{}}));
      return emit(OpKind::shard_slice, ShardSliceAttrs{.axis = s.dim, .blocks = s.group},
                  {v, index}, like, {after}, {s.out_shape});
    }
    default:
      return error("partition: '" + like.scope + "' " + op_name(like.op) + " needs its input " +
                       s.before.to_string(plan_.mesh) + " as " + s.after.to_string(plan_.mesh) +
                       ", a " + comm_step_name(s.kind) + " the partition pass does not emit yet",
                   "place the parameters so that the ops' sharding rules accept them");
  }
}

}  // namespace tessera::partition_detail
