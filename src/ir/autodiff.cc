#include "ir/autodiff.h"

#include <algorithm>
#include <vector>

#include "base/check.h"

namespace tessera {

void append_backward(Builder& b, Var loss) { append_backward(b, loss, {}, {}); }

std::vector<ValueId> append_backward(Builder& b, Var loss, const std::vector<GradSeed>& seeds,
                                     const std::vector<ValueId>& wrt) {
  Graph& g = b.graph();
  TS_CHECK(loss.valid() || !seeds.empty()) << "autodiff needs a loss or gradient seeds";
  if (loss.valid()) {
    TS_CHECK_EQ(loss.shape().numel(), 1) << "autodiff needs a scalar loss";
    g.set_loss(loss.id);
  }
  const size_t num_forward_nodes = g.nodes().size();

  // Which values depend on a parameter or a `wrt` value (forward sweep).
  std::vector<bool> needs(g.values().size(), false);
  for (ValueId p : g.params()) needs[static_cast<size_t>(p)] = dtype_is_float(g.type(p).dtype);
  for (ValueId v : wrt) needs[static_cast<size_t>(v)] = dtype_is_float(g.type(v).dtype);
  for (size_t i = 0; i < num_forward_nodes; ++i) {
    const Node& n = g.nodes()[i];
    if (!op_def(n.op).vjp) continue;
    bool any = false;
    for (ValueId v : n.inputs) any = any || needs[static_cast<size_t>(v)];
    for (ValueId v : n.outputs) needs[static_cast<size_t>(v)] = any;
  }

  std::vector<Var> grad(g.values().size());
  auto accumulate = [&](ValueId v, Var d) {
    Var& slot = grad[static_cast<size_t>(v)];
    slot = slot.valid() ? b.add(slot, d) : d;
  };
  // The gradient of a slice is the output gradient placed in a zero tensor of the input's
  // shape. Slices of one tensor (q, k and v of a fused projection) are collected here and
  // placed together by finish(): one concat instead of a zero-padded concat per slice and the
  // adds between them.
  struct Piece {
    int axis;
    int64_t start, end;
    Var grad;
  };
  std::vector<std::vector<Piece>> pieces(g.values().size());
  auto finish = [&](ValueId v) {
    std::vector<Piece>& ps = pieces[static_cast<size_t>(v)];
    if (ps.empty()) return;
    std::sort(ps.begin(), ps.end(), [](const Piece& a, const Piece& c) {
      return a.axis != c.axis ? a.axis < c.axis : a.start < c.start;
    });
    const TensorType& t = g.type(v);
    std::vector<Var> parts;
    int64_t at = 0;
    for (size_t i = 0; i < ps.size(); ++i) {
      if (ps[i].axis != ps[0].axis || ps[i].start < at) {  // overlapping or another axis
        for (size_t j = i; j < ps.size(); ++j) {
          std::vector<Var> one;
          int64_t n = t.shape[ps[j].axis];
          if (ps[j].start > 0)
            one.push_back(b.fill(t.shape.with_dim(ps[j].axis, ps[j].start), 0, t.dtype));
          one.push_back(ps[j].grad);
          if (ps[j].end < n)
            one.push_back(b.fill(t.shape.with_dim(ps[j].axis, n - ps[j].end), 0, t.dtype));
          accumulate(v, one.size() == 1 ? one[0] : b.concat(one, ps[j].axis));
        }
        break;
      }
      if (ps[i].start > at)
        parts.push_back(b.fill(t.shape.with_dim(ps[i].axis, ps[i].start - at), 0, t.dtype));
      parts.push_back(ps[i].grad);
      at = ps[i].end;
    }
    const int axis = ps[0].axis;
    if (at < t.shape[axis])
      parts.push_back(b.fill(t.shape.with_dim(axis, t.shape[axis] - at), 0, t.dtype));
    accumulate(v, parts.size() == 1 ? parts[0] : b.concat(parts, axis));
    ps.clear();
  };

  const std::string saved_scope = b.current_scope();
  b.set_backward(true);
  b.set_position("", -1);
  if (loss.valid()) {
    grad[static_cast<size_t>(loss.id)] = b.fill(loss.shape(), 1.0, loss.dtype());
    g.set_loss_seed(grad[static_cast<size_t>(loss.id)].id);
  }
  for (const GradSeed& s : seeds) accumulate(s.value, b.var(s.grad));

  for (size_t i = num_forward_nodes; i-- > 0;) {
    // Copy: appending nodes may reallocate the node vector.
    const Node n = g.nodes()[i];
    const OpDef& def = op_def(n.op);
    if (!def.vjp) continue;
    b.set_position(n.scope, n.layer);
    for (ValueId v : n.outputs) finish(v);
    bool has_out_grad = false, has_in_need = false;
    std::vector<Var> out_grads;
    for (ValueId v : n.outputs) {
      out_grads.push_back(grad[static_cast<size_t>(v)]);
      has_out_grad = has_out_grad || grad[static_cast<size_t>(v)].valid();
    }
    for (ValueId v : n.inputs) has_in_need = has_in_need || needs[static_cast<size_t>(v)];
    if (!has_out_grad || !has_in_need) continue;
    // A missing gradient of the primary output (only an auxiliary output reached the loss)
    // is zero.
    if (!out_grads[0].valid()) {
      const TensorType& t = g.type(n.outputs[0]);
      out_grads[0] = b.fill(t.shape, 0.0, t.dtype);
    }
    if (n.op == OpKind::slice && needs[static_cast<size_t>(n.inputs[0])]) {
      const Shape& in = g.type(n.inputs[0]).shape;
      const SliceAttrs& a = n.attr<SliceAttrs>();
      pieces[static_cast<size_t>(n.inputs[0])].push_back(
          {in.axis(static_cast<int>(a.axis)), a.start, a.end, out_grads[0]});
      continue;
    }
    std::vector<Var> in_grads(n.inputs.size());
    def.vjp(b, n, out_grads, &in_grads);
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      ValueId v = n.inputs[k];
      if (!needs[static_cast<size_t>(v)] || !in_grads[k].valid()) continue;
      accumulate(v, in_grads[k]);
    }
  }

  b.set_position("", -1);
  for (ValueId p : g.params()) {
    finish(p);
    Var d = grad[static_cast<size_t>(p)];
    if (!d.valid()) d = b.fill(g.type(p).shape, 0.0, g.type(p).dtype);
    g.set_param_grad(p, d.id);
  }
  std::vector<ValueId> wrt_grads;
  for (ValueId v : wrt) {
    finish(v);
    Var d = grad[static_cast<size_t>(v)];
    if (!d.valid()) d = b.fill(g.type(v).shape, 0.0, g.type(v).dtype);
    wrt_grads.push_back(d.id);
  }
  b.set_backward(false);
  b.set_position(saved_scope, -1);
  return wrt_grads;
}

}  // namespace tessera
