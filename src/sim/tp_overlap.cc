// The GEMM each tensor-parallel collective is chunked against (SimOptions::tp_comm_overlap).
#include <string>
#include <vector>

#include "sim/sim_internal.h"

namespace tessera {

std::vector<TpOverlap> tp_overlap_gemms(const Graph& g, const Plan& plan) {
  if (plan.tensor_axes.empty()) return {};
  const std::string tensor = axes_key(plan.tensor_axes);
  const size_t values = g.values().size();
  std::vector<NodeId> producer(values, -1);
  std::vector<std::vector<NodeId>> consumers(values);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    for (ValueId v : n.outputs) producer[static_cast<size_t>(v)] = static_cast<NodeId>(i);
    for (ValueId v : n.inputs) consumers[static_cast<size_t>(v)].push_back(static_cast<NodeId>(i));
  }
  // The layout conversions the partition pass puts around a collective (a reshape, the
  // transpose that packs a split dim outermost) sit between it and its GEMM.
  auto relayout = [&](NodeId id) {
    const OpKind k = g.node(id).op;
    return k == OpKind::reshape || k == OpKind::transpose;
  };
  auto gemm_before = [&](ValueId v) -> NodeId {
    for (int hop = 0; hop < 3; ++hop) {
      const NodeId p = producer[static_cast<size_t>(v)];
      if (p < 0) return -1;
      if (is_gemm(g.node(p).op)) return p;
      if (!relayout(p)) return -1;
      v = g.node(p).inputs[0];
    }
    return -1;
  };
  auto gemm_after = [&](ValueId v) -> NodeId {
    for (int hop = 0; hop < 3; ++hop) {
      const std::vector<NodeId>& cs = consumers[static_cast<size_t>(v)];
      for (NodeId c : cs)
        if (is_gemm(g.node(c).op)) return c;
      if (cs.size() != 1 || !relayout(cs[0])) return -1;
      v = g.node(cs[0]).outputs[0];
    }
    return -1;
  };
  std::vector<TpOverlap> out(g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.op != OpKind::all_gather && n.op != OpKind::reduce_scatter && n.op != OpKind::all_reduce)
      continue;
    if (n.attr<GroupAttrs>().axes != tensor) continue;
    out[i].producer = gemm_before(n.inputs[0]);
    if (out[i].producer < 0) out[i].consumer = gemm_after(n.outputs[0]);
  }
  return out;
}

}  // namespace tessera
