#include "parallel/partition.h"

#include <algorithm>
#include <deque>
#include <set>

#include "base/check.h"
#include "parallel/partition_pass.h"
#include "parallel/pipeline_split.h"

namespace tessera {

namespace partition_detail {

Result<Shape> Pass::local_shape(const Shape& global, const Placements& pl,
                                const std::string& what) const {
  Result<Shape> s = TensorLayout{global, pl, {}}.local_shape(plan_.mesh);
  if (!s.ok()) return s.status().with_context("partition: '" + what + "'");
  return s;
}

Result<ValueId> Pass::emit(OpKind op, Attrs attrs, std::vector<ValueId> ins, const Node& like,
                           const std::vector<Placements>& out_pl,
                           const std::vector<Shape>& expect) {
  Result<NodeId> id = out_.local.add_node(op, std::move(attrs), std::move(ins), like.scope,
                                          like.layer, like.backward, like.recompute);
  if (!id.ok()) return id.status().with_context("partition: " + std::string(op_name(op)));
  const Node& n = out_.local.node(id.value());
  out_.placements.resize(out_.local.values().size());
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    out_.placements[static_cast<size_t>(n.outputs[i])] = out_pl[i];
    if (i < expect.size() && out_.local.type(n.outputs[i]).shape != expect[i])
      return error("partition: " + std::string(op_name(op)) + " at '" + like.scope +
                   "' has local shape " + out_.local.type(n.outputs[i]).shape.to_string() +
                   ", expected " + expect[i].to_string());
  }
  return n.outputs.empty() ? ValueId{-1} : n.outputs[0];
}

Result<ValueId> Pass::issue_gather(size_t param, bool backward, const Node& like) {
  const ParamLayout& pl = out_.params[param];
  const GroupAttrs a{.axes = axes_key(plan_.zero_axes),
                     .size = plan_.zero_group(),
                     .shape = pl.local_shape.dims()};
  Node at = like;
  at.backward = backward;
  at.recompute = false;
  TS_ASSIGN_OR_RETURN(
      ValueId v, emit(OpKind::all_gather, a, {pl.local}, at, {pl.layout.axes}, {pl.local_shape}));
  gathered_[{param, backward}] = v;
  in_flight_.emplace_back(-1, pl.local_shape.numel() * 4);
  return v;
}

// Issues the ZeRO-3 gathers needed by node `upto`, and those after it that fit under the
// prefetch limit of gathered bytes whose first use is still ahead.
Status Pass::issue_gathers(NodeId upto) {
  while (!in_flight_.empty() && in_flight_.front().first < upto && in_flight_.front().first >= 0)
    in_flight_.pop_front();
  int64_t bytes = 0;
  for (auto& [use, b] : in_flight_) bytes += b;
  while (next_use_ < uses_.size()) {
    const Use& u = uses_[next_use_];
    int64_t b = out_.params[u.param].local_shape.numel() * 4;
    if (u.node != upto && bytes + b > plan_.prefetch_bytes) break;
    TS_RETURN_IF_ERROR(issue_gather(u.param, u.backward, g_.node(u.node)).status());
    in_flight_.back().first = u.node;
    bytes += b;
    ++next_use_;
  }
  return Status();
}

Status Pass::flush_bucket() {
  if (pending_.empty()) return Status();
  std::vector<NodeId> bucket;
  for (size_t pi : pending_) {
    ParamLayout& pl = out_.params[pi];
    ValueId gv = g_.param_grads().at(pl.global);
    ValueId v = out_.global_to_local[static_cast<size_t>(gv)];
    const Node& like = g_.producer(gv);
    // Tensor axes: the gradient takes its parameter's layout (a Shard is final; a Partial is
    // reduced, or reduce-scattered onto the parameter's shard).
    // On the other axes a Shard is gathered: a gradient split like the activations it came
    // from (GPT's position table, [T, C] rows on a context axis) is every rank's whole.
    // (An expert weight's gradient is its shard on the expert axis, like the weight.)
    Placements want = out_.placements[static_cast<size_t>(v)];
    for (Placement& p : want)
      if (p.is_shard()) p = Placement::replicate();
    for (const std::string& t : plan_.tensor_axes) {
      const size_t k = static_cast<size_t>(plan_.mesh.axis_index(t));
      want[k] = pl.layout.axes[k];
    }
    if (!plan_.expert_axis.empty()) {
      const size_t k = static_cast<size_t>(plan_.mesh.axis_index(plan_.expert_axis));
      if (pl.layout.axes[k].is_shard()) want[k] = pl.layout.axes[k];
    }
    TS_ASSIGN_OR_RETURN(v, convert(v, pl.global_shape, want, like, &bucket));
    Placements cur = out_.placements[static_cast<size_t>(v)];
    std::vector<std::string> partial_axes;
    for (size_t k = 0; k < cur.size(); ++k) {
      if (cur[k].is_shard() && !(cur[k] == pl.layout.axes[k]))
        return error("partition: gradient of " + pl.name + " is sharded on " +
                     plan_.mesh.axes()[k].name + "; expected Partial or Replicate");
      if (!cur[k].is_partial()) continue;
      if (sizes_[k] > 1) {
        partial_axes.push_back(plan_.mesh.axes()[k].name);
      } else {  // a Partial over one rank is already the whole sum: relabel, no collective
        out_.placements[static_cast<size_t>(v)][k] = pl.layout.axes[k];
      }
    }
    cur = out_.placements[static_cast<size_t>(v)];
    std::vector<std::string> rest = partial_axes;
    Placements done = pl.layout.axes;
    if (pl.grads_sharded) {
      for (const std::string& z : plan_.zero_axes) {
        auto it = std::find(rest.begin(), rest.end(), z);
        const size_t k = static_cast<size_t>(plan_.mesh.axis_index(z));
        if (it == rest.end() && z == plan_.context_axis && sizes_[k] > 1 && cur[k].is_replicate()) {
          // A whole gradient on the context axis (GPT's position table, gathered above) is
          // made a partial sum to be reduce-scattered.
          TS_ASSIGN_OR_RETURN(v, to_partial(v, k, like));
          cur = out_.placements[static_cast<size_t>(v)];
        } else if (it != rest.end()) {
          rest.erase(it);
        } else if (plan_.mesh.axis_size(z) > 1) {
          return error("partition: gradient of " + pl.name + " is not Partial on ZeRO axis " + z,
                       "ZeRO-2/3 needs every parameter to be used on every rank");
        }
        done[static_cast<size_t>(plan_.mesh.axis_index(z))] = Placement::shard(0);
      }
      const GroupAttrs a{.axes = axes_key(plan_.zero_axes), .size = plan_.zero_group()};
      FlatShard fs{static_cast<int>(a.size), 0, pl.local_shape.numel()};
      Placements mid = cur;
      for (const std::string& z : plan_.zero_axes)
        mid[static_cast<size_t>(plan_.mesh.axis_index(z))] = Placement::shard(0);
      TS_ASSIGN_OR_RETURN(v,
                          emit(OpKind::reduce_scatter, a, {v}, like, {mid}, {Shape{fs.block()}}));
      bucket.push_back(out_.local.value(v).producer);
    }
    if (!rest.empty()) {
      const GroupAttrs a{.axes = axes_key(rest), .size = plan_.mesh.group_size(rest)};
      TS_ASSIGN_OR_RETURN(
          v, emit(OpKind::all_reduce, a, {v}, like, {done}, {out_.local.type(v).shape}));
      bucket.push_back(out_.local.value(v).producer);
    }
    pl.local_grad = v;
    out_.local.mark_output(v);
  }
  if (!bucket.empty()) out_.buckets.push_back(std::move(bucket));
  pending_.clear();
  pending_bytes_ = 0;
  return Status();
}

Status Pass::visit(NodeId id) {
  const Node& n = g_.node(id);
  const size_t naxes = sizes_.size();
  if (n.op == OpKind::parameter) {
    const ValueId gv = n.outputs[0];
    ParamLayout pl;
    pl.name = n.attr<SourceAttrs>().name;
    pl.global = gv;
    pl.global_shape = g_.type(gv).shape;
    pl.optim_sharded = plan_.shards_optimizer();
    pl.grads_sharded = plan_.shards_grads();
    pl.params_sharded = plan_.shards_params();
    pl.params_on_host = pl.params_sharded && plan_.offloads_params();
    pl.layout = TensorLayout{pl.global_shape, plan_.placements_of(pl.name), {}};
    // A mixture of experts' expert weights [E, ...]: each rank of the expert axis holds its
    // experts' rows.
    if (n.attr<SourceAttrs>().experts && plan_.expert_group() > 1) {
      const int e = plan_.mesh.axis_index(plan_.expert_axis);
      if (pl.global_shape[0] % plan_.expert_group() != 0)
        return error("partition: the " + std::to_string(pl.global_shape[0]) + " experts of '" +
                         pl.name + "' do not split over " + std::to_string(plan_.expert_group()) +
                         " expert-parallel ranks",
                     "use an --ep that divides the number of experts");
      pl.layout.axes[static_cast<size_t>(e)] = Placement::shard(0);
    }
    Result<Shape> ls = pl.layout.local_shape(plan_.mesh);
    if (!ls.ok()) return ls.status().with_context("plan: parameter '" + pl.name + "'");
    pl.local_shape = ls.value();
    FlatShard fs{plan_.zero_group(), 0, pl.local_shape.numel()};
    Shape s = pl.params_sharded ? Shape{fs.block()} : pl.local_shape;
    SourceAttrs a = n.attr<SourceAttrs>();
    a.shape = s.dims();
    a.host = pl.params_on_host;
    TS_ASSIGN_OR_RETURN(pl.local, emit(OpKind::parameter, a, {}, n, {pl.layout.axes}, {s}));
    out_.global_to_local[static_cast<size_t>(gv)] = pl.local;
    param_index_[gv] = out_.params.size();
    out_.params.push_back(pl);
    return Status();
  }
  if (n.op == OpKind::input) {
    const Shape& gs = g_.type(n.outputs[0]).shape;
    const Placements pl = boundary_placements(g_.type(n.outputs[0]));
    if ((gs.rank() == 0 && !is_pipeline_input(n.attr<SourceAttrs>().name)) ||
        (gs.rank() > 0 && gs[0] % plan_.data_group() != 0))
      return error("partition: input '" + n.attr<SourceAttrs>().name + "' " + gs.to_string() +
                       ": the batch does not split over " + std::to_string(plan_.data_group()) +
                       " data-parallel ranks",
                   "use a global batch that is a multiple of the data-parallel size");
    SourceAttrs a = n.attr<SourceAttrs>();
    TS_ASSIGN_OR_RETURN(Shape ls, local_shape(gs, pl, a.name));
    a.shape = ls.dims();
    TS_ASSIGN_OR_RETURN(ValueId v, emit(OpKind::input, a, {}, n, {pl}, {ls}));
    out_.global_to_local[static_cast<size_t>(n.outputs[0])] = v;
    gpl_[static_cast<size_t>(n.outputs[0])] = pl;
    return Status();
  }

  if (n.op == OpKind::fill && !grad_of_.count(n.outputs[0]) &&
      std::find(g_.outputs().begin(), g_.outputs().end(), n.outputs[0]) == g_.outputs().end()) {
    lazy_fills_.insert(n.outputs[0]);
    return Status();
  }
  TS_RETURN_IF_ERROR(issue_gathers(id));
  std::vector<ValueId> ins;
  std::vector<TensorType> in_types, out_types;
  for (ValueId v : n.inputs) {
    ValueId lv = out_.global_to_local[static_cast<size_t>(v)];
    auto pi = param_index_.find(v);
    if (pi != param_index_.end() && out_.params[pi->second].params_sharded)
      lv = gathered_.at({pi->second, in_backward_pass(n)});
    ins.push_back(lv);
    in_types.push_back(g_.type(v));
  }
  for (ValueId v : n.outputs) out_types.push_back(g_.type(v));

  // lazy[i]: placements of a fill input to be emitted once this node's placements are chosen.
  std::vector<Placements> lazy(ins.size());
  for (size_t i = 0; i < ins.size(); ++i)
    if (lazy_fills_.count(n.inputs[i])) lazy[i] = Placements(naxes, Placement::replicate());
  auto placement = [&](size_t i, size_t k) {
    return lazy[i].empty() ? out_.placements[static_cast<size_t>(ins[i])][k] : lazy[i][k];
  };

  const OpDef& def = op_def(n.op);
  std::vector<Placements> out_pl(n.outputs.size(), Placements(naxes, Placement::replicate()));
  // (A scalar fill, the loss gradient's seed, has no sequence to split: it does not count.)
  bool any_lazy = false;
  for (size_t i = 0; i < ins.size(); ++i)
    any_lazy = any_lazy || (!lazy[i].empty() && in_types[i].shape.rank() > 0);
  for (size_t k = 0; k < naxes; ++k) {
    Placements pk;
    for (size_t i = 0; i < ins.size(); ++i) pk.push_back(placement(i, k));
    bool all_r =
        std::all_of(pk.begin(), pk.end(), [](const Placement& p) { return p.is_replicate(); });
    // (Under sequence parallelism too: a replicated stream, from a replicated embedding, stays
    // whole until the first residual add meets a Partial; slicing it at the first norm would
    // only add a gather before q.)
    if (all_r) continue;
    const bool sequence = plan_.sequence_parallel && !any_lazy &&
                          std::count(plan_.tensor_axes.begin(), plan_.tensor_axes.end(),
                                     plan_.mesh.axes()[k].name) > 0;
    std::vector<Placement> res;
    auto try_rule = [&](const Placements& p) {
      return def.sharding && def.sharding(ShardingRuleArgs{n.attrs, in_types, out_types, p}, &res);
    };
    // Under sequence parallelism a Partial activation of the forward pass is reduce-scattered
    // onto the sequence at its first use, not carried on: a Partial residual stream would stay
    // whole, and its norms' gradients would reduce it again. (In the backward pass, gradients
    // of one value add up Partial first: one reduction of the sum.)
    if (sequence && !n.backward) {
      bool partial_stream = false;
      for (size_t i = 0; i < ins.size(); ++i)
        partial_stream = partial_stream || (pk[i].is_partial() && is_sequence(in_types[i].shape));
      if (partial_stream) {
        TS_ASSIGN_OR_RETURN(bool split, split_sequence(n, k, pk, in_types, out_types, &ins, &res));
        if (split) {
          for (size_t i = 0; i < res.size(); ++i) out_pl[i][k] = res[i];
          continue;
        }
      }
    }
    // A sequence split is gathered before a reshape that flattens it ([B, T, C] -> [B*T, C];
    // with one sequence per rank the split would survive as a row split): the value gathered
    // is then the one the q, k and v (or gate and up) weight gradients share, gathered once.
    if (sequence && n.op == OpKind::reshape && pk[0].is_shard(1) &&
        is_sequence(in_types[0].shape) && !is_sequence(out_types[0].shape)) {
      TS_ASSIGN_OR_RETURN(
          ins[0], sequence_convert(ins[0], in_types[0].shape, k, Placement::replicate(), n));
      continue;  // all Replicate: out_pl stays Replicate on this axis
    }
    if (try_rule(pk)) {
      for (size_t i = 0; i < res.size(); ++i) out_pl[i][k] = res[i];
      continue;
    }
    // A zero fill is any placement for free; a fill is any Shard by filling the local shape.
    Placement target =
        *std::find_if(pk.begin(), pk.end(), [](const Placement& p) { return !p.is_replicate(); });
    Placements relabeled = pk;
    bool changed = false;
    for (size_t i = 0; i < ins.size(); ++i) {
      const Node& prod = lazy[i].empty() ? out_.local.producer(ins[i]) : g_.producer(n.inputs[i]);
      if (!pk[i].is_replicate() || prod.op != OpKind::fill) continue;
      if (target.is_partial() && prod.attr<FillAttrs>().value != 0.0) continue;
      if (target.is_shard() && target.dim >= in_types[i].shape.rank()) continue;
      relabeled[i] = target;
      changed = true;
    }
    if (changed && try_rule(relabeled)) {
      for (size_t i = 0; i < res.size(); ++i) out_pl[i][k] = res[i];
      // A new local fill carries the new placement (the original may be used elsewhere).
      for (size_t i = 0; i < ins.size(); ++i) {
        if (relabeled[i] == pk[i]) continue;
        if (!lazy[i].empty()) {
          lazy[i][k] = relabeled[i];
          continue;
        }
        Placements p = out_.placements[static_cast<size_t>(ins[i])];
        p[k] = relabeled[i];
        FillAttrs fa = out_.local.producer(ins[i]).attr<FillAttrs>();
        TS_ASSIGN_OR_RETURN(Shape ls, local_shape(g_.type(n.inputs[i]).shape, p, n.scope));
        fa.shape = ls.dims();
        TS_ASSIGN_OR_RETURN(ins[i], emit(OpKind::fill, fa, {}, n, {p}, {ls}));
      }
      continue;
    }
    if (sequence) {
      TS_ASSIGN_OR_RETURN(bool split, split_sequence(n, k, pk, in_types, out_types, &ins, &res));
      if (split) {
        for (size_t i = 0; i < res.size(); ++i) out_pl[i][k] = res[i];
        continue;
      }
    }
    // A replicated input computed from parameters alone is any Shard for free (a local
    // slice): T5's position bias [H, Tq, Tk], computed whole, meets queries split on the heads.
    // One input, the first dim that a rule takes, before gathering the sharded inputs instead.
    // (Not an activation on a tensor axis: a stream sliced there would stay split and be
    // gathered at every norm. On a data axis, where activations are split on the batch, an
    // activation made whole by a reduction is sliced back: a mixture of experts' balance-loss
    // gradient, the same for every token, meets the router's batch-split probabilities.)
    const bool data_axis =
        std::count(plan_.data_axes.begin(), plan_.data_axes.end(), plan_.mesh.axes()[k].name) > 0;
    bool sliced = false;
    for (size_t i = 0; i < ins.size() && !sliced; ++i) {
      // (Not ids: a whole mixture of experts' slots index the whole capacity, not a rank's.)
      if (!pk[i].is_replicate() || !lazy[i].empty() || sizes_[k] == 1 ||
          !((data_axis && in_types[i].dtype != DType::i32) ||
            batch_free_[static_cast<size_t>(n.inputs[i])]))
        continue;
      for (int d = 0; d < in_types[i].shape.rank() && !sliced; ++d) {
        if (in_types[i].shape[d] % sizes_[k] != 0) continue;
        Placements p = pk;
        p[i] = Placement::shard(d);
        if (!try_rule(p)) continue;
        Placements target = out_.placements[static_cast<size_t>(ins[i])];
        target[k] = Placement::shard(d);
        TS_ASSIGN_OR_RETURN(ins[i], convert(ins[i], in_types[i].shape, target, n));
        for (size_t o = 0; o < res.size(); ++o) out_pl[o][k] = res[o];
        sliced = true;
      }
    }
    if (sliced) continue;
    // A parameter's gradient summed from a partial and a whole part (GPT's tied token table
    // under sequence parallelism: the head's gradient a partial sum over the sequence, the
    // embedding's whole) stays a partial sum, reduced once per step with the other gradients.
    // So does a scalar (the loss plus a mixture of experts' balance loss, whole on every rank).
    if (n.op == OpKind::add && (grad_of_.count(n.outputs[0]) || out_types[0].shape.rank() == 0) &&
        lazy[0].empty() && lazy[1].empty() && pk[0].is_partial() != pk[1].is_partial() &&
        (pk[0].is_replicate() || pk[1].is_replicate())) {
      const size_t whole = pk[0].is_replicate() ? 0 : 1;
      TS_ASSIGN_OR_RETURN(ins[whole], to_partial(ins[whole], k, n));
      out_pl[0][k] = Placement::partial();
      continue;
    }
    // Expert parallelism: an activation moved to another dim by an all_to_all.
    TS_ASSIGN_OR_RETURN(const bool moved,
                        move_to_experts(n, k, pk, lazy, in_types, try_rule, res, &ins, &out_pl));
    if (moved) continue;
    // Fallback: replicate every non-replicated input on this axis.
    for (size_t i = 0; i < ins.size(); ++i) {
      if (pk[i].is_replicate()) continue;
      TS_ASSIGN_OR_RETURN(ins[i], to_replicate(ins[i], in_types[i].shape, static_cast<int>(k), n));
    }
  }

  for (size_t i = 0; i < ins.size(); ++i) {
    if (lazy[i].empty()) continue;
    FillAttrs fa = g_.producer(n.inputs[i]).attr<FillAttrs>();
    TS_ASSIGN_OR_RETURN(Shape ls, local_shape(g_.type(n.inputs[i]).shape, lazy[i], n.scope));
    fa.shape = ls.dims();
    TS_ASSIGN_OR_RETURN(ins[i], emit(OpKind::fill, fa, {}, n, {lazy[i]}, {ls}));
    if (n.inputs[i] == g_.loss_seed()) out_.loss_seeds.push_back(ins[i]);
  }

  const std::vector<size_t> vocab = vocab_axes(n, ins, &out_pl);
  const std::vector<size_t> blocks = sequence_block_axes(n, ins);

  // Localize attributes that hold global shapes or counts.
  Attrs a = n.attrs;
  std::vector<Shape> expect;
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    TS_ASSIGN_OR_RETURN(Shape ls, local_shape(out_types[i].shape, out_pl[i], n.scope));
    expect.push_back(ls);
  }
  switch (n.op) {
    case OpKind::reshape:
    case OpKind::broadcast_to:
    case OpKind::sum_to:
      attrs_as<ShapeAttrs>(a).shape = expect[0].dims();
      break;
    case OpKind::fill:
      attrs_as<FillAttrs>(a).shape = expect[0].dims();
      break;
    // A mixture of experts split over the tokens routes each rank's tokens into its own
    // share of every expert's slots (ir/ops_moe.cc).
    case OpKind::moe_dispatch:
      attrs_as<MoeAttrs>(a).capacity = expect[0][1];
      break;
    case OpKind::moe_slots: {
      const int64_t rows = in_types[0].shape[0], local = out_.local.type(ins[0]).shape[0];
      MoeAttrs& m = attrs_as<MoeAttrs>(a);
      if (m.capacity * local % rows != 0)
        return error("partition: the " + std::to_string(m.capacity) + " slots per expert at '" +
                         n.scope + "' do not split over the " + std::to_string(rows / local) +
                         " ranks splitting its tokens",
                     "a mixture of experts' capacity is per example: split whole examples "
                     "(drop the context or sequence split of its tokens)");
      m.capacity = m.capacity * local / rows;
      break;
    }
    case OpKind::cross_entropy:
    case OpKind::cross_entropy_grad: {
      CrossEntropyAttrs& ce = attrs_as<CrossEntropyAttrs>(a);
      if (ce.rows == 0) ce.rows = logit_rows(in_types[0].shape);
      break;
    }
    default:
      break;
  }
  std::vector<ValueId> outs;
  if (!blocks.empty()) {
    TS_ASSIGN_OR_RETURN(outs, lower_sequence_blocks(n, a, ins, out_pl, expect, blocks));
  } else if (vocab.empty()) {
    TS_ASSIGN_OR_RETURN(ValueId first, emit(n.op, a, ins, n, out_pl, expect));
    outs = out_.local.producer(first).outputs;
  } else {
    TS_ASSIGN_OR_RETURN(outs, lower_vocab(n, a, ins, out_pl, expect, vocab));
  }
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    out_.global_to_local[static_cast<size_t>(n.outputs[i])] = outs[i];
    auto gi = grad_of_.find(n.outputs[i]);
    if (gi != grad_of_.end()) {
      pending_.push_back(gi->second);
      pending_bytes_ += out_types[i].bytes();
    }
  }
  if (pending_bytes_ >= plan_.bucket_bytes) TS_RETURN_IF_ERROR(flush_bucket());
  return Status();
}

Placements Pass::boundary_placements(const TensorType& t) const {
  const Shape& s = t.shape;
  Placements pl(sizes_.size(), Placement::replicate());
  if (s.rank() == 0) return pl;  // a scalar between pipeline stages: whole on every rank
  for (const std::string& a : plan_.data_axes)
    pl[static_cast<size_t>(plan_.mesh.axis_index(a))] = Placement::shard(0);
  if (plan_.context_group() > 1 && is_sequence(s))  // tokens, targets, activations [B, T, ...]
    pl[static_cast<size_t>(plan_.mesh.axis_index(plan_.context_axis))] = Placement::shard(1);
  if (!plan_.sequence_parallel || seq_t_ < 0 || s.rank() < 2 || t.dtype == DType::i32) return pl;
  const int seq_dim = is_sequence(s) ? 1 : s[0] == seq_b_ * seq_t_ ? 0 : -1;
  if (seq_dim >= 0)
    for (const std::string& a : plan_.tensor_axes)
      pl[static_cast<size_t>(plan_.mesh.axis_index(a))] = Placement::shard(seq_dim);
  return pl;
}

Result<Partitioned> Pass::run() {
  TS_RETURN_IF_ERROR(validate(plan_));
  const int cp = plan_.context_group();
  if ((plan_.sequence_parallel || cp > 1) && seq_t_ < 0) {  // [B, T] from the token inputs
    const TokenShape t = token_shape(g_);
    if (t.seq > 0) seq_b_ = t.batch, seq_t_ = t.seq;
    if (seq_t_ < 0)
      return error(std::string("partition: ") + (cp > 1 ? "context" : "sequence") +
                       " parallelism needs [batch, sequence] token inputs",
                   cp > 1 ? "drop the context axis for this model"
                          : "drop sequence_parallel for this model");
  }
  const bool zigzag = cp > 1 && plan_.context_order == ContextOrder::zigzag;
  const int pieces = zigzag ? 2 * cp : cp;  // a zigzag order cuts the sequence into halves
  if (cp > 1 && seq_t_ % pieces != 0)
    return error("partition: sequence length " + std::to_string(seq_t_) + " does not split over " +
                     std::to_string(cp) + " context-parallel ranks" +
                     (zigzag ? " in 2 x " + std::to_string(cp) + " zigzag halves" : ""),
                 "use a --seq that is a multiple of " + std::to_string(pieces));
  // Attention with a score bias (T5's relative positions) has no sequence-split form yet: it
  // would gather everything; say so rather than run slowly.
  for (const Node& n : g_.nodes())
    if (cp > 1 && n.op == OpKind::attention && n.inputs.size() == 4)
      return error(
          "partition: context parallelism does not split attention with a position "
          "bias (T5's) yet, at '" +
              n.scope + "'",
          "drop the context axis for this model");
  // A zigzag order permutes the sequence over the ranks: only rope and attention know the
  // rows' true positions, a learned position table sliced by the chunk would not.
  for (const Node& n : g_.nodes())
    if (zigzag && n.op == OpKind::slice && g_.producer(n.inputs[0]).op == OpKind::parameter &&
        n.attr<SliceAttrs>().axis == 0 && g_.type(n.outputs[0]).shape[0] == seq_t_)
      return error("partition: a zigzag context order needs positions from rope; '" +
                       g_.name_of(n.inputs[0]) + "' is a learned position table",
                   "use --cp-order contiguous for this model");
  if (plan_.sequence_parallel) {
    if (cp > 1 && seq_t_ % (pieces * plan_.tensor_group()) != 0)
      return error(
          "partition: sequence length " + std::to_string(seq_t_) + " does not split over " +
              std::to_string(cp) + " context-parallel x " + std::to_string(plan_.tensor_group()) +
              " sequence-parallel ranks",
          "use a --seq that is a multiple of " + std::to_string(pieces * plan_.tensor_group()));
    if (seq_t_ % plan_.tensor_group() != 0)
      return error("partition: sequence length " + std::to_string(seq_t_) +
                       " does not split over " + std::to_string(plan_.tensor_group()) +
                       " tensor-parallel ranks",
                   "use a --seq that is a multiple of " + std::to_string(plan_.tensor_group()));
  }
  for (const auto& [name, pl] : plan_.params) {
    bool found = false;
    for (ValueId p : g_.params()) found = found || g_.name_of(p) == name;
    if (!found)
      return error("plan: parameter '" + name + "' is not in the model",
                   "`tessera graph MODEL --print` lists the parameter names");
  }
  // A training graph (loss and gradients), a loss-only one (evaluation under a plan), or a
  // pipeline chunk before the last (gradients seeded by the next chunk: pipeline_split.h).
  if (g_.loss() < 0 && g_.param_grads().empty())
    return error("partition: the graph has no loss",
                 "build the model in ModelMode::train (or ModelMode::loss to evaluate)");
  for (const auto& [param, grad] : g_.param_grads()) {
    size_t idx = 0;
    for (ValueId p : g_.params()) {
      if (p == param) break;
      ++idx;
    }
    grad_of_[grad] = idx;
  }
  if (plan_.shards_params()) {
    std::map<std::pair<ValueId, bool>, bool> seen;
    size_t pi = 0;
    std::map<ValueId, size_t> idx;
    for (ValueId p : g_.params()) idx[p] = pi++;
    for (NodeId i = 0; i < static_cast<NodeId>(g_.nodes().size()); ++i) {
      const Node& n = g_.node(i);
      for (ValueId v : n.inputs) {
        auto it = idx.find(v);
        const bool bwd = in_backward_pass(n);
        if (it == idx.end() || seen[{v, bwd}]) continue;
        seen[{v, bwd}] = true;
        uses_.push_back({i, it->second, bwd});
      }
    }
  }
  // Parameters first: ZeRO-3 gathers may be issued ahead of a parameter's node.
  for (NodeId i = 0; i < static_cast<NodeId>(g_.nodes().size()); ++i)
    if (g_.node(i).op == OpKind::parameter) TS_RETURN_IF_ERROR(visit(i));
  for (NodeId i = 0; i < static_cast<NodeId>(g_.nodes().size()); ++i)
    if (g_.node(i).op != OpKind::parameter) TS_RETURN_IF_ERROR(visit(i));
  TS_RETURN_IF_ERROR(flush_bucket());

  // Other outputs leave as inputs arrive (a pipeline chunk's activations and input gradients
  // are the next chunk's inputs): boundary_placements (a Partial sum over a tensor axis is
  // all-reduced, or reduce-scattered onto the sequence).
  // The loss and the metrics come out Partial on the data axes: each is all-reduced (a scalar).
  auto summed = [&](ValueId global) -> Result<ValueId> {
    ValueId v = out_.global_to_local[static_cast<size_t>(global)];
    std::vector<std::string> partial_axes;
    for (size_t k = 0; k < sizes_.size(); ++k)
      if (out_.placements[static_cast<size_t>(v)][k].is_partial() && sizes_[k] > 1)
        partial_axes.push_back(plan_.mesh.axes()[k].name);
    if (partial_axes.empty()) return v;
    const GroupAttrs a{.axes = axes_key(partial_axes), .size = plan_.mesh.group_size(partial_axes)};
    return emit(OpKind::all_reduce, a, {v}, g_.producer(global),
                {Placements(sizes_.size(), Placement::replicate())}, {Shape{}});
  };
  std::set<ValueId> metric_values;
  for (const auto& [name, v] : g_.metrics()) {
    TS_ASSIGN_OR_RETURN(ValueId local, summed(v));
    out_.local.add_metric(name, local);
    out_.metrics.emplace_back(name, local);
    metric_values.insert(v);
  }
  for (ValueId v : g_.outputs()) {
    if (v == g_.loss() || grad_of_.count(v) || metric_values.count(v)) continue;
    ValueId& local = out_.global_to_local[static_cast<size_t>(v)];
    const Placements want = boundary_placements(g_.type(v));
    if (out_.placements[static_cast<size_t>(local)] != want) {
      TS_ASSIGN_OR_RETURN(local, convert(local, g_.type(v).shape, want, g_.producer(v)));
    }
    out_.local.mark_output(local);
  }
  if (g_.loss() < 0) return std::move(out_);
  TS_ASSIGN_OR_RETURN(ValueId loss, summed(g_.loss()));
  out_.loss = loss;
  out_.local.set_loss(loss);
  out_.local.mark_output(loss);
  return std::move(out_);
}

}  // namespace partition_detail

TokenShape token_shape(const Graph& g) {
  for (const Node& n : g.nodes()) {
    const TensorType& t = g.type(n.outputs[0]);
    if (n.op == OpKind::input && t.shape.rank() == 2 && t.dtype == DType::i32)
      return {t.shape[0], t.shape[1]};
  }
  return {};
}

Result<Partitioned> partition(const Graph& g, const Plan& plan, TokenShape tokens) {
  return partition_detail::Pass(g, plan, tokens).run();
}

}  // namespace tessera
