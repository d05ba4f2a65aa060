#include "parallel/program.h"

#include <map>

#include "base/format.h"
#include "parallel/fuse.h"
#include "parallel/recompute.h"

namespace tessera {

std::vector<Instruction> lower_instructions(const Graph& g,
                                            const std::vector<std::vector<NodeId>>& buckets) {
  std::map<NodeId, int> bucket_of;
  for (size_t b = 0; b < buckets.size(); ++b)
    for (NodeId n : buckets[b]) bucket_of[n] = static_cast<int>(b);
  std::vector<int> ready(g.values().size(), -1);  // instruction after which a value is ready
  std::map<ValueId, int> pending;                 // collective output -> its start instruction
  std::vector<Instruction> out;
  auto wait_for = [&](ValueId v) {
    auto it = pending.find(v);
    if (it == pending.end()) return;
    const Instruction& s = out[static_cast<size_t>(it->second)];
    out.push_back({Instruction::wait, Stream::comm, s.node, -1, s.bucket, {it->second}});
    ready[static_cast<size_t>(v)] = static_cast<int>(out.size()) - 1;
    pending.erase(it);
  };
  // Collectives waited for before node j (memory_plan.h: the planner assumes the same points).
  const std::vector<int> waits = collective_waits(g);
  std::map<NodeId, std::vector<ValueId>> waits_before;
  for (NodeId c = 0; c < static_cast<NodeId>(waits.size()); ++c)
    if (waits[static_cast<size_t>(c)] >= 0)
      waits_before[waits[static_cast<size_t>(c)]].push_back(g.node(c).outputs[0]);
  for (NodeId id = 0; id < static_cast<NodeId>(g.nodes().size()); ++id) {
    const Node& n = g.node(id);
    auto w = waits_before.find(id);
    if (w != waits_before.end())
      for (ValueId v : w->second) wait_for(v);
    if (n.op == OpKind::parameter || n.op == OpKind::input) continue;
    for (ValueId v : n.inputs) wait_for(v);
    Instruction in;
    in.node = id;
    for (ValueId v : n.inputs)
      if (ready[static_cast<size_t>(v)] >= 0) in.deps.push_back(ready[static_cast<size_t>(v)]);
    if (is_collective(n.op) && g.on_host(n.inputs[0])) {  // its block over the link first
      out.push_back({Instruction::param_fetch, Stream::link, id, -1, -1, {}});
      in.deps.push_back(static_cast<int>(out.size()) - 1);
    }
    if (is_collective(n.op)) {
      in.kind = Instruction::start;
      in.stream = Stream::comm;
      auto b = bucket_of.find(id);
      in.bucket = b == bucket_of.end() ? -1 : b->second;
      out.push_back(in);
      pending[n.outputs[0]] = static_cast<int>(out.size()) - 1;
    } else {
      out.push_back(in);
      for (ValueId v : n.outputs) ready[static_cast<size_t>(v)] = static_cast<int>(out.size()) - 1;
    }
  }
  while (!pending.empty()) wait_for(pending.begin()->first);
  return out;
}

namespace {

void lower_optimizer(Program& p) {
  std::vector<Instruction>& out = p.optimizer;
  const bool norm_comm = !p.plan.grad_norm_axes().empty();
  const bool offload = p.plan.offloads_optimizer();
  const int n = static_cast<int>(p.part.params.size());
  std::vector<int> to_host;  // offload: the norm waits for every gradient on the host
  for (int i = 0; offload && i < n; ++i) {
    to_host.push_back(static_cast<int>(out.size()));
    out.push_back({Instruction::grad_to_host, Stream::link, -1, i, -1, {}});
  }
  const int norm = static_cast<int>(out.size());
  out.push_back({Instruction::grad_norm,
                 offload     ? Stream::host
                 : norm_comm ? Stream::comm
                             : Stream::compute,
                 -1, -1, -1, to_host});
  for (int i = 0; i < n; ++i) {
    const ParamLayout& pl = p.part.params[static_cast<size_t>(i)];
    out.push_back(
        {Instruction::optimizer, offload ? Stream::host : Stream::compute, -1, i, -1, {norm}});
    if (pl.optim_sharded && !pl.params_sharded)
      out.push_back(
          {Instruction::param_sync, Stream::comm, -1, i, -1, {static_cast<int>(out.size()) - 1}});
    if (offload && !pl.params_on_host)  // (a host-held block is the one AdamW wrote)
      out.push_back({Instruction::param_to_device,
                     Stream::link,
                     -1,
                     i,
                     -1,
                     {static_cast<int>(out.size()) - 1}});
  }
}

void count_bytes(Program& p) {
  const Graph& g = p.part.local;
  const int group = p.plan.zero_group();
  for (const ParamLayout& pl : p.part.params) {
    const int64_t numel = pl.local_shape.numel();
    const int64_t block = FlatShard{group, 0, numel}.block();
    const DType dtype = g.type(pl.local).dtype;
    const int64_t stored =
        static_cast<int64_t>(dtype_size(dtype)) * (pl.params_sharded ? block : numel);
    if (pl.params_on_host) {  // the f32 master (below) is an f32 block; a bf16/f16 one beside it
      if (dtype != DType::f32) p.host_bytes += stored;
    } else {
      p.param_bytes += stored;
    }
    // The accumulated, reduced gradient (f32 whatever the parameters' dtype); with one
    // micro-batch the optimizer reads it in the arena (the memory plan keeps it live to the
    // end of the micro-step).
    if (p.plan.micro_batches > 1) p.grad_bytes += 4 * (pl.grads_sharded ? block : numel);
    // AdamW's f32 m and v, and for bf16/f16 parameters their f32 master weights, which the
    // optimizer updates (held like its moments).
    const int64_t state = dtype == DType::f32 ? 2 * 4 : 3 * 4;
    const int64_t optim_elems = pl.optim_sharded ? block : numel;
    if (p.plan.offloads_optimizer())  // master of the whole piece; m, v, gradient of the block
      p.host_bytes += 4 * (pl.params_sharded ? block : numel) + 3 * 4 * optim_elems;
    else
      p.optim_bytes += state * optim_elems;
  }
  double micro = 0;
  for (const Node& n : g.nodes()) {
    if (!is_collective(n.op)) continue;
    std::vector<TensorType> in{g.type(n.inputs[0])}, outs{g.type(n.outputs[0])};
    micro += op_bytes(n.op, n.attrs, in, outs);
  }
  double step = micro * p.plan.micro_batches;
  for (const ParamLayout& pl : p.part.params)
    if (pl.optim_sharded && !pl.params_sharded)  // all-gather of the updated blocks
      step += static_cast<double>(group - 1) * 4.0 *
              static_cast<double>(FlatShard{group, 0, pl.local_shape.numel()}.block());
  if (const int n = p.plan.mesh.group_size(p.plan.grad_norm_axes()); n > 1)
    step += 2.0 * (n - 1) / n * 8.0;  // gradient norm: one f64 all-reduce
  p.comm_bytes_per_step = step;
}

}  // namespace

const char* instruction_name(Instruction::Kind k) {
  switch (k) {
    case Instruction::compute:
      return "compute";
    case Instruction::start:
      return "start";
    case Instruction::wait:
      return "wait";
    case Instruction::grad_norm:
      return "grad_norm";
    case Instruction::optimizer:
      return "adamw";
    case Instruction::param_sync:
      return "param_sync";
    case Instruction::grad_to_host:
      return "grad_to_host";
    case Instruction::param_to_device:
      return "param_to_device";
    case Instruction::param_fetch:
      return "param_fetch";
  }
  return "?";
}

const char* stream_name(Stream s) {
  switch (s) {
    case Stream::compute:
      return "compute";
    case Stream::comm:
      return "comm";
    case Stream::host:
      return "host";
    case Stream::link:
      return "link";
  }
  return "?";
}

Status check_order(const std::vector<Instruction>& list) {
  for (size_t i = 0; i < list.size(); ++i)
    for (int d : list[i].deps)
      if (d < 0 || static_cast<size_t>(d) >= i)
        return error("instruction " + std::to_string(i) + " (" + instruction_name(list[i].kind) +
                     ") depends on instruction " + std::to_string(d) +
                     ", which does not come before it");
  return Status();
}

Result<Program> lower(const Graph& g, const Plan& plan, TokenShape tokens) {
  Program p;
  p.plan = plan;
  if (plan.recompute == RecomputePolicy::none) {
    TS_ASSIGN_OR_RETURN(p.part, partition(g, plan, tokens));
  } else {
    // Partition the recomputed graph, then index global_to_local by the caller's graph.
    std::vector<ValueId> map;
    TS_ASSIGN_OR_RETURN(Graph rg, apply_recompute(g, plan.recompute, &map, plan.recompute_layers));
    TS_ASSIGN_OR_RETURN(p.part, partition(rg, plan, tokens));
    std::vector<ValueId> to_local(g.values().size(), -1);
    for (size_t v = 0; v < map.size(); ++v)
      to_local[v] = p.part.global_to_local[static_cast<size_t>(map[v])];
    p.part.global_to_local = std::move(to_local);
    for (size_t i = 0; i < p.part.params.size(); ++i) p.part.params[i].global = g.params()[i];
  }
  if (plan.fuse) TS_RETURN_IF_ERROR(fuse_epilogues(&p.part));
  p.model_flops = g.total_flops();
  p.memory = plan_memory(p.part.local);
  p.micro_step = lower_instructions(p.part.local, p.part.buckets);
  lower_optimizer(p);
  count_bytes(p);
  return p;
}

std::string print_program(const Program& p, size_t max_lines) {
  const Graph& g = p.part.local;
  std::string s = "program: " + p.plan.describe() + ", " + std::to_string(p.micro_step.size()) +
                  " instructions per micro-batch, " + std::to_string(p.optimizer.size()) +
                  " per step\n";
  auto line = [&](size_t i, const Instruction& in) {
    std::string l = (i < 10     ? "   "
                     : i < 100  ? "  "
                     : i < 1000 ? " "
                                : "") +
                    std::to_string(i) + " ";
    const std::string stream = stream_name(in.stream);
    l += stream + std::string(8 - stream.size(), ' ') + instruction_name(in.kind);
    if (in.node >= 0) {
      const Node& n = g.node(in.node);
      l += std::string(" ") + op_name(n.op) + " %" + std::to_string(n.outputs[0]);
      if (is_collective(n.op)) l += " on " + n.attr<GroupAttrs>().axes;
      if (!n.scope.empty()) l += "  # " + n.scope;
    }
    if (in.param >= 0) l += " " + p.part.params[static_cast<size_t>(in.param)].name;
    if (in.bucket >= 0) l += " (bucket " + std::to_string(in.bucket) + ")";
    return l + "\n";
  };
  size_t shown = 0;
  for (size_t i = 0; i < p.micro_step.size() && shown < max_lines; ++i, ++shown)
    s += line(i, p.micro_step[i]);
  if (shown == max_lines) s += "  ... (" + std::to_string(p.micro_step.size() - shown) + " more)\n";
  s += "optimizer:\n";
  for (size_t i = 0; i < p.optimizer.size() && i < max_lines; ++i) s += line(i, p.optimizer[i]);
  return s;
}

}  // namespace tessera
