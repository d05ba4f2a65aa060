#include "parallel/fuse.h"

#include <algorithm>
#include <optional>
#include <string>

namespace tessera {

namespace {

// One fused node: the nodes it replaces (the product first), its op and inputs, the values its
// outputs stand for, and the node in whose place it is emitted.
struct Fusion {
  std::vector<NodeId> nodes;
  OpKind op = OpKind::matmul_bias;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  NodeId at = -1;
  NodeId attrs_from = -1;  // the node that names the fused one (-1: the first)
};

bool same_type(const TensorType& a, const TensorType& b) {
  return a.shape == b.shape && a.dtype == b.dtype;
}

bool same_pass(const Node& a, const Node& b) {
  return a.backward == b.backward && a.recompute == b.recompute;
}

class Matcher {
 public:
  explicit Matcher(const Graph& g) : g_(g), users_(g.values().size()), output_(g.values().size()) {
    for (size_t i = 0; i < g.nodes().size(); ++i)
      for (ValueId v : g.nodes()[i].inputs) {
        std::vector<NodeId>& u = users_[static_cast<size_t>(v)];
        if (u.empty() || u.back() != static_cast<NodeId>(i)) u.push_back(static_cast<NodeId>(i));
      }
    for (ValueId v : g.outputs()) output_[static_cast<size_t>(v)] = 1;
  }

  // The fusion that starts at node `i`, if any.
  std::optional<Fusion> match(NodeId i) const {
    switch (g_.node(i).op) {
      case OpKind::matmul:
        return match_product(i);
      case OpKind::add:
        return match_add_norm(i);
      case OpKind::layernorm_grad:
      case OpKind::rmsnorm_grad:
        return match_norm_grad_add(i);
      default:
        return std::nullopt;
    }
  }

 private:
  // The epilogues of matmul node `mi`.
  std::optional<Fusion> match_product(NodeId mi) const {
    const Node& m = g_.node(mi);
    if (m.attr<MatmulAttrs>().fold_batch) return match_bias_grad(mi);
    const ValueId t = m.outputs[0];
    if (output_[static_cast<size_t>(t)] || users(t).size() != 1) return std::nullopt;
    const NodeId ui = users(t)[0];
    const Node& u = g_.node(ui);
    if (!same_pass(m, u)) return std::nullopt;
    Fusion f;
    if (u.op == OpKind::add) {
      const ValueId bias = u.inputs[0] == t ? u.inputs[1] : u.inputs[0];
      if (bias == t || !is_bias(bias, t)) return std::nullopt;
      const ValueId pre = u.outputs[0];
      f.inputs = {m.inputs[0], m.inputs[1], bias};
      // gelu(pre) joins when pre's other readers are gelu_grad's (the backward pass's).
      NodeId gelu = -1;
      bool others_are_grads = true;
      for (NodeId r : users(pre)) {
        const Node& rn = g_.node(r);
        if (rn.op == OpKind::gelu && gelu < 0 && same_pass(rn, m)) {
          gelu = r;
        } else if (rn.op != OpKind::gelu_grad || rn.inputs[1] == pre) {
          others_are_grads = false;
        }
      }
      if (gelu >= 0 && others_are_grads) {
        f.op = OpKind::matmul_bias_gelu;
        f.nodes = {mi, ui, gelu};
        f.outputs = {g_.node(gelu).outputs[0], pre};
      } else {
        f.op = OpKind::matmul_bias;
        f.nodes = {mi, ui};
        f.outputs = {pre};
      }
    } else if (u.op == OpKind::gelu_grad && u.inputs[1] == t && u.inputs[0] != t) {
      const ValueId d = u.outputs[0];
      const int64_t n = g_.type(t).shape[-1];
      NodeId s = -1;
      for (NodeId r : users(d)) {
        const Node& rn = g_.node(r);
        if (rn.op == OpKind::sum_to && same_pass(rn, m) &&
            g_.type(rn.outputs[0]).shape == Shape{n}) {
          s = r;
          break;
        }
      }
      if (s < 0) return std::nullopt;
      f.op = OpKind::matmul_dgelu_bgrad;
      f.nodes = {mi, ui, s};
      f.inputs = {m.inputs[0], m.inputs[1], u.inputs[0]};
      f.outputs = {d, g_.node(s).outputs[0]};
    } else {
      return std::nullopt;
    }
    if (!place(&f)) return std::nullopt;
    return f;
  }

  // A residual add(x, y) whose sum a layernorm or rmsnorm (of the same pass) normalizes.
  std::optional<Fusion> match_add_norm(NodeId ai) const {
    const Node& a = g_.node(ai);
    const ValueId sum = a.outputs[0];
    if (!same_type(g_.type(a.inputs[0]), g_.type(sum)) ||
        !same_type(g_.type(a.inputs[1]), g_.type(sum)))
      return std::nullopt;  // broadcasting (a bias) is not a residual
    for (NodeId r : users(sum)) {
      const Node& ln = g_.node(r);
      const bool layer = ln.op == OpKind::layernorm;
      if ((!layer && ln.op != OpKind::rmsnorm) || ln.inputs[0] != sum || !same_pass(ln, a))
        continue;
      Fusion f;
      f.op = layer ? OpKind::add_layernorm : OpKind::add_rmsnorm;
      f.nodes = {ai, r};
      f.inputs = {a.inputs[0], a.inputs[1]};
      f.inputs.insert(f.inputs.end(), ln.inputs.begin() + 1, ln.inputs.end());  // weights
      f.outputs = {sum};
      f.outputs.insert(f.outputs.end(), ln.outputs.begin(), ln.outputs.end());
      f.attrs_from = r;
      if (place(&f)) return f;
    }
    return std::nullopt;
  }

  // A layernorm_grad or rmsnorm_grad whose dx only an add (of the same pass) reads: the
  // residual's gradient.
  std::optional<Fusion> match_norm_grad_add(NodeId li) const {
    const Node& ln = g_.node(li);
    const ValueId dx = ln.outputs[0];
    if (output_[static_cast<size_t>(dx)] || users(dx).size() != 1) return std::nullopt;
    const NodeId ai = users(dx)[0];
    const Node& a = g_.node(ai);
    if (a.op != OpKind::add || !same_pass(a, ln)) return std::nullopt;
    const ValueId dres = a.inputs[0] == dx ? a.inputs[1] : a.inputs[0];
    if (dres == dx || !same_type(g_.type(dres), g_.type(dx)) ||
        !same_type(g_.type(a.outputs[0]), g_.type(dx)))
      return std::nullopt;
    Fusion f;
    f.op = ln.op == OpKind::layernorm_grad ? OpKind::layernorm_grad_add : OpKind::rmsnorm_grad_add;
    f.nodes = {li, ai};
    f.inputs = ln.inputs;
    f.inputs.push_back(dres);
    f.outputs = ln.outputs;  // dx's place taken by the sum
    f.outputs[0] = a.outputs[0];
    if (!place(&f)) return std::nullopt;
    return f;
  }

  // A weight gradient matmul(dy, x) {ta fold} and the bias gradient sum_to(dy) [N] beside it.
  std::optional<Fusion> match_bias_grad(NodeId mi) const {
    const Node& m = g_.node(mi);
    const ValueId dy = m.inputs[0];
    const int64_t n = g_.type(dy).shape[-1];
    for (NodeId r : users(dy)) {
      const Node& s = g_.node(r);
      if (s.op != OpKind::sum_to || !same_pass(s, m) || g_.type(s.outputs[0]).shape != Shape{n})
        continue;
      Fusion f;
      f.op = OpKind::matmul_bgrad;
      f.nodes = {mi, r};
      f.inputs = m.inputs;
      f.outputs = {m.outputs[0], s.outputs[0]};
      if (place(&f)) return f;
    }
    return std::nullopt;
  }

  const std::vector<NodeId>& users(ValueId v) const { return users_[static_cast<size_t>(v)]; }

  // A bias of product t: [N], t's last dim, in t's dtype.
  bool is_bias(ValueId v, ValueId t) const {
    const TensorType &b = g_.type(v), &p = g_.type(t);
    return b.dtype == p.dtype && b.shape == Shape{p.shape[-1]};
  }

  // The fused node takes the place of the earliest of its nodes after which every outside
  // value it reads is made and before which no outside node reads what it makes. False where
  // none is.
  bool place(Fusion* f) const {
    auto in_set = [&](NodeId n) {
      return std::find(f->nodes.begin(), f->nodes.end(), n) != f->nodes.end();
    };
    NodeId first_ok = 0, last_ok = static_cast<NodeId>(g_.nodes().size());
    for (ValueId v : f->inputs) first_ok = std::max(first_ok, g_.value(v).producer + 1);
    for (ValueId v : f->outputs)
      for (NodeId r : users(v))
        if (!in_set(r)) last_ok = std::min(last_ok, r - 1);
    std::vector<NodeId> slots = f->nodes;
    std::sort(slots.begin(), slots.end());
    for (NodeId n : slots)
      if (n >= first_ok && n <= last_ok) {
        f->at = n;
        return true;
      }
    return false;
  }

  const Graph& g_;
  std::vector<std::vector<NodeId>> users_;
  std::vector<char> output_;
};

}  // namespace

Status fuse_epilogues(Partitioned* p, int* fused) {
  const Graph& g = p->local;
  const Matcher matcher(g);
  std::vector<Fusion> fusions;
  std::vector<int> fusion_of(g.nodes().size(), -1);
  for (NodeId i = 0; i < static_cast<NodeId>(g.nodes().size()); ++i) {
    std::optional<Fusion> f = matcher.match(i);
    if (!f) continue;
    bool free = true;
    for (NodeId n : f->nodes) free = free && fusion_of[static_cast<size_t>(n)] < 0;
    if (!free) continue;
    for (NodeId n : f->nodes) fusion_of[static_cast<size_t>(n)] = static_cast<int>(fusions.size());
    fusions.push_back(std::move(*f));
  }
  // A fused node stands where its slot was, which may come after the node that made one of its
  // outputs: a fusion reading that output from a slot before it is dropped, until none does.
  for (bool dropped = true; dropped;) {
    dropped = false;
    std::vector<NodeId> made_at(g.values().size(), -1);
    for (size_t v = 0; v < g.values().size(); ++v) made_at[v] = g.values()[v].producer;
    for (const Fusion& f : fusions)
      if (f.at >= 0)
        for (ValueId v : f.outputs) made_at[static_cast<size_t>(v)] = f.at;
    for (size_t k = 0; k < fusions.size(); ++k) {
      Fusion& f = fusions[k];
      if (f.at < 0) continue;
      for (ValueId v : f.inputs)
        if (made_at[static_cast<size_t>(v)] >= f.at) {
          for (NodeId n : f.nodes) fusion_of[static_cast<size_t>(n)] = -1;
          f.at = -1;
          dropped = true;
          break;
        }
    }
  }
  const int count = static_cast<int>(
      std::count_if(fusions.begin(), fusions.end(), [](const Fusion& f) { return f.at >= 0; }));
  if (fused) *fused = count;
  if (count == 0) return Status();

  Graph out;
  std::vector<ValueId> vmap(g.values().size(), -1);
  std::vector<NodeId> nmap(g.nodes().size(), -1);
  auto mapped = [&](const std::vector<ValueId>& vs, std::vector<ValueId>* r) -> Status {
    for (ValueId v : vs) {
      r->push_back(vmap[static_cast<size_t>(v)]);
      if (r->back() < 0) return error("fuse: %" + std::to_string(v) + " read before it is made");
    }
    return Status();
  };
  for (NodeId i = 0; i < static_cast<NodeId>(g.nodes().size()); ++i) {
    const int fi = fusion_of[static_cast<size_t>(i)];
    if (fi >= 0 && fusions[static_cast<size_t>(fi)].at != i) continue;
    const Fusion* f = fi >= 0 ? &fusions[static_cast<size_t>(fi)] : nullptr;
    // A fused node is named (scope, layer, attributes) by its main node: the product, or the
    // norm that a residual add joins (which may be the next block's).
    const Node& n = !f ? g.node(i) : g.node(f->attrs_from >= 0 ? f->attrs_from : f->nodes[0]);
    const OpKind op = f ? f->op : n.op;
    std::vector<ValueId> ins;
    TS_RETURN_IF_ERROR(mapped(f ? f->inputs : n.inputs, &ins));
    Result<NodeId> id =
        out.add_node(op, n.attrs, std::move(ins), n.scope, n.layer, n.backward, n.recompute);
    if (!id.ok()) return id.status().with_context("fuse: " + n.scope);
    nmap[static_cast<size_t>(i)] = id.value();
    const std::vector<ValueId>& olds = f ? f->outputs : n.outputs;
    const Node& made = out.node(id.value());
    for (size_t k = 0; k < olds.size(); ++k) vmap[static_cast<size_t>(olds[k])] = made.outputs[k];
  }

  auto remap = [&](ValueId v) { return v < 0 ? v : vmap[static_cast<size_t>(v)]; };
  for (ValueId v : g.outputs()) out.mark_output(remap(v));
  if (g.loss() >= 0) out.set_loss(remap(g.loss()));
  if (g.loss_seed() >= 0) out.set_loss_seed(remap(g.loss_seed()));
  for (const auto& [name, v] : g.metrics()) out.add_metric(name, remap(v));
  for (auto [param, grad] : g.param_grads()) out.set_param_grad(remap(param), remap(grad));
  TS_RETURN_IF_ERROR(verify(out));

  for (ParamLayout& pl : p->params) {
    pl.local = remap(pl.local);
    pl.local_grad = remap(pl.local_grad);
  }
  for (ValueId& v : p->global_to_local) v = remap(v);
  p->loss = remap(p->loss);
  for (auto& [name, v] : p->metrics) v = remap(v);
  for (ValueId& v : p->loss_seeds) v = remap(v);
  for (std::vector<NodeId>& b : p->buckets)
    for (NodeId& n : b) n = nmap[static_cast<size_t>(n)];
  std::vector<std::vector<Placement>> placements(out.values().size());
  for (size_t v = 0; v < vmap.size() && v < p->placements.size(); ++v)
    if (vmap[v] >= 0) placements[static_cast<size_t>(vmap[v])] = p->placements[v];
  p->placements = std::move(placements);
  p->local = std::move(out);
  return Status();
}

}  // namespace tessera
