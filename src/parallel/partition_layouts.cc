// Vocab and sequence parallelism in the partition pass (parallel/partition_pass.h).
#include <algorithm>

#include "parallel/partition_pass.h"

namespace tessera::partition_detail {

std::vector<size_t> Pass::vocab_axes(const Node& n, const std::vector<ValueId>& ins,
                                     std::vector<Placements>* out_pl) {
  std::vector<size_t> axes;
  auto split = [&](int dim) {
    for (size_t k = 0; k < sizes_.size(); ++k)
      if (sizes_[k] > 1 && out_.placements[static_cast<size_t>(ins[0])][k].is_shard(dim))
        axes.push_back(k);
  };
  switch (n.op) {
    case OpKind::embedding:
      split(0);
      if (!axes.empty()) vocab_ids_[n.inputs[1]] = axes;
      break;
    case OpKind::cross_entropy:
    case OpKind::cross_entropy_grad:
      split(out_.local.type(ins[0]).shape.rank() - 1);  // the logits' columns
      break;
    case OpKind::embedding_grad: {
      // Replicate dy and ids: each rank scatter-adds into its block of the table's rows.
      auto it = vocab_ids_.find(n.inputs[1]);
      if (it == vocab_ids_.end()) break;
      for (size_t k : it->second) {
        Placement& p = (*out_pl)[0][k];
        if (!p.is_replicate()) continue;
        p = Placement::shard(0);
        axes.push_back(k);
      }
      break;
    }
    default:
      break;
  }
  return axes;
}

GroupAttrs Pass::group_over(const std::vector<size_t>& axes) const {
  std::vector<std::string> names;
  for (size_t k : axes) names.push_back(plan_.mesh.axes()[k].name);
  return GroupAttrs{.axes = axes_key(names), .size = plan_.mesh.group_size(names)};
}

Result<ValueId> Pass::index_in(const GroupAttrs& group, const Node& like) {
  const Placements rep(sizes_.size(), Placement::replicate());
  return emit(OpKind::axis_index, group, {}, like, {rep}, {Shape{}});
}

Result<std::vector<ValueId>> Pass::lower_vocab(const Node& n, Attrs a,
                                               const std::vector<ValueId>& ins,
                                               const std::vector<Placements>& out_pl,
                                               const std::vector<Shape>& expect,
                                               const std::vector<size_t>& axes) {
  const GroupAttrs group = group_over(axes);
  TS_ASSIGN_OR_RETURN(ValueId shard, index_in(group, n));
  auto one = [&](OpKind op, std::vector<ValueId> in) -> Result<std::vector<ValueId>> {
    in.push_back(shard);
    TS_ASSIGN_OR_RETURN(ValueId y, emit(op, a, std::move(in), n, out_pl, expect));
    return std::vector<ValueId>{y};
  };
  switch (n.op) {
    case OpKind::embedding:
      return one(OpKind::vocab_embedding, {ins[0], ins[1]});
    case OpKind::embedding_grad:
      a = EmbeddingGradAttrs{.rows = expect[0][0]};
      return one(OpKind::vocab_embedding_grad, {ins[0], ins[1]});
    case OpKind::cross_entropy_grad:
      return one(OpKind::vocab_cross_entropy_grad, {ins[0], ins[1], ins[2], ins[3]});
    case OpKind::cross_entropy: {
      // lse over the whole vocabulary: each block's, gathered over the group and combined
      // (the rows flattened: the logits may have several leading dims).
      const Shape& lse_shape = expect[1];
      const int64_t rows = lse_shape.numel();
      const Placements& lse_pl = out_pl[1];
      const CrossEntropyAttrs& ce = attrs_as<CrossEntropyAttrs>(a);
      // The classes; columns past them are padding.
      TS_ASSIGN_OR_RETURN(ValueId block,
                          emit(OpKind::vocab_logsumexp, CrossEntropyAttrs{.classes = ce.classes},
                               {ins[0], shard}, n, {lse_pl}, {}));
      TS_ASSIGN_OR_RETURN(
          block, emit(OpKind::reshape, ShapeAttrs{{rows}}, {block}, n, {lse_pl}, {Shape{rows}}));
      GroupAttrs ga = group;
      ga.shape = {group.size, rows};
      TS_ASSIGN_OR_RETURN(ValueId all, emit(OpKind::all_gather, ga, {block}, n, {lse_pl},
                                            {Shape{group.size, rows}}));
      TS_ASSIGN_OR_RETURN(ValueId t,
                          emit(OpKind::transpose, TransposeAttrs{{1, 0}}, {all}, n, {lse_pl}, {}));
      TS_ASSIGN_OR_RETURN(ValueId flat,
                          emit(OpKind::logsumexp, {}, {t}, n, {lse_pl}, {Shape{rows}}));
      TS_ASSIGN_OR_RETURN(ValueId lse, emit(OpKind::reshape, ShapeAttrs{lse_shape.dims()}, {flat},
                                            n, {lse_pl}, {lse_shape}));
      // Each target's logit lies in one block: picked there, summed over the group.
      Placements part = lse_pl;
      for (size_t k : axes) part[k] = Placement::partial();
      TS_ASSIGN_OR_RETURN(ValueId picked,
                          emit(OpKind::vocab_pick, {}, {ins[0], ins[1], shard}, n, {part}, {}));
      TS_ASSIGN_OR_RETURN(picked, emit(OpKind::all_reduce, group, {picked}, n, {lse_pl}, {}));
      TS_ASSIGN_OR_RETURN(ValueId diff, emit(OpKind::sub, {}, {lse, picked}, n, {lse_pl}, {}));
      std::vector<int64_t> all_dims(static_cast<size_t>(lse_shape.rank()));
      for (size_t d = 0; d < all_dims.size(); ++d) all_dims[d] = static_cast<int64_t>(d);
      TS_ASSIGN_OR_RETURN(ValueId sum, emit(OpKind::reduce_sum, ReduceAttrs{.axes = all_dims},
                                            {diff}, n, {out_pl[0]}, {Shape{}}));
      // The mean over the global rows.
      const ScalarAttrs mean{.value = 1.0 / static_cast<double>(ce.rows)};
      TS_ASSIGN_OR_RETURN(ValueId loss,
                          emit(OpKind::scale, mean, {sum}, n, {out_pl[0]}, {expect[0]}));
      return std::vector<ValueId>{loss, lse};
    }
    default:
      return error("partition: " + std::string(op_name(n.op)) + " has no vocab-parallel form");
  }
}

Result<bool> Pass::split_sequence(const Node& n, size_t k, const Placements& pk,
                                  const std::vector<TensorType>& in_types,
                                  const std::vector<TensorType>& out_types,
                                  std::vector<ValueId>* ins, std::vector<Placement>* res) {
  const OpDef& def = op_def(n.op);
  if (def.sharding == nullptr || out_types.empty()) return false;
  auto rule = [&](const Placements& p) {
    return def.sharding(ShardingRuleArgs{n.attrs, in_types, out_types, p}, res);
  };
  const bool binary =
      n.op == OpKind::add || n.op == OpKind::sub || n.op == OpKind::mul || n.op == OpKind::div;
  // The dim of input i that runs along the sequence: 1 of a [B, T, ...] activation, 0 of its
  // rows [B*T, ...] (split on them, a reshape of a sequence split with one sequence per rank
  // keeps it), or for a broadcast operand of a binary op ([T, C] + [B, T, C]) the dim aligned
  // with the output's T.
  auto seq_dim = [&](size_t i) {
    if (param_index_.count(n.inputs[i])) return -1;  // activations only
    const Shape& s = in_types[i].shape;
    if (is_sequence(s)) return 1;
    if (s.rank() >= 1 && s[0] == seq_b_ * seq_t_) return 0;  // [B*T, ...]: rows
    const Shape& o = out_types[0].shape;
    if (binary && is_sequence(o)) {
      const int d = 1 - (o.rank() - s.rank());
      if (d >= 0 && s[d] == seq_t_) return d;
    }
    return -1;
  };
  auto apply = [&](const Placements& want) -> Result<bool> {
    for (size_t i = 0; i < want.size(); ++i) {
      if (want[i] == pk[i]) continue;
      TS_ASSIGN_OR_RETURN((*ins)[i], sequence_convert((*ins)[i], in_types[i].shape, k, want[i], n));
    }
    return true;
  };
  // (a) Split the sequence: Partial -> S(T) (reduce-scatter), Replicate -> S(T) (a slice).
  Placements split = pk;
  bool any = false, ok = true;
  for (size_t i = 0; i < pk.size() && ok; ++i) {
    const int d = seq_dim(i);
    if (pk[i].is_partial()) {
      ok = d >= 0;
      split[i] = Placement::shard(d);
      any = true;
    } else if (pk[i].is_shard()) {
      ok = pk[i].dim == d;
      any = true;
    } else if (d >= 0) {
      split[i] = Placement::shard(d);
    }
  }
  const bool split_ok = ok && any && rule(split);
  const std::vector<Placement> split_res = *res;
  // (b) Gather the sequence of the inputs split on it; the others keep their placements.
  Placements gather = pk;
  double gathered_bytes = 0;
  for (size_t i = 0; i < pk.size(); ++i) {
    if (pk[i].is_shard() && pk[i].dim == seq_dim(i)) {
      gather[i] = Placement::replicate();
      gathered_bytes += static_cast<double>(in_types[i].bytes());
    }
  }
  // Splitting makes new partial sums of a reduction over the sequence (a norm's weight
  // gradient: small; an embedding table's: large), reduced later. Gather instead when they
  // outweigh the inputs gathered.
  double new_partial_bytes = 0;
  const bool had_partial =
      std::any_of(pk.begin(), pk.end(), [](const Placement& p) { return p.is_partial(); });
  if (split_ok && !had_partial)
    for (size_t i = 0; i < split_res.size(); ++i)
      if (split_res[i].is_partial()) new_partial_bytes += static_cast<double>(out_types[i].bytes());
  if (split_ok && (gathered_bytes == 0 || new_partial_bytes <= gathered_bytes)) return apply(split);
  if (gathered_bytes > 0) {
    // (Rules are for inputs with something split: all Replicate gives all Replicate.)
    if (std::all_of(gather.begin(), gather.end(),
                    [](const Placement& p) { return p.is_replicate(); })) {
      res->assign(out_types.size(), Placement::replicate());
      return apply(gather);
    }
    if (rule(gather)) return apply(gather);
  }
  if (!split_ok) return false;
  *res = split_res;
  return apply(split);
}

Result<ValueId> Pass::sequence_convert(ValueId v, const Shape& global, size_t k, Placement p,
                                       const Node& like) {
  Placements target = out_.placements[static_cast<size_t>(v)];
  const Placement from = target[k];
  target[k] = p;
  // A gather is redone in the backward pass (its output is the tensor's full size, not kept
  // alive in between); a split (reduce-scatter or slice) is shared by both passes.
  std::string key = std::to_string(v);
  if (p.is_replicate()) key += in_backward_pass(like) ? " bwd" : " fwd";
  // (On an axis of one rank every placement is the same data: the key leaves it out.)
  for (size_t a = 0; a < target.size(); ++a)
    key += sizes_[a] > 1 ? " " + target[a].to_string() : std::string(" -");
  auto it = seq_converted_.find(key);
  if (it != seq_converted_.end()) return it->second;
  out_.fallbacks.push_back(like.scope + " " + op_name(like.op) + ": " + from.to_string() + " -> " +
                           p.to_string() + " on " + plan_.mesh.axes()[k].name +
                           " (sequence parallel)");
  TS_ASSIGN_OR_RETURN(ValueId r, convert(v, global, target, like));
  seq_converted_[key] = r;
  return r;
}

}  // namespace tessera::partition_detail
