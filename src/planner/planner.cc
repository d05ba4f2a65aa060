#include "planner/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/format.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/recompute.h"

namespace tessera {

namespace {

// The time bound extrapolates a rank's compute from models of one and two blocks and assumes
// stages of equal cost; it leaves this much room for what that misses.
constexpr double kShapeMargin = 0.95;

// AdamW's and the gradient accumulation's streaming bandwidth (the simulator's).
double optimizer_bandwidth(const ClusterSpec& cluster) {
  return cluster.device.memory_bandwidth * cluster.device.optimizer_efficiency;
}

// A tensor's elements on a rank of `plan`: an expert-stacked one is split over the expert axis.
double rank_elems(const ParamTensors& p, const Plan& plan) {
  return static_cast<double>(p.elems) / (p.experts ? plan.expert_group() : 1);
}

double local_param_elems(const std::vector<ParamTensors>& params, const Plan& plan) {
  double n = 0;
  for (const ParamTensors& p : params) n += p.count * rank_elems(p, plan);
  return n;
}

// `axes` but the expert axis for an expert weight (its gradient is not summed over it).
std::vector<std::string> without_experts(const std::vector<std::string>& axes,
                                         const ParamTensors& p, const Plan& plan) {
  std::vector<std::string> out;
  for (const std::string& a : axes)
    if (!p.experts || a != plan.expert_axis) out.push_back(a);
  return out;
}
// The axes a gradient is all-reduced over (without ZeRO: the data axes and the context axis,
// over which it is a partial sum too), and its block (with ZeRO-2/3: HSDP's replicas and the
// expert axis).
std::vector<std::string> reduced_over(const ParamTensors& p, const Plan& plan) {
  return without_experts(plan.with_context_axis(plan.data_axes), p, plan);
}
std::vector<std::string> replicated_over(const ParamTensors& p, const Plan& plan) {
  return without_experts(plan.replica_axes(), p, plan);
}

}  // namespace

std::string PlanCandidate::describe() const {
  const Plan& p = plan;
  std::string s =
      "tp=" + std::to_string(p.tensor_group()) + " pp=" + std::to_string(p.stages()) +
      " dp=" + std::to_string(p.data_group()) +
      // hsdp=R as --hsdp R means it: R replica groups, each ZeRO-3 over `shard` ranks
      (!p.hsdp()
           ? " zero=" + std::to_string(p.zero)
           : " hsdp=" + std::to_string(p.mesh.group_size(p.replica_axes()) / p.expert_group()) +
                 " shard=" + std::to_string(p.zero_group())) +
      " mb=" + std::to_string(micro_batch) + "x" + std::to_string(p.micro_batches);
  if (p.stages() > 1) {
    s += std::string(" ") + schedule_name(p.schedule);
    if (p.virtual_stages > 1) s += " v=" + std::to_string(p.virtual_stages);
  }
  if (p.context_group() > 1)
    s += " cp=" + std::to_string(p.context_group()) +
         (p.context_attention == ContextAttention::ring ? " ring" : "");
  if (p.expert_group() > 1) s += " ep=" + std::to_string(p.expert_group());
  s += std::string(" rc=") + recompute_name(p.recompute);
  if (p.sequence_parallel) s += " sp";
  if (p.offloads_optimizer()) s += p.offloads_params() ? " offload=params" : " offload";
  return s;
}

double state_bytes_per_param(const Plan& plan, DType precision) {
  const double dp = static_cast<double>(plan.zero_group());
  // In f32 the parameters are the master copy; under mixed precision the f32 master is
  // optimizer state (sim's persistent_bytes_at) and the parameters are in the low precision.
  const bool mixed = precision != DType::f32;
  const double master = 4.0 / ((mixed ? plan.shards_optimizer() : plan.shards_params()) ? dp : 1.0);
  const double moments = 8.0 / (plan.shards_optimizer() ? dp : 1.0);
  const double copy =
      mixed ? static_cast<double>(dtype_size(precision)) / (plan.shards_params() ? dp : 1.0) : 0.0;
  // The f32 gradient the micro-batches accumulate into, held across the step (a pipeline holds
  // it even for one micro-batch); one micro-batch without a pipeline keeps it in the arena.
  const double grads =
      plan.micro_batches > 1 || plan.stages() > 1 ? 4.0 / (plan.shards_grads() ? dp : 1.0) : 0.0;
  // Offloaded, the master and the moments are in host memory: the device keeps the parameter
  // it computes with (in f32 the master's twin).
  if (plan.offloads_params()) return grads;
  if (plan.offloads_optimizer())
    return (mixed ? copy : 4.0 / (plan.shards_params() ? dp : 1.0)) + grads;
  return master + moments + copy + grads;
}

double host_bytes_per_param(const Plan& plan, DType precision) {
  if (!plan.offloads_optimizer()) return 0;
  const double dp = static_cast<double>(plan.zero_group());
  // The f32 master of the local piece; AdamW's moments and the gradient's f32 copy of the block;
  // offloaded parameters' low-precision blocks (an f32 block is its master).
  const double blocks =
      plan.offloads_params() && precision != DType::f32 ? dtype_size(precision) / dp : 0.0;
  return 4.0 / (plan.shards_params() ? dp : 1.0) + 12.0 / (plan.shards_optimizer() ? dp : 1.0) +
         blocks;
}

double params_per_rank(const ModelConfig& cfg, const Plan& plan) {
  const double experts = static_cast<double>(count_expert_params(cfg));
  const double rest = static_cast<double>(count_params(cfg)) - experts;
  return (rest + experts / plan.expert_group()) /
         static_cast<double>(plan.tensor_group() * plan.stages());
}

double plan_memory_bound(const ModelConfig& cfg, const Plan& plan, DType precision) {
  return params_per_rank(cfg, plan) * state_bytes_per_param(plan, precision);
}

double with_activations(const Plan& plan, double state_bound, double state_per_block,
                        double saved_per_block, int64_t blocks) {
  const double all = saved_per_block * static_cast<double>(blocks);
  if (plan.stages() == 1) return state_bound + all;  // one micro-batch's, besides the state
  // Stage s holds b(s) blocks in V chunks: their state, and f(s) micro-batches of activations
  // (the schedule's count, per chunk) in stash slots besides the phase arena that produced
  // them — at least c(s) = state_per_block + (f(s) + 1) / V * saved_per_block per block. With M
  // the fullest stage, b(s) <= M / c(s), so the blocks L <= M * sum 1 / c(s):
  // M >= L / sum(1 / c(s)). (The embedding and head only add to their stages.)
  Result<PipelineSchedule> sched =
      make_schedule(plan.schedule, plan.stages(), plan.micro_batches, plan.virtual_stages);
  const double v = static_cast<double>(plan.virtual_stages);
  double inverse = 0;
  for (int st = 0; st < plan.stages(); ++st) {
    const int f = sched.ok() ? max_in_flight(sched.value(), st)
                             : std::min(plan.stages() - st, plan.micro_batches);
    inverse += 1.0 / (state_per_block + (f + 1) / v * saved_per_block);
  }
  return std::max(state_bound, static_cast<double>(blocks) / inverse);
}

double optimizer_time_bound(const ModelConfig& cfg, const ClusterSpec& cluster, const Plan& plan) {
  // AdamW reads the parameter, gradient and two moments and writes three (fp32) per element of
  // this rank's share (ZeRO-1 and up: 1 / dp of it), at the optimizer's streaming bandwidth.
  const double elems = params_per_rank(cfg, plan) /
                       (plan.shards_optimizer() ? static_cast<double>(plan.zero_group()) : 1.0);
  return 7.0 * 4.0 * elems / optimizer_bandwidth(cluster);
}

double offload_time_bound(const ModelConfig& cfg, const ClusterSpec& cluster, const Plan& plan,
                          DType precision, double sync_seconds) {
  const double local = params_per_rank(cfg, plan);
  const double zg = static_cast<double>(plan.zero_group());
  const double block = local / (plan.shards_optimizer() ? zg : 1.0);
  const double piece = local / (plan.shards_params() ? zg : 1.0);
  const double elem = static_cast<double>(dtype_size(precision));
  const double host = cluster.node.host_optimizer_rate(plan.mesh.size());
  const double link = cluster.node.host_link_rate();
  // The gradient blocks out (f32 accumulators over several micro-batches), the norm's pass,
  // then each tensor's AdamW and sync on the host thread, beside the copies back on the link
  // thread: the longer of the two.
  const double out = (plan.micro_batches > 1 ? 4.0 : elem) * block / link;
  const double norm = 4.0 * block / host;
  if (plan.offloads_params())  // no copies back; each micro-batch's forward copies the blocks in
    return out + norm + 7.0 * 4.0 * block / host + plan.micro_batches * elem * piece / link;
  return out + norm + std::max(7.0 * 4.0 * block / host + sync_seconds, elem * piece / link);
}

double data_comm_time_bound(const std::vector<ParamTensors>& params, const ClusterSpec& cluster,
                            const Plan& plan, DType precision) {
  if (plan.data_group() <= 1) return 0;
  const double elem = static_cast<double>(dtype_size(precision));
  // One collective of `b` bytes over `axes`, as the simulator times it (the fastest algorithm).
  auto time = [&](OpKind kind, double b, const std::vector<std::string>& axes) {
    const GroupLayout group = group_layout(plan.mesh, axes, cluster.node.devices);
    return group.size <= 1 ? 0.0 : collective_time(kind, b, group, cluster).seconds;
  };
  // Streams of different groups overlap: the busiest one bounds the step. A gradient that the
  // tensor axis does not split may be reduced over both axes at once, on another stream: not
  // counted when its gradients are all-reduced.
  double sharded = 0, replicas = 0, reduced = 0;
  for (const ParamTensors& p : params) {
    const double bytes = rank_elems(p, plan) * elem;
    if (!plan.shards_grads()) {
      if (p.tp_split || plan.tensor_group() == 1)
        reduced += p.count * time(OpKind::all_reduce, bytes, reduced_over(p, plan));
      continue;
    }
    sharded += p.count * time(OpKind::reduce_scatter, bytes, plan.zero_axes);
    if (plan.shards_params())
      sharded +=
          p.count * (p.read_backward ? 2.0 : 1.0) * time(OpKind::all_gather, bytes, plan.zero_axes);
    if (p.tp_split || plan.tensor_group() == 1)
      replicas +=
          p.count * time(OpKind::all_reduce, bytes / plan.zero_group(), replicated_over(p, plan));
  }
  const double busiest = std::max({sharded, replicas, reduced});
  // A pipeline reduces once per step, each stage its own blocks: at least the average share.
  return plan.stages() > 1 ? busiest / plan.stages() : busiest;
}

double param_sync_time_bound(const std::vector<ParamTensors>& params, const ClusterSpec& cluster,
                             const Plan& plan, DType precision) {
  if (!plan.shards_optimizer() || plan.shards_params()) return 0;
  const GroupLayout group = group_layout(plan.mesh, plan.zero_axes, cluster.node.devices);
  if (group.size <= 1) return 0;
  const double elem = static_cast<double>(dtype_size(precision));
  double t = 0;
  for (const ParamTensors& p : params)
    t += p.count *
         collective_time(OpKind::all_gather, rank_elems(p, plan) * elem, group, cluster).seconds;
  return t / plan.stages();  // a pipeline stage gathers its own blocks: at least the average
}

double accumulate_time_bound(const std::vector<ParamTensors>& params, const ClusterSpec& cluster,
                             const Plan& plan) {
  const int m = plan.micro_batches;
  if (m <= 1) return 0;
  // The reduced f32 gradient (ZeRO-2/3: this rank's block of it).
  const double bytes = 4.0 * local_param_elems(params, plan) /
                       (plan.shards_grads() ? static_cast<double>(plan.zero_group()) : 1.0);
  // A pipeline's chunks add each micro-batch's into their sums (read both, write one); without
  // one the first micro-batch copies (read, write) and the rest add.
  const double passes = plan.stages() > 1 ? 3.0 : 2.0 + 3.0 * (m - 1);
  return passes * bytes / optimizer_bandwidth(cluster);
}

double pipeline_schedule_bound(const Plan& plan, const PipelineCosts& costs,
                               const ClusterSpec& cluster, double optimizer_seconds,
                               double comm_seconds) {
  const int chunks = plan.chunks();
  if (plan.stages() < 2 || costs.flops.block.empty() ||
      costs.forward.block.size() != costs.flops.block.size() ||
      costs.backward.block.size() != costs.flops.block.size())
    return 0;
  Result<std::vector<int>> cut = balance_stages(costs.flops, chunks);
  if (!cut.ok()) return 0;
  const int m = plan.micro_batches;
  // Each micro-batch's gradients added into the chunk's sums, after its backward pass.
  const double accumulate =
      m > 1 ? 3.0 * 4.0 * costs.block_param_elems / optimizer_bandwidth(cluster) : 0.0;
  // The ops outside the blocks (embedding, head, loss) as measured on the whole model, whose
  // stream may stay whole; under sequence parallelism a stage's input arrives split on the
  // sequence and they may run on 1/tp of it: that share is what is certain.
  const double outside = plan.sequence_parallel ? 1.0 / plan.tensor_group() : 1.0;
  ChunkTimes t;
  size_t at = 0;
  for (int k = 0; k < chunks; ++k) {
    double f = k == 0 ? outside * costs.forward.before : 0.0;
    double b = k == 0 ? outside * costs.backward.before : 0.0;
    if (k == chunks - 1) f += outside * costs.forward.after, b += outside * costs.backward.after;
    const int blocks = cut.value()[static_cast<size_t>(k)];
    for (int i = 0; i < blocks; ++i, ++at) {
      f += costs.forward.block[at];
      b += costs.backward.block[at] + accumulate;
    }
    t.forward.push_back(f);
    t.backward_input.push_back(b);
    t.backward_weight.push_back(0);
  }
  // The busiest stage's work.
  std::vector<double> busy(static_cast<size_t>(plan.stages()), 0.0);
  for (int k = 0; k < chunks; ++k)
    busy[static_cast<size_t>(k % plan.stages())] +=
        m * (t.forward[static_cast<size_t>(k)] + t.backward_input[static_cast<size_t>(k)]);
  double step = *std::max_element(busy.begin(), busy.end());
  if (plan.schedule == ScheduleKind::zb_h1) {
    // The input gradient costs at least half the backward pass (every matmul's dX costs its
    // dW; attention, norms and activations have input gradients only) and the weight
    // gradient at least nothing: the schedule replayed on those.
    for (double& b : t.backward_input) b /= 2;
  }
  Result<PipelineSchedule> sched =
      make_schedule(plan.schedule, plan.stages(), m, plan.virtual_stages);
  if (!sched.ok()) return 0;
  Result<ScheduleTiming> timing = time_schedule(sched.value(), t);
  if (!timing.ok()) return 0;
  step = std::max(step, timing->step_seconds);
  return kShapeMargin * std::max(step + optimizer_seconds, comm_seconds);
}

double plan_time_bound(const Plan& plan, const MicroBatchTime& t, int64_t blocks,
                       double optimizer_seconds, double comm_seconds, double accumulate_seconds) {
  const double p = static_cast<double>(plan.stages()), m = plan.micro_batches;
  if (plan.stages() == 1)
    return kShapeMargin *
           (m * std::max(t.seconds, comm_seconds) + accumulate_seconds + optimizer_seconds);
  // Each micro-batch's gradients are added up on its chunk's stage after its backward pass, as
  // part of it: a micro-batch of the average stage takes micro / p, and the schedule idles
  // (p - 1) such backward-inclusive times (1F1B), 1 / V of that (interleaved), or under
  // zb-h1 (p - 1)(F + B - W) with the addition in W: a block's input gradient (with its
  // recomputation) costs at least its weight gradient — every matmul's dX costs its dW, and
  // attention, norms and activations have input gradients only — so F + B - W is at least
  // (t + F) / 2 less the addition, on the ops alone (the schedule may hide waits).
  const double micro = t.seconds + accumulate_seconds;
  double idle = (p - 1) * micro;
  if (plan.schedule == ScheduleKind::interleaved) idle /= plan.virtual_stages;
  if (plan.schedule == ScheduleKind::zb_h1) {
    const double ops = t.seconds - t.wait_seconds;
    const double forward_ops = t.forward_seconds - t.forward_wait_seconds;
    idle = (p - 1) * std::max(0.0, (ops + forward_ops) / 2.0 - accumulate_seconds);
  }
  // The stages on average, with the bubble; and the stage holding the most blocks (some
  // stage holds ceil(L / p) of them), busy for every micro-batch.
  const int64_t most = (blocks + plan.stages() - 1) / plan.stages();
  const double step =
      std::max((micro * m + idle) / p, t.block_seconds * static_cast<double>(most) * m);
  // The data-parallel comm stream overlaps compute but is busy for at least comm_seconds.
  return kShapeMargin * std::max(step + optimizer_seconds, comm_seconds);
}

Result<PlanSearch> search_plans(const ModelConfig& cfg, const ClusterSpec& cluster,
                                const PlannerOptions& opt) {
  TS_ASSIGN_OR_RETURN(std::unique_ptr<PlanSpace> space, PlanSpace::create(cfg, cluster, opt));
  return search_plans(*space);
}

Result<PlanSearch> search_plans(PlanSpace& space) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& cfg = space.model();
  const ClusterSpec& cluster = space.cluster();
  const PlannerOptions& o = space.options();
  const double capacity = cluster.device.memory_bytes;
  PlanSearch out;
  out.enumerated = space.enumerated();
  out.pruned_by_memory = space.pruned_by_memory();
  out.failed = space.failed_bounds();
  for (const PlanCandidate* c : space.fastest(o.top_k)) out.best.push_back(*c);

  double smallest_peak = 1e300;
  const PlanCandidate* smallest = nullptr;
  const PlanCandidate* failed = nullptr;  // the first candidate the simulator refused
  double smallest_first_stage = 1e300;    // of the candidates pruned after creation
  for (const PlanCandidate& c : space.candidates()) {
    if (!c.error.empty()) {
      ++out.failed;
      if (failed == nullptr) failed = &c;
    }
    if (!c.simulated && c.error.empty() && c.beyond_memory(capacity)) {
      ++out.pruned_by_memory;
      smallest_first_stage =
          std::min(smallest_first_stage, std::max(c.memory_bound, c.first_stage_bytes));
    }
    if (!c.simulated) continue;
    ++out.simulated;
    if (c.sim.peak_memory_bytes < smallest_peak) {
      smallest_peak = c.sim.peak_memory_bytes;
      smallest = &c;
    }
    out.all.push_back(c);
  }
  std::stable_sort(out.all.begin(), out.all.end(),
                   [&](const PlanCandidate& a, const PlanCandidate& b) {
                     if (a.fits(capacity) != b.fits(capacity)) return a.fits(capacity);
                     return a.sim.step_seconds < b.sim.step_seconds;
                   });
  out.seconds = space.create_seconds() +
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (out.best.empty()) {
    const std::string dev = std::to_string(o.gpus) + " x " + cluster.device.name + " (" +
                            format_bytes(capacity) + " each)";
    if (smallest != nullptr)
      return error("no plan of " + cfg.name + " fits on " + dev + ": the smallest, " +
                       smallest->describe() + ", needs " + format_bytes(smallest_peak) +
                       " per device",
                   "use more devices, a smaller --batch or --seq, or a device with more memory");
    if (failed != nullptr)
      return error("no plan of " + cfg.name + " could be timed on " + dev + ": " +
                       failed->describe() + ": " + failed->error,
                   "fix the cluster spec, or run on fewer devices");
    const double bound = std::min(space.smallest_memory_bound(), smallest_first_stage);
    return error("no plan of " + cfg.name + " fits on " + dev +
                     ": its parameters, optimizer state and the activations of one micro-batch "
                     "of one sequence need at least " +
                     format_bytes(bound) + " per device",
                 "use more devices (about " +
                     std::to_string(static_cast<int64_t>(std::ceil(bound / capacity * o.gpus))) +
                     " if the need divides evenly), recomputation, a shorter --seq, or a device "
                     "with more memory");
  }
  return out;
}

}  // namespace tessera
