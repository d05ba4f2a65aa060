// Context parallelism in the partition pass (parallel/partition_pass.h): rope and attention on
// a sequence split over mesh axes. Every other op works on its chunk of the sequence as its
// sharding rule says; these two need the chunk's place in the whole sequence, which the graph
// (the same on every rank) takes from axis_index, and attention needs every key and value.
#include <algorithm>

#include "parallel/partition_pass.h"

namespace tessera::partition_detail {

std::vector<size_t> Pass::sequence_block_axes(const Node& n,
                                              const std::vector<ValueId>& ins) const {
  int dim = -1;                       // the sequence dim of input 0
  if (n.op == OpKind::rope) dim = 1;  // [B,T,H,D]
  if (n.op == OpKind::attention || n.op == OpKind::attention_grad) dim = 2;  // [B,H,T,D]
  std::vector<size_t> axes;
  if (dim < 0) return axes;
  const Placements& pl = out_.placements[static_cast<size_t>(ins[0])];
  for (size_t k = 0; k < sizes_.size(); ++k)
    if (sizes_[k] > 1 && pl[k].is_shard(dim)) axes.push_back(k);
  return axes;
}

namespace {

// The half of the sequence that the z-th half of a zigzag order over n ranks is: rank z / 2
// holds halves z / 2 and 2n-1-z / 2, in that order.
int64_t true_half(int64_t z, int64_t n) { return z % 2 == 0 ? z / 2 : 2 * n - 1 - z / 2; }

}  // namespace

// v (local, `shape`) with its halves along `dim` reordered: from the ranks' zigzag order to the
// sequence's (to_sequence), or back. Slices and a concat, placements kept.
Result<ValueId> Pass::reorder_halves(ValueId v, Shape shape, int dim, int64_t n, bool to_sequence,
                                     const Node& like) {
  const Placements pl = out_.placements[static_cast<size_t>(v)];
  const int64_t h = shape[dim] / (2 * n);
  std::vector<ValueId> parts(static_cast<size_t>(2 * n));
  for (int64_t z = 0; z < 2 * n; ++z) {
    const int64_t from = to_sequence ? z : true_half(z, n), to = to_sequence ? true_half(z, n) : z;
    TS_ASSIGN_OR_RETURN(
        parts[static_cast<size_t>(to)],
        emit(OpKind::slice, SliceAttrs{.axis = dim, .start = from * h, .end = (from + 1) * h}, {v},
             like, {pl}, {}));
  }
  return emit(OpKind::concat, ConcatAttrs{.axis = dim}, std::move(parts), like, {pl}, {shape});
}

Result<std::vector<ValueId>> Pass::lower_sequence_blocks(const Node& n, const Attrs& given,
                                                         std::vector<ValueId> ins,
                                                         const std::vector<Placements>& out_pl,
                                                         const std::vector<Shape>& expect,
                                                         const std::vector<size_t>& axes) {
  const GroupAttrs group = group_over(axes);
  // A zigzag order (Plan::context_order) on the context axis: the chunk's rows are two halves.
  const bool zigzag =
      plan_.context_order == ContextOrder::zigzag && group.axes == plan_.context_axis;
  Attrs a = given;
  if (zigzag && n.op == OpKind::rope) attrs_as<RopeAttrs>(a).zigzag = group.size;
  if (zigzag && n.op != OpKind::rope) attrs_as<AttentionAttrs>(a).zigzag = group.size;
  TS_ASSIGN_OR_RETURN(ValueId block, index_in(group, n));
  if (n.op == OpKind::rope) {
    ins.push_back(block);
    TS_ASSIGN_OR_RETURN(ValueId y, emit(OpKind::rope, a, std::move(ins), n, out_pl, expect));
    return std::vector<ValueId>{y};
  }
  if (plan_.context_attention == ContextAttention::ring) {
    ins.push_back(block);
    return lower_ring_attention(n, a, group, std::move(ins), out_pl, expect);
  }
  // Attention: the whole sequence's keys and values (Llama 3's all-gather form of context
  // parallelism: each rank's queries meet every key, the causal mask by global position).
  // (Gathered in rank order, a zigzag order's halves are put back in the sequence's.)
  auto whole = [&](size_t i) -> Result<ValueId> {
    Placements target = out_.placements[static_cast<size_t>(ins[i])];
    for (size_t k : axes) target[k] = Placement::replicate();
    TS_ASSIGN_OR_RETURN(ValueId w, convert(ins[i], g_.type(n.inputs[i]).shape, target, n));
    if (!zigzag) return w;
    // (The shape by value: emitting nodes may move the local graph's value table.)
    return reorder_halves(w, out_.local.type(w).shape, 2, group.size, true, n);
  };
  TS_ASSIGN_OR_RETURN(ins[1], whole(1));
  TS_ASSIGN_OR_RETURN(ins[2], whole(2));
  ins.push_back(block);
  if (n.op == OpKind::attention) {
    TS_ASSIGN_OR_RETURN(ValueId y, emit(OpKind::attention, a, std::move(ins), n, out_pl, expect));
    return out_.local.producer(y).outputs;
  }
  // attention_grad: dk and dv come out whole-sequence partial sums (each rank's queries' part),
  // reduce-scattered onto the chunks the rule promised.
  std::vector<Placements> pl = out_pl;
  std::vector<Shape> shapes = expect;
  for (size_t o : {size_t{1}, size_t{2}}) {
    for (size_t k : axes) pl[o][k] = Placement::partial();
    TS_ASSIGN_OR_RETURN(shapes[o], local_shape(g_.type(n.outputs[o]).shape, pl[o], n.scope));
  }
  TS_ASSIGN_OR_RETURN(ValueId first,
                      emit(OpKind::attention_grad, a, std::move(ins), n, pl, shapes));
  std::vector<ValueId> outs = out_.local.producer(first).outputs;
  for (size_t o : {size_t{1}, size_t{2}}) {
    if (zigzag) {
      TS_ASSIGN_OR_RETURN(outs[o], reorder_halves(outs[o], shapes[o], 2, group.size, false, n));
    }
    TS_ASSIGN_OR_RETURN(outs[o], convert(outs[o], g_.type(n.outputs[o]).shape, out_pl[o], n));
  }
  return outs;
}

// Ring attention: the keys and values go round the group a chunk at a time. At step i rank r
// holds the chunk of rank r - i (axis_index with GroupAttrs::back = i, the key block the kernel
// masks by), sends it on to r + 1 while it attends to it, and merges the step's result into
// the running one by their log-sum-exp. The backward goes round again: each step's key and
// value gradients are for the chunk in hand, so they travel with it, each rank adding its part
// (a sum that arrives from r - 1, plus its own), and a last shift brings every chunk's sum home.
// `ins` ends with the queries' block index.
Result<std::vector<ValueId>> Pass::lower_ring_attention(const Node& n, const Attrs& a,
                                                        const GroupAttrs& group,
                                                        std::vector<ValueId> ins,
                                                        const std::vector<Placements>& out_pl,
                                                        const std::vector<Shape>& expect) {
  // The chunk in hand, its shift to the next rank (issued before the step's attention, so that
  // the two overlap), and the step's key block.
  auto shift = [&](ValueId x) -> Result<ValueId> {
    // (The placement and shape by value: emitting nodes may move the local graph's tables.)
    const Placements pl = out_.placements[static_cast<size_t>(x)];
    const Shape shape = out_.local.type(x).shape;
    return emit(OpKind::ring_shift, group, {x}, n, {pl}, {shape});
  };
  auto key_block = [&](int64_t step) {
    GroupAttrs back = group;
    back.back = step;
    return index_in(back, n);
  };
  auto add = [&](ValueId x, ValueId y, size_t o) {
    return emit(OpKind::add, NoAttrs{}, {x, y}, n, {out_pl[o]}, {expect[o]});
  };
  ValueId k = ins[1], v = ins[2];
  std::vector<ValueId> acc;  // forward: (out, lse); backward: (dq, dk sum, dv sum)
  for (int64_t i = 0; i < group.size; ++i) {
    ValueId next_k = -1, next_v = -1;
    if (i + 1 < group.size) {
      TS_ASSIGN_OR_RETURN(next_k, shift(k));
      TS_ASSIGN_OR_RETURN(next_v, shift(v));
    }
    // Backward: the sums so far come on from the previous rank beside this step's work.
    if (n.op == OpKind::attention_grad && i > 0) {
      TS_ASSIGN_OR_RETURN(acc[1], shift(acc[1]));
      TS_ASSIGN_OR_RETURN(acc[2], shift(acc[2]));
    }
    TS_ASSIGN_OR_RETURN(ValueId kb, key_block(i));
    std::vector<ValueId> step_in = ins;
    step_in[1] = k, step_in[2] = v;
    step_in.push_back(kb);  // after the queries' block
    TS_ASSIGN_OR_RETURN(ValueId y, emit(n.op, a, std::move(step_in), n, out_pl, expect));
    const std::vector<ValueId> outs = out_.local.producer(y).outputs;
    if (acc.empty()) {
      acc = outs;
    } else if (n.op == OpKind::attention) {
      TS_ASSIGN_OR_RETURN(ValueId m, emit(OpKind::attention_merge, NoAttrs{},
                                          {acc[0], acc[1], outs[0], outs[1]}, n, out_pl, expect));
      acc = out_.local.producer(m).outputs;
    } else {
      for (size_t o = 0; o < 3; ++o) {
        TS_ASSIGN_OR_RETURN(acc[o], add(acc[o], outs[o], o));
      }
    }
    k = next_k, v = next_v;
  }
  if (n.op == OpKind::attention_grad) {  // each chunk's sums, one rank short of home
    TS_ASSIGN_OR_RETURN(acc[1], shift(acc[1]));
    TS_ASSIGN_OR_RETURN(acc[2], shift(acc[2]));
  }
  return acc;
}

}  // namespace tessera::partition_detail
