// The pipeline half of the simulator (simulator.h): each chunk's Program timed for one
// micro-batch, the schedule replayed on those times, then each stage's once-per-step tail.
#include <algorithm>
#include <functional>
#include <utility>

#include "cost/op_cost.h"
#include "parallel/pipeline_program.h"
#include "sim/sim_internal.h"

namespace tessera {

namespace {

// Seconds for one stage's ranks to hand `bytes` each to the next stage's: over the node's
// links when the two stages share a node, else each rank's share of the node's NICs.
double p2p_seconds(const Plan& plan, const ClusterSpec& c, double bytes) {
  if (bytes <= 0) return 0;
  int stride = 1;  // ranks between neighbouring stages
  const std::vector<MeshAxis>& axes = plan.mesh.axes();
  for (size_t i = static_cast<size_t>(plan.mesh.axis_index(plan.pipeline_axis)) + 1;
       i < axes.size(); ++i)
    stride *= axes[i].size;
  const int per_node = std::max(1, c.node.devices);
  if (stride < per_node && per_node % (2 * stride) == 0 && c.node.intra_bandwidth > 0)
    return c.node.intra_latency + bytes / (c.node.intra_bandwidth * c.node.intra_efficiency);
  const double share = c.network.node_bandwidth() / std::min(per_node, plan.mesh.size());
  return c.network.latency + bytes / share;
}

// Stage s's bytes per device: its chunks' persistent state (their Programs' at the run's
// precision, persistent_bytes_at, and the pipeline's gradient buffers) and its arena (phase
// arenas, stash slots and send buffers, at the run's precision).
std::pair<double, double> stage_memory(const PipelineProgram& pp, int s, const SimOptions& opt) {
  const double scale = precision_scale(opt);
  const int stages = pp.schedule.stages, chunks = pp.schedule.chunks();
  double persistent = static_cast<double>(pp.stage_persistent_bytes[static_cast<size_t>(s)]);
  for (int k = s; k < chunks; k += stages) {
    const Program& p = pp.chunks[static_cast<size_t>(k)].program;
    persistent +=
        persistent_bytes_at(p, scale, opt.fp8) - static_cast<double>(p.persistent_bytes());
    // Every gradient's f32 sum (an accumulator, or its share of the pool) at its element size.
    const double saved_per_element = 4.0 * (1 - gradient_sum_scale(opt));
    if (saved_per_element > 0)
      for (const ParamLayout& pl : p.part.params)
        persistent -= saved_per_element * static_cast<double>(pl.local_shape.numel());
  }
  // The arena, stash slots and send buffers hold activations and gradients: the run's precision.
  const double arena = static_cast<double>(pp.stage_arena_bytes[static_cast<size_t>(s)] +
                                           pp.stage_p2p_bytes[static_cast<size_t>(s)]) *
                       scale;
  return {persistent, arena};
}

}  // namespace

Result<SimResult> simulate(const PipelineProgram& pp, const ClusterSpec& cluster,
                           const SimOptions& opt) {
  TS_RETURN_IF_ERROR(check_sim_inputs(pp.plan, cluster, opt));
  const PipelineSchedule& sched = pp.schedule;
  const int stages = sched.stages, chunks = sched.chunks(), m = sched.micro_batches;
  const double scale = precision_scale(opt);
  std::vector<ChunkSim> cs;
  ChunkTimes t;
  double send = 0;
  for (const ChunkProgram& c : pp.chunks) {
    cs.push_back(simulate_chunk(c.program, c.weight_grad, cluster, opt));
    const ChunkSim& k = cs.back();
    const double backward = k.micro_seconds - k.forward_seconds;
    const double w = k.backward_compute > 0 ? k.weight_compute / k.backward_compute : 0;
    t.forward.push_back(k.forward_seconds);
    t.backward_input.push_back(backward * (1 - w));
    t.backward_weight.push_back(backward * w);
    send = std::max(send, static_cast<double>(c.send_bytes) * scale);
  }
  t.p2p = p2p_seconds(pp.plan, cluster, send);
  t.blocking_p2p = opt.blocking_p2p;
  TS_ASSIGN_OR_RETURN(ScheduleTiming timing, time_schedule(sched, t));

  SimResult r;
  r.devices = pp.plan.mesh.size();
  r.streams.clear();
  for (int s = 0; s < stages; ++s) r.streams.push_back("stage " + std::to_string(s));
  // Tied parameters: their gradients summed between the stages holding them (two ranks).
  GroupLayout pair{2, 1};
  if (cluster.node.devices >= r.devices) pair.per_node = 2;
  const double shared =
      pp.shared_param_bytes > 0
          ? collective_time(OpKind::all_reduce, static_cast<double>(pp.shared_param_bytes) * scale,
                            pair, cluster, opt.algo)
                .seconds
          : 0;
  int critical = 0;
  double step = 0, critical_busy = 0, critical_span = 0;
  for (int s = 0; s < stages; ++s) {
    double end = 0, busy = timing.busy_seconds[static_cast<size_t>(s)];
    for (double e : timing.end[static_cast<size_t>(s)]) end = std::max(end, e);
    double tail = 0;
    for (int k = s; k < chunks; k += stages)
      tail += cs[static_cast<size_t>(k)].grad_reduce_seconds +
              cs[static_cast<size_t>(k)].optimizer_seconds;
    if (pp.shared_param_bytes > 0 && (s == 0 || s == stages - 1)) tail += shared;
    if (end + tail > step) {
      step = end + tail;
      critical = s;
      critical_busy = busy;
      critical_span = end;
    }
  }
  r.step_seconds = step;
  // The critical stage's breakdown: compute, its idle time inside the pipeline (the bubble),
  // and what is left (tensor-parallel waits inside micro-steps, the gradient reduction).
  r.bubble_seconds = std::max(0.0, critical_span - critical_busy);
  for (int k = critical; k < chunks; k += stages) {
    const ChunkSim& c = cs[static_cast<size_t>(k)];
    r.optimizer_seconds += c.optimizer_seconds;
    for (const auto& [op, secs] : c.seconds_by_op) r.seconds_by_op[op] += secs * m;
  }
  r.compute_seconds = std::min(critical_busy + r.optimizer_seconds, step - r.bubble_seconds);
  r.exposed_comm_seconds = std::max(0.0, step - r.compute_seconds - r.bubble_seconds);
  for (const ChunkSim& c : cs) r.comm_seconds += c.grad_reduce_seconds;

  // Throughput and FLOPs: every chunk runs on the data x tensor ranks of its stage.
  const Program& first = pp.chunks.front().program;
  const MicroBatchCounts counts = micro_batch_counts(first);
  r.tokens_per_step = counts.tokens * m;
  r.examples_per_step = counts.examples * m;
  if (step > 0) {
    r.tokens_per_second = r.tokens_per_step / step;
    r.examples_per_second = r.examples_per_step / step;
  }
  const double per_stage = static_cast<double>(r.devices) / stages;
  for (const ChunkSim& c : cs) r.hardware_flops_per_step += c.hardware_flops * m * per_stage;
  r.model_flops_per_step = pp.model_flops * m;
  const double peak = run_peak_flops(cluster.device, opt);
  if (step > 0) {
    r.model_tflops_per_device = r.model_flops_per_step / step / r.devices / 1e12;
    r.hardware_tflops_per_device = r.hardware_flops_per_step / step / r.devices / 1e12;
    r.mfu = r.model_tflops_per_device * 1e12 / peak;
    r.hfu = r.hardware_tflops_per_device * 1e12 / peak;
  }
  // Memory: the fullest stage (the one with the most micro-batches in flight, usually 0).
  for (int s = 0; s < stages; ++s) {
    const auto [persistent, arena] = stage_memory(pp, s, opt);
    r.stage_peak_bytes.push_back(persistent + arena);
    if (persistent + arena > r.peak_memory_bytes) {
      r.peak_memory_bytes = persistent + arena;
      r.persistent_bytes = persistent;
      r.arena_bytes = arena;
    }
  }
  r.bubble_fraction = timing.bubble_fraction;
  r.stage_layers = pp.per_chunk;
  if (opt.trace) {
    for (int s = 0; s < stages; ++s) {
      const std::vector<PipeAction>& acts = sched.actions[static_cast<size_t>(s)];
      for (size_t i = 0; i < acts.size(); ++i) {
        TraceEvent e;
        e.stream = s;
        e.start = timing.start[static_cast<size_t>(s)][i];
        e.duration = timing.end[static_cast<size_t>(s)][i] - e.start;
        e.category = acts[i].op == PipeOp::forward ? "forward" : "backward";
        e.name = std::string(pipe_op_name(acts[i].op)) + " mb " +
                 std::to_string(acts[i].micro_batch) + " chunk " +
                 std::to_string(sched.model_chunk(s, acts[i].chunk));
        if (e.duration > 0) r.events.push_back(std::move(e));
      }
    }
  }
  return r;
}

Result<SimResult> simulate_plan(const Graph& g, const Plan& plan, const ClusterSpec& cluster,
                                const SimOptions& opt) {
  if (plan.stages() == 1) {
    TS_ASSIGN_OR_RETURN(Program prog, lower(g, plan));
    return simulate(prog, cluster, opt);
  }
  TS_ASSIGN_OR_RETURN(PipelineProgram pp, lower_pipeline(g, plan));
  return simulate(pp, cluster, opt);
}

Result<double> simulate_stage_memory(const Graph& g, const Plan& plan, const ClusterSpec& cluster,
                                     const SimOptions& opt, int stage) {
  if (plan.stages() == 1) return error("simulate_stage_memory: the plan has no pipeline stages");
  if (stage < 0 || stage >= plan.stages())
    return error("simulate_stage_memory: no stage " + std::to_string(stage) + " of " +
                 std::to_string(plan.stages()));
  TS_ASSIGN_OR_RETURN(PipelineProgram pp, lower_pipeline(g, plan, stage));
  const auto [persistent, arena] = stage_memory(pp, stage, opt);
  return persistent + arena;
}

}  // namespace tessera
