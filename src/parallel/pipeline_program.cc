#include "parallel/pipeline_program.h"

#include <algorithm>
#include <climits>
#include <map>
#include <numeric>

#include "parallel/pipeline_split.h"
#include "parallel/pipeline_stages.h"

namespace tessera {

namespace {

// Forward values (and inputs) the backward reads: what a micro-batch in flight keeps.
int64_t stash_bytes(const Graph& g) {
  std::vector<char> read(g.values().size(), 0);
  for (const Node& n : g.nodes())
    if (in_backward_pass(n))
      for (ValueId v : n.inputs) read[static_cast<size_t>(v)] = 1;
  int64_t bytes = 0;
  for (const Node& n : g.nodes()) {
    if (in_backward_pass(n) || n.op == OpKind::parameter || n.op == OpKind::fill) continue;
    for (ValueId v : n.outputs)
      if (read[static_cast<size_t>(v)]) bytes += g.type(v).bytes();
  }
  return bytes;
}

// zb-h1's split of the backward: a backward node is B when the gradient it computes flows on
// to an earlier block (or out of the chunk, `sent_back`), W when it only feeds parameter
// gradients. Positions order the flow: a block by its index, the head's nodes (outside the
// blocks, before the first block's backward) above every block, the embedding's below.
std::vector<char> weight_grad_nodes(const Graph& g, const std::vector<ValueId>& sent_back) {
  const size_t n = g.nodes().size();
  size_t first_block = n;
  for (size_t i = 0; i < n && first_block == n; ++i)
    if (in_backward_pass(g.nodes()[i]) && g.nodes()[i].layer >= 0) first_block = i;
  auto pos = [&](size_t i) {
    const Node& nd = g.nodes()[i];
    return nd.layer >= 0 ? nd.layer : (i < first_block ? INT_MAX : -1);
  };
  std::vector<std::vector<NodeId>> readers(g.values().size());
  for (size_t i = 0; i < n; ++i)
    for (ValueId v : g.nodes()[i].inputs)
      readers[static_cast<size_t>(v)].push_back(static_cast<NodeId>(i));
  std::vector<char> flows(n, 0), out(n, 0);
  for (size_t i = n; i-- > 0;) {
    const Node& nd = g.nodes()[i];
    if (!in_backward_pass(nd)) continue;
    bool b = false;
    for (ValueId v : nd.outputs) {
      b = b || std::count(sent_back.begin(), sent_back.end(), v) > 0;
      for (NodeId r : readers[static_cast<size_t>(v)])
        b = b || (in_backward_pass(g.node(r)) &&
                  (pos(static_cast<size_t>(r)) < pos(i) || flows[static_cast<size_t>(r)]));
    }
    flows[i] = b;
    out[i] = !b;
  }
  return out;
}

}  // namespace

Result<PipelineProgram> lower_pipeline(const Graph& g, const Plan& plan,
                                       const std::function<double(const Node&)>& cost) {
  TS_RETURN_IF_ERROR(validate(plan));
  if (plan.stages() < 2)
    return error("pipeline: the plan has " + std::to_string(plan.stages()) + " stage",
                 "lower() runs a plan without pipeline stages");
  PipelineProgram out;
  out.plan = plan;
  TS_ASSIGN_OR_RETURN(out.schedule, make_schedule(plan.schedule, plan.stages(), plan.micro_batches,
                                                  plan.virtual_stages));
  int blocks = 0;
  for (const Node& n : g.nodes()) blocks = std::max(blocks, n.layer + 1);
  if (plan.stage_layers.empty()) {
    auto flops = [&](const Node& n) { return node_flops(g, n); };
    LayerCosts c = cost ? layer_costs(g, cost) : layer_costs(g, flops);
    TS_ASSIGN_OR_RETURN(out.per_chunk, balance_stages(c, plan.chunks()));
  } else {
    const int total = std::accumulate(plan.stage_layers.begin(), plan.stage_layers.end(), 0);
    if (total != blocks || std::any_of(plan.stage_layers.begin(), plan.stage_layers.end(),
                                       [](int b) { return b < 1; }))
      return error("pipeline: stage_layers sum to " + std::to_string(total) +
                       " blocks, but the model has " + std::to_string(blocks),
                   "give each of the " + std::to_string(plan.chunks()) +
                       " chunks at least one block, " + std::to_string(blocks) + " in all");
    out.per_chunk = plan.stage_layers;
  }
  TS_ASSIGN_OR_RETURN(std::vector<ChunkGraph> graphs, split_pipeline(g, out.per_chunk));
  out.model_flops = g.total_flops();

  for (size_t k = 0; k < graphs.size(); ++k) {
    const ChunkGraph& cg = graphs[k];
    Plan cp = plan;
    cp.params.clear();  // the placements of this chunk's parameters
    for (const auto& [name, pl] : plan.params)
      if (cg.graph.find_param(name) >= 0) cp.params[name] = pl;
    // recompute_layers counts blocks from the model's first; a chunk's graph ends at its last.
    if (cp.recompute_layers >= 0)
      cp.recompute_layers = std::min(cp.recompute_layers, cg.first_block + cg.blocks);
    Result<Program> prog = lower(cg.graph, cp);
    if (!prog.ok()) return prog.status().with_context("pipeline chunk " + std::to_string(k));
    ChunkProgram c;
    c.program = std::move(prog.value());
    c.first_block = cg.first_block;
    c.blocks = cg.blocks;
    const Graph& local = c.program.local();
    c.stash_bytes = stash_bytes(local);
    std::vector<ValueId> sent_back;
    for (ValueId v : cg.send)
      c.send_bytes += local.type(c.program.part.global_to_local[static_cast<size_t>(v)]).bytes();
    for (ValueId v : cg.recv_grads)
      sent_back.push_back(c.program.part.global_to_local[static_cast<size_t>(v)]);
    c.weight_grad = weight_grad_nodes(local, sent_back);
    out.chunks.push_back(std::move(c));
  }

  // Parameters held by chunks on different stages: their gradients are summed across them.
  const int stages = plan.stages();
  std::map<std::string, std::vector<int>> stages_of;
  for (size_t k = 0; k < out.chunks.size(); ++k)
    for (const ParamLayout& pl : out.chunks[k].program.part.params) {
      std::vector<int>& s = stages_of[pl.name];
      const int st = static_cast<int>(k) % stages;
      if (std::find(s.begin(), s.end(), st) == s.end()) s.push_back(st);
    }
  for (const ParamLayout& pl : out.chunks.front().program.part.params)
    if (stages_of[pl.name].size() > 1) out.shared_param_bytes += 4 * pl.local_shape.numel();

  out.in_flight.resize(static_cast<size_t>(stages));
  out.stage_persistent_bytes.assign(static_cast<size_t>(stages), 0);
  out.stage_arena_bytes.assign(static_cast<size_t>(stages), 0);
  for (int s = 0; s < stages; ++s) {
    out.in_flight[static_cast<size_t>(s)] = max_in_flight(out.schedule, s);
    int64_t arena = 0, stash = 0;
    for (size_t k = static_cast<size_t>(s); k < out.chunks.size();
         k += static_cast<size_t>(stages)) {
      const ChunkProgram& c = out.chunks[k];
      out.stage_persistent_bytes[static_cast<size_t>(s)] += c.program.persistent_bytes();
      arena = std::max(arena, c.program.memory.arena_bytes);
      stash = std::max(stash, c.stash_bytes);
    }
    out.stage_arena_bytes[static_cast<size_t>(s)] =
        arena + std::max(0, out.in_flight[static_cast<size_t>(s)] - 1) * stash;
  }
  return out;
}

}  // namespace tessera
