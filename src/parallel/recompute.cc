#include "parallel/recompute.h"

#include <algorithm>
#include <map>

#include "base/check.h"

namespace tessera {

namespace {

bool is_source(OpKind k) {
  return k == OpKind::parameter || k == OpKind::input || k == OpKind::fill;
}

// An original forward node inside a transformer block: what recomputation may clone.
bool clonable(const Node& n) {
  return !n.backward && !n.recompute && n.layer >= 0 && !is_source(n.op);
}

// Under the selective policy these outputs are kept, not recomputed: the ops whose FLOPs are
// high for the bytes they produce.
bool kept_under_selective(OpKind k) { return k == OpKind::matmul || k == OpKind::attention; }

// Whether node `reader` (backward, in a block) reads `v` as an activation of its own block.
bool reads_own_activation(const Graph& g, const Node& reader, ValueId v) {
  const Node& p = g.producer(v);
  return reader.backward && reader.layer >= 0 && clonable(p) && p.layer == reader.layer;
}

}  // namespace

Result<Graph> apply_recompute(const Graph& g, RecomputePolicy policy,
                              std::vector<ValueId>* value_map, int layers) {
  if (g.param_grads().empty())
    return error("recompute: the graph has no loss and gradients",
                 "build the model in ModelMode::train");
  int blocks = 0;
  for (const Node& n : g.nodes()) blocks = std::max(blocks, n.layer + 1);
  if (layers > blocks)
    return error("recompute: recompute_layers = " + std::to_string(layers) + " but the model has " +
                     std::to_string(blocks) + " blocks",
                 "use at most " + std::to_string(blocks) + " (or -1: every block)");
  const size_t num_nodes = g.nodes().size();
  // need[i]: node i is cloned. insert_at[L]: the first backward node of layer L that reads an
  // activation of layer L; the clones of layer L go right before it.
  std::vector<char> need(num_nodes, 0);
  std::map<int, NodeId> insert_at;
  // Under `selective` the kept ops' outputs are read where the forward left them; the
  // closure below stops at them.
  auto recomputed = [&](const Node& p) {
    if (layers >= 0 && p.layer >= layers) return false;
    return policy == RecomputePolicy::full ||
           (policy == RecomputePolicy::selective && !kept_under_selective(p.op));
  };
  if (policy != RecomputePolicy::none) {
    for (NodeId i = 0; i < static_cast<NodeId>(num_nodes); ++i) {
      const Node& n = g.node(i);
      for (ValueId v : n.inputs) {
        if (!reads_own_activation(g, n, v) || !recomputed(g.producer(v))) continue;
        need[static_cast<size_t>(g.value(v).producer)] = 1;
        insert_at.emplace(n.layer, i);
      }
    }
    // Close over the block: producers precede readers, so one reverse sweep suffices.
    for (size_t i = num_nodes; i-- > 0;) {
      if (!need[i]) continue;
      const Node& n = g.nodes()[i];
      for (ValueId v : n.inputs) {
        const Node& p = g.producer(v);
        if (clonable(p) && p.layer == n.layer && recomputed(p))
          need[static_cast<size_t>(g.value(v).producer)] = 1;
      }
    }
  }
  std::map<NodeId, int> layer_inserted_at;
  for (auto [layer, at] : insert_at) layer_inserted_at[at] = layer;

  Graph out;
  std::vector<ValueId> map(g.values().size(), -1), clone(g.values().size(), -1);
  auto copy = [&](const Node& n, bool as_clone) -> Status {
    std::vector<ValueId> ins;
    for (ValueId v : n.inputs) {
      ValueId c = clone[static_cast<size_t>(v)];
      bool use_clone = c >= 0 && (as_clone || reads_own_activation(g, n, v));
      ins.push_back(use_clone ? c : map[static_cast<size_t>(v)]);
      TS_CHECK_GE(ins.back(), 0) << "recompute: %" << v << " has no copy";
    }
    Result<NodeId> id =
        out.add_node(n.op, n.attrs, std::move(ins), n.scope, n.layer, n.backward, as_clone);
    if (!id.ok()) return id.status().with_context("recompute: " + n.scope);
    const Node& made = out.node(id.value());
    for (size_t k = 0; k < n.outputs.size(); ++k)
      (as_clone ? clone : map)[static_cast<size_t>(n.outputs[k])] = made.outputs[k];
    return Status();
  };
  for (NodeId i = 0; i < static_cast<NodeId>(num_nodes); ++i) {
    auto at = layer_inserted_at.find(i);
    if (at != layer_inserted_at.end())
      for (NodeId j = 0; j < i; ++j)
        if (need[static_cast<size_t>(j)] && g.node(j).layer == at->second)
          TS_RETURN_IF_ERROR(copy(g.node(j), /*as_clone=*/true));
    TS_RETURN_IF_ERROR(copy(g.node(i), /*as_clone=*/false));
  }

  for (ValueId v : g.outputs()) out.mark_output(map[static_cast<size_t>(v)]);
  if (g.loss() >= 0) out.set_loss(map[static_cast<size_t>(g.loss())]);
  for (const auto& [name, v] : g.metrics()) out.add_metric(name, map[static_cast<size_t>(v)]);
  for (auto [param, grad] : g.param_grads())
    out.set_param_grad(map[static_cast<size_t>(param)], map[static_cast<size_t>(grad)]);
  TS_RETURN_IF_ERROR(verify(out));
  if (value_map) *value_map = std::move(map);
  return out;
}

}  // namespace tessera
