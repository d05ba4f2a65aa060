#include "parallel/pipeline_program.h"

#include <algorithm>
#include <climits>
#include <map>
#include <numeric>

#include "parallel/pipeline_split.h"
#include "parallel/pipeline_stages.h"
#include "parallel/recompute.h"

namespace tessera {

namespace {

// Bytes of the distinct values phase `from` stashes for later phases, per micro-batch (the
// reduce phase's inputs are accumulated instead: `reduce`, -1 for none).
int64_t stash_bytes(const Phases& ph, int from, int reduce) {
  std::vector<ValueId> seen;
  int64_t bytes = 0;
  for (const Phases::Stash& st : ph.stash) {
    if (st.from != from || st.to == reduce || std::count(seen.begin(), seen.end(), st.out))
      continue;
    seen.push_back(st.out);
    bytes += ph.graphs[static_cast<size_t>(from)].type(st.out).bytes();
  }
  return bytes;
}

// Micro-batches whose backward_input has run but not their backward_weight, at most, on stage s.
int max_weight_in_flight(const PipelineSchedule& s, int stage) {
  int now = 0, most = 0;
  for (const PipeAction& a : s.actions[static_cast<size_t>(stage)]) {
    if (a.op == PipeOp::backward_input) most = std::max(most, ++now);
    if (a.op == PipeOp::backward_weight) --now;
  }
  return most;
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

// A stage accumulates its gradients in f32 over the micro-batches even with one (the shared
// arena is reused by the next phase before the optimizer runs): in accumulators of their own,
// or in the pool shared with the unreduced sums its reduce phase reads (ChunkProgram::
// grad_pool_bytes). ZeRO-2/3 are refused with stages: every gradient is the whole local piece.
int64_t pipeline_persistent_bytes(const ChunkProgram& c) {
  const Program& p = c.program;
  int64_t bytes = p.param_bytes + p.optim_bytes + c.grad_pool_bytes;
  for (size_t i = 0; i < p.part.params.size(); ++i)
    if (c.reduced_grad_offset.empty() || c.reduced_grad_offset[i] < 0)
      bytes += 4 * p.part.params[i].local_shape.numel();
  return bytes;
}

// ChunkProgram's gradient pool: the unreduced sums at the start, then (in turn, over them) the
// accumulators of the gradients the reduce phase computes.
void lay_out_grad_pool(ChunkProgram* c) {
  if (c->reduce_phase < 0) return;
  auto aligned = [](int64_t bytes) {
    const int64_t a = ChunkProgram::kGradPoolAlign;
    return (bytes + a - 1) / a * a;
  };
  const Phases& ph = c->phases;
  int64_t at = 0;
  c->unreduced_offset.assign(ph.stash.size(), -1);
  for (size_t e = 0; e < ph.stash.size(); ++e) {
    if (ph.stash[e].to != c->reduce_phase) continue;
    c->unreduced_offset[e] = at;
    at += aligned(
        4 * ph.graphs[static_cast<size_t>(ph.stash[e].from)].type(ph.stash[e].out).shape.numel());
  }
  const int64_t unreduced = at;
  at = 0;
  const Graph& rg = ph.graphs[static_cast<size_t>(c->reduce_phase)];
  const std::vector<ValueId>& in_reduce = ph.value_of[static_cast<size_t>(c->reduce_phase)];
  c->reduced_grad_offset.assign(c->program.part.params.size(), -1);
  for (size_t i = 0; i < c->program.part.params.size(); ++i) {
    const ValueId g = c->program.part.params[i].local_grad;
    const ValueId v = in_reduce[static_cast<size_t>(g)];
    if (v < 0 || rg.producer(v).op == OpKind::input) continue;
    c->reduced_grad_offset[i] = at;
    at += aligned(4 * c->program.local().type(g).shape.numel());
  }
  c->grad_pool_bytes = std::max(unreduced, at);
}

// The gradient collectives of the chunk's buckets and every node reading their results.
std::vector<char> gradient_reduction_nodes(const Graph& g,
                                           const std::vector<std::vector<NodeId>>& buckets) {
  std::vector<char> out(g.nodes().size(), 0), reduced(g.values().size(), 0);
  for (const std::vector<NodeId>& b : buckets)
    for (NodeId n : b) out[static_cast<size_t>(n)] = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    const Node& n = g.nodes()[i];
    for (ValueId v : n.inputs) out[i] = out[i] || reduced[static_cast<size_t>(v)];
    if (out[i])
      for (ValueId v : n.outputs) reduced[static_cast<size_t>(v)] = 1;
  }
  return out;
}

}  // namespace

Result<LayerCosts> rank_layer_flops(const Graph& g, const Plan& plan) {
  // One rank of the tensor group: the plan's tensor axes alone, with its placements,
  // sequence parallelism and recomputation.
  Plan t;
  std::vector<MeshAxis> axes{{"dp", 1}};
  std::vector<size_t> kept;  // the plan's mesh axes t keeps, after its dp of 1
  for (size_t i = 0; i < plan.mesh.axes().size(); ++i) {
    const MeshAxis& a = plan.mesh.axes()[i];
    if (std::find(plan.tensor_axes.begin(), plan.tensor_axes.end(), a.name) !=
        plan.tensor_axes.end()) {
      axes.push_back(a);
      kept.push_back(i);
    }
  }
  if (kept.empty() && plan.recompute == RecomputePolicy::none)
    return layer_costs(g, [&](const Node& n) { return node_flops(g, n); });
  t.mesh = Mesh(axes);
  t.tensor_axes = plan.tensor_axes;
  for (const auto& [name, placements] : plan.params) {  // one placement per axis of t
    std::vector<Placement>& p = t.params[name];
    p.push_back(Placement{});  // Replicate on dp
    for (size_t i : kept) p.push_back(i < placements.size() ? placements[i] : Placement{});
  }
  t.sequence_parallel = plan.sequence_parallel;
  t.recompute = plan.recompute;
  t.recompute_layers = plan.recompute_layers;
  t.zero = 0;
  Graph recomputed;
  if (t.recompute != RecomputePolicy::none) {
    TS_ASSIGN_OR_RETURN(recomputed, apply_recompute(g, t.recompute, nullptr, t.recompute_layers));
  }
  TS_ASSIGN_OR_RETURN(
      Partitioned part,
      partition(t.recompute == RecomputePolicy::none ? g : recomputed, t, token_shape(g)));
  const Graph& local = part.local;
  return layer_costs(local, [&](const Node& n) { return node_flops(local, n); });
}

Result<PipelineProgram> lower_pipeline(const Graph& g, const Plan& plan, int only_stage) {
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
    Result<LayerCosts> c = rank_layer_flops(g, plan);
    if (!c.ok()) return c.status().with_context("pipeline: costing the blocks on one rank");
    TS_ASSIGN_OR_RETURN(out.per_chunk, balance_stages(c.value(), plan.chunks()));
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
  // The middle chunks have no token inputs; sequence parallelism splits on the model's.
  const TokenShape tokens = token_shape(g);

  const int stages = plan.stages();
  for (size_t k = 0; k < graphs.size(); ++k) {
    if (only_stage >= 0 && static_cast<int>(k) % stages != only_stage) {
      out.chunks.emplace_back();  // not lowered
      continue;
    }
    const ChunkGraph& cg = graphs[k];
    Plan cp = plan;
    cp.params.clear();  // the placements of this chunk's parameters
    for (const auto& [name, pl] : plan.params)
      if (cg.graph.find_param(name) >= 0) cp.params[name] = pl;
    // recompute_layers counts blocks from the model's first; a chunk's graph ends at its last.
    if (cp.recompute_layers >= 0)
      cp.recompute_layers = std::min(cp.recompute_layers, cg.first_block + cg.blocks);
    Result<Program> prog = lower(cg.graph, cp, tokens);
    if (!prog.ok()) return prog.status().with_context("pipeline chunk " + std::to_string(k));
    ChunkProgram c;
    c.program = std::move(prog.value());
    c.first_block = cg.first_block;
    c.blocks = cg.blocks;
    const Graph& local = c.program.local();
    auto to_local = [&](const std::vector<ValueId>& vs) {
      std::vector<ValueId> out;
      for (ValueId v : vs) out.push_back(c.program.part.global_to_local[static_cast<size_t>(v)]);
      return out;
    };
    c.recv = to_local(cg.recv);
    c.recv_grads = to_local(cg.recv_grads);
    c.send = to_local(cg.send);
    c.send_grads = to_local(cg.send_grads);
    for (ValueId v : c.send) c.send_bytes += local.type(v).bytes();
    for (ValueId v : c.recv_grads) c.send_grad_bytes += local.type(v).bytes();
    c.weight_grad = weight_grad_nodes(local, c.recv_grads);
    // The phases: zb-h1 runs the weight-gradient nodes apart.
    const bool split_w = plan.schedule == ScheduleKind::zb_h1;
    std::vector<int> phase_of = forward_backward_phases(local);
    for (size_t i = 0; i < phase_of.size(); ++i)
      if (split_w && phase_of[i] == kBackwardPhase && c.weight_grad[i]) phase_of[i] = kWeightPhase;
    int phases = split_w ? 3 : 2;
    const std::vector<char> reduce = gradient_reduction_nodes(local, c.program.part.buckets);
    if (std::count(reduce.begin(), reduce.end(), 1) > 0) {
      c.reduce_phase = phases++;
      for (size_t i = 0; i < phase_of.size(); ++i)
        if (reduce[i]) phase_of[i] = c.reduce_phase;
    }
    Result<Phases> ph = split_phases(local, phase_of, phases);
    if (!ph.ok()) return ph.status().with_context("pipeline chunk " + std::to_string(k));
    c.phases = std::move(ph.value());
    // split_phases stashes a value once per reading phase: each entry is its own gradient.
    for (const Phases::Stash& st : c.phases.stash) {
      if (st.to != c.reduce_phase) continue;
      // Summing over micro-batches before reducing is exact only for gradients (linear in the
      // micro-batch), which come from the backward phases; the runtime sums in f32 (a bf16
      // gradient's sum too), rounded to the value's dtype once before the reduction.
      if (st.from == kForwardPhase)
        return error("pipeline chunk " + std::to_string(k) +
                     ": the gradient reduction reads a forward value, which cannot be summed "
                     "over the micro-batches first");
    }
    lay_out_grad_pool(&c);
    for (size_t ph = 0; ph < c.phases.graphs.size(); ++ph) {
      const Graph& pg = c.phases.graphs[ph];
      std::vector<std::vector<NodeId>> buckets;  // the gradient buckets' nodes in this phase
      for (const std::vector<NodeId>& b : c.program.part.buckets) {
        buckets.emplace_back();
        for (NodeId n : b) {
          const ValueId v = c.phases.value_of[ph][static_cast<size_t>(local.node(n).outputs[0])];
          if (v >= 0) buckets.back().push_back(pg.value(v).producer);
        }
      }
      c.phase_lists.push_back(lower_instructions(pg, buckets));
      c.phase_memory.push_back(plan_memory(pg));
    }
    c.stash_bytes = stash_bytes(c.phases, kForwardPhase, c.reduce_phase);
    c.weight_stash_bytes = split_w ? stash_bytes(c.phases, kBackwardPhase, c.reduce_phase) : 0;
    out.chunks.push_back(std::move(c));
  }

  // Parameters held by chunks on different stages: their gradients are summed across them.
  std::map<std::string, std::vector<int>> stages_of;
  for (size_t k = 0; k < out.chunks.size(); ++k)
    for (const ParamLayout& pl : out.chunks[k].program.part.params) {
      std::vector<int>& s = stages_of[pl.name];
      const int st = static_cast<int>(k) % stages;
      if (std::find(s.begin(), s.end(), st) == s.end()) s.push_back(st);
    }
  for (const ParamLayout& pl : out.chunks.front().program.part.params)
    if (stages_of[pl.name].size() > 1) out.shared_param_bytes += 4 * pl.local_shape.numel();

  const size_t ns = static_cast<size_t>(stages);
  out.in_flight.resize(ns);
  out.weight_in_flight.resize(ns);
  out.stage_persistent_bytes.assign(ns, 0);
  out.stage_arena_bytes.assign(ns, 0);
  out.stage_stash_bytes.assign(ns, 0);
  out.activation_sends.assign(ns, {});
  out.gradient_sends.assign(ns, {});
  out.stage_p2p_bytes.assign(ns, 0);
  for (size_t s = 0; s < ns; ++s) {
    if (only_stage >= 0 && static_cast<int>(s) != only_stage) continue;
    out.in_flight[s] = max_in_flight(out.schedule, static_cast<int>(s));
    // Send pools (see SendPool): this stage's in-flight count for activations, the previous
    // stage's (the chunk before this stage's first, cyclically) for gradients.
    int64_t act = 0, grad = 0;
    for (size_t k = s; k < out.chunks.size(); k += ns) {
      act = std::max(act, out.chunks[k].send_bytes);
      grad = std::max(grad, out.chunks[k].send_grad_bytes);
    }
    const int prev = max_in_flight(out.schedule, static_cast<int>((s + ns - 1) % ns));
    if (act > 0) out.activation_sends[s] = {out.in_flight[s], act};
    if (grad > 0) out.gradient_sends[s] = {prev, grad};
    for (const PipelineProgram::SendPool& pool : {out.activation_sends[s], out.gradient_sends[s]})
      out.stage_p2p_bytes[s] += pool.slots * pool.slot_bytes;
    out.weight_in_flight[s] = max_weight_in_flight(out.schedule, static_cast<int>(s));
    int64_t arena = 0, stash = 0, wstash = 0;
    for (size_t k = s; k < out.chunks.size(); k += ns) {
      const ChunkProgram& c = out.chunks[k];
      out.stage_persistent_bytes[s] += pipeline_persistent_bytes(c);
      for (const MemoryPlan& m : c.phase_memory) arena = std::max(arena, m.arena_bytes);
      stash = std::max(stash, c.stash_bytes);
      wstash = std::max(wstash, c.weight_stash_bytes);
    }
    out.stage_stash_bytes[s] = out.in_flight[s] * stash + out.weight_in_flight[s] * wstash;
    out.stage_arena_bytes[s] = arena + out.stage_stash_bytes[s];
  }
  return out;
}

}  // namespace tessera
