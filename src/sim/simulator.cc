#include "sim/simulator.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "base/format.h"
#include "cost/op_cost.h"
#include "models/model.h"
#include "parallel/partition.h"
#include "sim/sim_internal.h"

namespace tessera {

namespace {

std::string format_seconds(double s) {
  char buf[32];
  if (s >= 1)
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  else if (s >= 1e-3)
    std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  return buf;
}

// The offloaded optimizer's streams: the runner's host thread (the gradients in, the norm,
// AdamW and ZeRO-1/2's syncs, one after another) and its link thread (each updated piece back
// to the device, beside the next pieces' AdamW).
constexpr const char* kHostLane = "host";
constexpr const char* kLinkLane = "host link";

class Schedule {
 public:
  Schedule(const Program& prog, const ClusterSpec& c, const SimOptions& opt, SimResult* r)
      : prog_(prog), c_(c), opt_(opt), r_(r), g_(prog.local()) {
    scale_ = precision_scale(prog, opt);
    node_cost_.assign(g_.nodes().size(), OpTime{-1.0});
    if (opt.tp_comm_overlap) tp_overlap_ = tp_overlap_gemms(g_, prog.plan);
  }

  void run() {
    double first_forward = 0;
    for (int mb = 0; mb < prog_.plan.micro_batches; ++mb) {
      run_list(prog_.micro_step, "compute");
      if (mb == 0) first_forward = forward_end_;
      // One micro-batch: the optimizer reads the gradients in the arena, nothing is copied.
      if (prog_.plan.micro_batches > 1) accumulate_grads(mb == 0);
    }
    const double t = all_free();
    compute_free_ = phase_start_ = t;
    for (auto& [key, free] : lanes_) free = t;
    run_list(prog_.optimizer, "optimizer");
    r_->step_seconds = optimizer_end(first_forward);
    // Offloaded, the device waits from the backward's end until its parameters are back, and
    // (parameters offloaded) while it copies each block in for its gathers.
    if (prog_.plan.offloads_optimizer())
      r_->offload_seconds = r_->step_seconds - t + fetch_seconds_;
  }

  // A pipeline chunk: one micro-batch without its gradient collectives (reduced once per step:
  // timed into grad_reduce_seconds), then the optimizer alone.
  ChunkSim run_chunk(const std::vector<char>& weight_grad) {
    ChunkSim c;
    weight_grad_ = &weight_grad;
    chunk_ = &c;
    run_list(prog_.micro_step, "compute");
    c.micro_seconds = all_free();
    c.forward_seconds = std::min(forward_end_, c.micro_seconds);
    if (prog_.plan.micro_batches > 1) {  // adding this micro-batch's gradients into the sums
      accumulate_grads(false);
      const double t = all_free() - c.micro_seconds;
      c.micro_seconds += t;
      c.weight_compute += t;
      c.backward_compute += t;
    }
    c.hardware_flops = hardware_flops_;
    c.model_flops = model_flops_;
    compute_free_ = phase_start_ = 0;
    for (auto& [key, free] : lanes_) free = 0;
    run_list(prog_.optimizer, "optimizer");
    c.optimizer_seconds = optimizer_end(c.forward_seconds);
    chunk_ = nullptr;
    return c;
  }

 private:
  // When the optimizer phase ends: when every stream is free, or (overlap_param_gather) when
  // all but the parameters' all-gathers are, plus what of those the next step's forward of
  // `forward` seconds does not cover.
  double optimizer_end(double forward) const {
    if (gather_end_ <= 0) return all_free();
    const std::string gathers = "comm " + axes_key(prog_.plan.zero_axes);
    double t = compute_free_;
    for (const auto& [key, free] : lanes_)
      if (key != gathers) t = std::max(t, free);
    return t + std::max(0.0, gather_end_ - t - forward);
  }

  // The GEMM a collective is chunked against, or null.
  const TpOverlap* tp_overlap(NodeId id) const {
    if (id < 0 || static_cast<size_t>(id) >= tp_overlap_.size()) return nullptr;
    const TpOverlap& o = tp_overlap_[static_cast<size_t>(id)];
    return o.producer >= 0 || o.consumer >= 0 ? &o : nullptr;
  }

  // Seconds and FLOPs of a compute or collective node, computed once per node.
  const OpTime& node_cost(NodeId id) {
    OpTime& t = node_cost_[static_cast<size_t>(id)];
    if (t.seconds < 0) {
      const Node& n = g_.node(id);
      if (is_collective(n.op)) {
        const double pieces = collective_pieces(n);
        t = OpTime{pieces * collective(n.op, collective_bytes(g_, n, scale_) / pieces,
                                       axes_of_key(n.attr<GroupAttrs>().axes))};
      } else {
        t = op_time(g_, n, c_.device, c_.op_efficiency, opt_.precision, opt_.fp8, opt_.attention);
      }
    }
    return t;
  }

  double collective(OpKind kind, double bytes, const std::vector<std::string>& axes) {
    std::string key = axes_key(axes);
    auto it = layouts_.find(key);
    if (it == layouts_.end())
      it = layouts_.emplace(key, group_layout(prog_.plan.mesh, axes, c_.node.devices)).first;
    return collective_time(kind, bytes, it->second, c_, opt_.algo).seconds;
  }

  // One comm stream per rank group, as the runtime has one comm thread per communicator
  // (comm/communicator.h): collectives of different axes overlap each other. Links shared by
  // two groups (both inter-node) are not modelled as contended.
  // When each stream other than compute is next free, by its name in SimResult::streams.
  double& lane(const std::string& stream) {
    auto it = lanes_.find(stream);
    if (it == lanes_.end()) {
      it = lanes_.emplace(stream, phase_start_).first;
      r_->streams.push_back(stream);
    }
    return it->second;
  }
  double& comm_free(const std::string& axes) { return lane("comm " + axes); }
  int stream_id(const std::string& stream) const {
    for (size_t i = 1; i < r_->streams.size(); ++i)
      if (r_->streams[i] == stream) return static_cast<int>(i);
    return 0;
  }
  double all_free() const {
    double t = compute_free_;
    for (const auto& [key, free] : lanes_) t = std::max(t, free);
    return t;
  }
  // The offloaded optimizer's rates: this rank's share of its node's host memory bandwidth
  // at the CPU AdamW's efficiency, and its host link.
  double host_rate() const { return c_.node.host_optimizer_rate(prog_.plan.mesh.size()); }
  double link_rate() const { return c_.node.host_link_rate(); }
  // The group a comm-stream instruction runs on.
  std::string comm_axes(const Instruction& in) const {
    if (in.kind == Instruction::param_sync) return axes_key(prog_.plan.zero_axes);
    if (in.kind == Instruction::grad_norm) return axes_key(prog_.plan.grad_norm_axes());
    return g_.node(in.node).attr<GroupAttrs>().axes;
  }

  // After each micro-batch (of several) the runtime adds the reduced gradients into persistent
  // buffers (the first one copies: read + write; later ones read both and write one); it waits
  // for the last reductions first. Nothing when the GEMMs add into the sums themselves.
  void accumulate_grads(bool first) {
    if (opt_.fused_grad_accumulation) return;  // done in the weight-gradient GEMMs
    double bytes = 0;
    for (const ParamLayout& pl : prog_.part.params)
      bytes += (first ? 2.0 : 3.0) * static_cast<double>(g_.type(pl.local_grad).bytes());
    double t = bytes / (c_.device.memory_bandwidth * c_.device.optimizer_efficiency);
    double start = all_free();
    compute_free_ = start + t;
    r_->compute_seconds += t;
    r_->seconds_by_op["accumulate_grads"] += t;
  }

  // The optimizer list with the state in host memory: gradient blocks over the link, the norm
  // and AdamW streaming the f32 state on the host, ZeRO-1/2's all-gathers of the f32 master
  // blocks in host memory, the updated pieces back over the link in the run's precision.
  // Elements of this rank's piece of a parameter, or (sharded) of its padded ZeRO block.
  double elems(const ParamLayout& pl, bool sharded) const {
    const int64_t numel = pl.local_shape.numel();
    return static_cast<double>(sharded ? FlatShard{prog_.plan.zero_group(), 0, numel}.block()
                                       : numel);
  }

  double offloaded_seconds(const Instruction& in, bool* on_comm) {
    const double host = host_rate(), link = link_rate();
    // The gradient as the micro-step leaves it: in the arena at the run's precision, or an f32
    // accumulator over several micro-batches.
    const double grad_elem = prog_.plan.micro_batches > 1 ? 4.0 : 4.0 * scale_;
    const ParamLayout* pl =
        in.param >= 0 ? &prog_.part.params[static_cast<size_t>(in.param)] : nullptr;
    switch (in.kind) {
      case Instruction::grad_to_host:
        return grad_elem * elems(*pl, pl->optim_sharded) / link;
      case Instruction::grad_norm: {
        double e = 0;
        for (const ParamLayout& p : prog_.part.params) e += elems(p, p.optim_sharded);
        return 4.0 * e / host;
      }
      case Instruction::optimizer:
        return 7.0 * 4.0 * elems(*pl, pl->optim_sharded) / host;
      case Instruction::param_sync: {
        *on_comm = true;
        const int zg = prog_.plan.zero_group();
        return collective(OpKind::all_gather, 4.0 * elems(*pl, true) * zg, prog_.plan.zero_axes) +
               4.0 * elems(*pl, false) / host;
      }
      case Instruction::param_to_device:
        return 4.0 * scale_ * elems(*pl, pl->params_sharded) / link;
      case Instruction::param_fetch:  // a host-held block, in the run's precision
        return scale_ * static_cast<double>(g_.type(g_.node(in.node).inputs[0]).bytes()) / link;
      default:
        return 0;
    }
  }

  // Optimizer-phase instructions: memory-bound updates of this rank's blocks.
  double optimizer_seconds(const Instruction& in, bool* on_comm) {
    *on_comm = false;
    const int zg = prog_.plan.zero_group();
    const double bw = c_.device.memory_bandwidth * c_.device.optimizer_efficiency;
    if (prog_.plan.offloads_optimizer()) return offloaded_seconds(in, on_comm);
    switch (in.kind) {
      case Instruction::grad_norm: {  // its all-reduce, when sharded, is timed by run_list
        double bytes = 0;
        for (const ParamLayout& pl : prog_.part.params) bytes += 4.0 * elems(pl, pl.grads_sharded);
        return bytes / bw + c_.device.launch_overhead;
      }
      case Instruction::optimizer: {
        // AdamW on fp32 master state: read p, g, m, v; write p, m, v.
        const ParamLayout& pl = prog_.part.params[static_cast<size_t>(in.param)];
        return 7.0 * 4.0 * elems(pl, pl.optim_sharded) / bw + c_.device.launch_overhead;
      }
      case Instruction::param_sync: {
        // The runtime copies its block out, all-gathers, copies the whole tensor back, and
        // waits for each parameter in turn (StepRunner::sync_param).
        *on_comm = true;
        const ParamLayout& pl = prog_.part.params[static_cast<size_t>(in.param)];
        double whole = 4.0 * scale_ * elems(pl, true) * zg;
        double copies = 2.0 * 4.0 * (elems(pl, true) + elems(pl, false)) / bw;
        return collective(OpKind::all_gather, whole, prog_.plan.zero_axes) + copies;
      }
      default:
        return 0;
    }
  }

  void run_list(const std::vector<Instruction>& list, const char* category) {
    std::vector<double> end(list.size(), 0.0);
    for (size_t i = 0; i < list.size(); ++i) {
      const Instruction& in = list[i];
      double ready = 0;
      for (int d : in.deps) ready = std::max(ready, end[static_cast<size_t>(d)]);
      double dur = 0;
      bool comm = in.stream == Stream::comm;
      if (chunk_ && in.bucket >= 0 &&
          (in.kind == Instruction::start || in.kind == Instruction::wait)) {
        if (in.kind == Instruction::start)
          chunk_->grad_reduce_seconds += node_cost(in.node).seconds;
        end[i] = ready;
        continue;
      }
      if (in.kind == Instruction::compute || in.kind == Instruction::start) {
        dur = node_cost(in.node).seconds;
      } else if (in.kind == Instruction::wait) {
        dur = 0;
      } else {
        dur = optimizer_seconds(in, &comm);
      }
      const std::string axes = comm ? comm_axes(in) : std::string();
      // The offloaded optimizer: the runner's host thread takes the gradients in and runs the
      // norm, AdamW and the syncs one after another ("host"), its link thread copies each
      // updated piece back beside the next update ("host link"; StepRunner::step).
      // A parameter's fetch is copied on the compute stream, before the gather it feeds (a copy
      // stream of its own would overlap it with compute).
      const bool fetch = in.kind == Instruction::param_fetch;
      const bool offloaded = (in.stream == Stream::host || in.stream == Stream::link) && !fetch;
      // The runner executes the list in order (StepRunner): a collective is issued when the
      // compute stream reaches its start, and a wait holds the compute stream until its
      // collective ends while the comm stream goes on with what is queued behind it.
      const bool on_comm = comm && in.kind != Instruction::wait;
      const char* off_lane = in.kind == Instruction::param_to_device ? kLinkLane : kHostLane;
      // A ring shift's send and receive run on the communicator's point-to-point stream, beside
      // its collectives (Communicator::send/recv).
      const bool p2p = on_comm && in.node >= 0 && g_.node(in.node).op == OpKind::ring_shift;
      double& free = offloaded ? lane(off_lane)
                     : p2p     ? lane("p2p " + axes)
                     : on_comm ? comm_free(axes)
                               : compute_free_;
      double start = std::max(free, ready);
      // (An offloaded optimizer's syncs are issued by the host, after their update.)
      const bool host_issued =
          in.kind == Instruction::param_sync && prog_.plan.offloads_optimizer();
      if (on_comm && !host_issued) start = std::max(start, compute_free_);
      const TpOverlap* tpo = in.node >= 0 ? tp_overlap(in.node) : nullptr;
      if (tpo && in.kind == Instruction::start && tpo->producer >= 0)
        // Chunked against the GEMM that produced its input: it starts with that GEMM.
        start = std::max(free, start - node_cost(tpo->producer).seconds);
      if (tpo && in.kind == Instruction::start) coll_window_[in.node] = {start, start + dur};
      if (tpo && in.kind == Instruction::wait && tpo->consumer >= 0) {
        // Chunked against the GEMM that consumes its output: that GEMM may start as early as
        // it still ends with the gather (never before the gather starts).
        const auto w = coll_window_.find(in.node);
        if (w != coll_window_.end())
          start = std::max({compute_free_, w->second.first,
                            w->second.second - node_cost(tpo->consumer).seconds});
      }
      end[i] = start + dur;
      free = end[i];
      // The device copies a synced parameter in and out; offloaded, the host does. Either way
      // the runner waits for the sync before it goes on, unless the gathers overlap the next
      // step's forward (overlap_param_gather: optimizer_end times what they leave exposed).
      if (in.kind == Instruction::param_sync) {
        if (opt_.overlap_param_gather && !prog_.plan.offloads_optimizer()) {
          gather_end_ = std::max(gather_end_, end[i]);
        } else {
          double& waits = prog_.plan.offloads_optimizer() ? lane(kHostLane) : compute_free_;
          waits = std::max(waits, end[i]);
        }
      }
      // Where the comm thread shares the compute cores, part of its time is taken from compute.
      if (comm && dur > 0 && c_.node.comm_overlap < 1 && !host_issued) {
        double stolen = (1 - c_.node.comm_overlap) * dur;
        compute_free_ = std::max(compute_free_, start) + stolen;
        r_->compute_seconds += stolen;
      }
      if (in.kind == Instruction::grad_norm && !prog_.plan.grad_norm_axes().empty()) {
        // The sum of squares is all-reduced over the ZeRO group; AdamW waits for it.
        double ar = collective(OpKind::all_reduce, 8.0, prog_.plan.grad_norm_axes());
        double& norm_free = comm_free(axes_key(prog_.plan.grad_norm_axes()));
        double ar_start = std::max(norm_free, end[i]);
        norm_free = ar_start + ar;
        r_->comm_seconds += ar;
        end[i] = (offloaded ? lane(kHostLane) : compute_free_) = norm_free;
      }
      if (fetch) fetch_seconds_ += dur;
      if (in.stream == Stream::host)
        r_->host_cpu_seconds += dur;
      else if (in.stream == Stream::link)
        r_->host_link_seconds += dur;
      else if (comm)
        r_->comm_seconds += dur;
      else
        r_->compute_seconds += dur;
      if (in.kind == Instruction::compute && !in_backward_pass(g_.node(in.node)))
        forward_end_ = std::max(forward_end_, end[i]);
      if (chunk_ && in.kind == Instruction::compute) {
        const Node& n = g_.node(in.node);
        if (in_backward_pass(n)) {
          chunk_->backward_compute += dur;
          if ((*weight_grad_)[static_cast<size_t>(in.node)]) chunk_->weight_compute += dur;
        }
      }
      if (in.kind == Instruction::compute) {
        const Node& n = g_.node(in.node);
        r_->seconds_by_op[op_name(n.op)] += dur;
        hardware_flops_ += node_cost(in.node).flops;
        if (!n.recompute) model_flops_ += node_cost(in.node).flops;
      } else if (in.kind == Instruction::start) {
        r_->seconds_by_op[op_name(g_.node(in.node).op)] += dur;
      } else if (!comm && !offloaded && !fetch) {  // grad_norm and AdamW on the compute stream
        r_->optimizer_seconds += dur;
      }
      if (opt_.trace && dur > 0)
        record(in,
               offloaded ? stream_id(off_lane)
               : comm    ? stream_id("comm " + axes)
                         : 0,
               start, dur, category);
    }
  }

  void record(const Instruction& in, int stream, double start, double dur, const char* category) {
    TraceEvent e;
    e.stream = stream;
    e.start = start;
    e.duration = dur;
    e.category = in.stream == Stream::comm      ? "comm"
                 : in.stream == Stream::compute ? category
                                                : "offload";
    if (in.node >= 0) {
      const Node& n = g_.node(in.node);
      e.name = std::string(op_name(n.op)) + (n.scope.empty() ? "" : " " + n.scope);
      if (n.recompute) e.name += " (recompute)";
    } else if (in.param >= 0) {
      e.name = std::string(in.kind == Instruction::param_sync  ? "all_gather"
                           : in.kind == Instruction::optimizer ? "adamw"
                                                               : instruction_name(in.kind)) +
               " " + prog_.part.params[static_cast<size_t>(in.param)].name;
    } else {
      e.name = "grad_norm";
    }
    r_->events.push_back(std::move(e));
  }

 public:
  double hardware_flops_ = 0, model_flops_ = 0;  // per rank, per step
  double fetch_seconds_ = 0;  // Plan::offload params: the blocks copied in, per step

 private:
  const Program& prog_;
  const ClusterSpec& c_;
  const SimOptions& opt_;
  SimResult* r_;
  const Graph& g_;
  double scale_ = 1;
  std::vector<OpTime> node_cost_;
  std::map<std::string, GroupLayout> layouts_;
  double compute_free_ = 0;
  std::map<std::string, double> lanes_;  // "comm <axes>", "host"
  double phase_start_ = 0;               // where a stream first used in this phase starts
  ChunkSim* chunk_ = nullptr;            // run_chunk's figures
  const std::vector<char>* weight_grad_ = nullptr;
  double forward_end_ = 0;             // the last forward instruction's end
  double gather_end_ = 0;              // overlap_param_gather: the last parameter all-gather's end
  std::vector<TpOverlap> tp_overlap_;  // tp_comm_overlap, by node
  std::map<NodeId, std::pair<double, double>> coll_window_;  // its collectives' start and end
};

}  // namespace

MicroBatchCounts micro_batch_counts(const Program& p) {
  const Graph& g = p.local();
  MicroBatchCounts c;
  const double ranks = p.plan.data_group();
  const ValueId tok = g.find_input(kTokensInput);
  // A context axis splits every sequence: each rank's tokens are a chunk of its rows'.
  if (tok >= 0)
    c.tokens = static_cast<double>(g.type(tok).shape.numel()) * ranks * p.plan.context_group();
  for (ValueId in : g.inputs())
    if (g.type(in).shape.rank() > 0) {
      c.examples = static_cast<double>(g.type(in).shape[0]) * ranks;
      break;
    }
  return c;
}

double collective_bytes(const Graph& g, const Node& n, double scale) {
  const TensorType& in = g.type(n.inputs[0]);
  const double whole =
      static_cast<double>(n.op == OpKind::all_gather ? g.type(n.outputs[0]).bytes() : in.bytes());
  return in.shape.numel() > 1 ? whole * scale : whole;
}

double collective_pieces(const Node& n) {
  const bool pieced = n.op == OpKind::all_gather || n.op == OpKind::reduce_scatter;
  return pieced ? static_cast<double>(std::max<int64_t>(1, n.attr<GroupAttrs>().segments)) : 1.0;
}

// Where the members of rank 0's group over `axes` sit: how many share a node.
GroupLayout group_layout(const Mesh& mesh, const std::vector<std::string>& axes,
                         int devices_per_node) {
  GroupLayout g;
  g.size = mesh.group_size(axes);
  int color = mesh.group_color(0, axes), same_node = 0;
  for (int r = 0; r < mesh.size() && r < devices_per_node; ++r)
    if (mesh.group_color(r, axes) == color) ++same_node;
  g.per_node = std::max(1, std::min(same_node, g.size));
  // Ragged placement (12 ranks on nodes of 8: 8 + 4): modelled as equal nodes of the largest
  // count dividing both (4), a little more inter-node traffic than the real placement, where
  // every hop inter-node (the old model) made such runs ~3x slower than they are.
  g.per_node = std::gcd(g.size, g.per_node);
  return g;
}

double precision_scale(const SimOptions& opt) {
  return static_cast<double>(dtype_size(opt.precision)) / 4.0;
}

double precision_scale(const Program& prog, const SimOptions& opt) {
  for (const ParamLayout& pl : prog.part.params)
    if (prog.local().type(pl.local).dtype != DType::f32) return 1.0;
  return precision_scale(opt);
}

double gradient_sum_scale(const SimOptions& opt) {
  return opt.f16_gradient_sums && opt.precision == DType::f16 ? 0.5 : 1.0;
}

double persistent_bytes_at(const Program& prog, double scale, bool fp8, double grad_scale) {
  double fp8_copies = 0;  // one byte per local parameter element
  if (fp8)
    for (const ParamLayout& pl : prog.part.params)
      if (!pl.params_on_host)
        fp8_copies += static_cast<double>(prog.local().type(pl.local).shape.numel());
  if (scale >= 1) return static_cast<double>(prog.persistent_bytes()) + fp8_copies;
  const double master = static_cast<double>(prog.optim_bytes) / 2.0;  // 4 of AdamW's 8 bytes
  return static_cast<double>(prog.param_bytes) * scale + master +
         static_cast<double>(prog.grad_bytes) * grad_scale + static_cast<double>(prog.optim_bytes) +
         fp8_copies;
}

double host_bytes_at(const Program& prog, double scale) {
  double bytes = static_cast<double>(prog.host_bytes);
  // An f32 graph's host-held blocks are their masters; at a lower precision a copy beside them.
  if (scale < 1)
    for (const ParamLayout& pl : prog.part.params)
      if (pl.params_on_host)
        bytes += scale * static_cast<double>(prog.local().type(pl.local).bytes());
  return bytes;
}

Status parse_sim_precision(const std::string& name, SimOptions* opt) {
  if (name == "fp8") {
    opt->precision = DType::bf16;
    opt->fp8 = true;
    return Status();
  }
  std::optional<DType> d = parse_dtype(name);
  if (!d || *d == DType::i32)
    return error("--precision '" + name + "' is not one of f32 (fp32), bf16, f16 (fp16), fp8");
  opt->precision = *d;
  opt->fp8 = false;
  return Status();
}

const char* sim_precision_name(const SimOptions& opt) {
  return opt.fp8 ? "fp8" : dtype_name(opt.precision);
}

SearchCost cluster_search_cost(const ClusterSpec& cluster, DType precision, const Plan& plan,
                               int64_t blocks) {
  SearchCost c;
  c.flops_per_byte = flops_per_intra_byte(cluster, precision);
  c.state_budget_bytes = cluster.device.memory_bytes;
  c.state_bytes_per_element = state_bytes_per_element(plan, precision);
  const int64_t stages = std::max(plan.stages(), 1);
  c.blocks = static_cast<double>((blocks + stages - 1) / stages);
  return c;
}

double run_peak_flops(const DeviceSpec& dev, const SimOptions& opt) {
  return opt.fp8 ? dev.peak_flops_fp8 : dev.peak_flops(opt.precision);
}

Status check_precision(const ClusterSpec& cluster, const SimOptions& opt) {
  if (opt.precision == DType::i32) return error("simulate: precision must be f32, bf16 or f16");
  if (opt.fp8 && opt.precision != DType::bf16)
    return error("simulate: FP8 GEMMs run beside bf16 (the precision of everything else), not " +
                 std::string(dtype_name(opt.precision)));
  if (opt.fp8 && cluster.device.peak_flops_fp8 <= 0)
    return error("cluster '" + cluster.name + "': " + cluster.device.name +
                     " has no FP8 peak (peak_tflops_fp8 in its [device])",
                 "simulate in bf16, or give the device's dense FP8 peak in a cluster spec file");
  if (cluster.device.peak_flops(opt.precision) <= 0 || cluster.device.memory_bandwidth <= 0)
    return error("cluster '" + cluster.name + "' has no peak FLOP/s or memory bandwidth for " +
                 dtype_name(opt.precision));
  return Status();
}

Status check_sim_inputs(const Plan& plan, const ClusterSpec& cluster, const SimOptions& opt) {
  TS_RETURN_IF_ERROR(check_precision(cluster, opt));
  if (plan.offloads_optimizer() && !cluster.node.offload_known())
    return error("cluster '" + cluster.name +
                     "' does not give its host side, so an offloaded "
                     "optimizer cannot be timed",
                 "add host_memory_bandwidth_gbs and host_link_gbs to its [node] (the shipped "
                 "presets give them, e.g. clusters/dgx-h100.toml)");
  TS_RETURN_IF_ERROR(validate(plan));  // what a plan may not combine (offload with stages)
  const int devices = plan.mesh.size();
  if (devices > cluster.node.devices && cluster.network.node_bandwidth() <= 0)
    return error("cluster '" + cluster.name + "' is one node of " +
                     std::to_string(cluster.node.devices) +
                     " devices with no network ([network] "
                     "nics = 0), but the plan has " +
                     std::to_string(devices) + " ranks",
                 "use at most " + std::to_string(cluster.node.devices) +
                     " devices, or a cluster spec with more devices per node or a [network]");
  return Status();
}

ChunkSim simulate_chunk(const Program& prog, const std::vector<char>& weight_grad,
                        const ClusterSpec& cluster, const SimOptions& opt) {
  SimResult scratch;
  Schedule s(prog, cluster, opt, &scratch);
  ChunkSim c = s.run_chunk(weight_grad);
  c.seconds_by_op = std::move(scratch.seconds_by_op);
  return c;
}

Result<SimResult> simulate(const Program& prog, const ClusterSpec& cluster, const SimOptions& opt) {
  TS_RETURN_IF_ERROR(check_sim_inputs(prog.plan, cluster, opt));
  const int devices = prog.plan.mesh.size();
  SimResult r;
  r.devices = devices;
  Schedule s(prog, cluster, opt, &r);
  s.run();
  const MicroBatchCounts counts = micro_batch_counts(prog);
  r.tokens_per_step = counts.tokens * prog.plan.micro_batches;
  r.examples_per_step = counts.examples * prog.plan.micro_batches;
  if (r.step_seconds > 0) {
    r.tokens_per_second = r.tokens_per_step / r.step_seconds;
    r.examples_per_second = r.examples_per_step / r.step_seconds;
  }
  // Every rank runs the same stream on its own shard: hardware FLOPs are the local ones times
  // the devices. Model FLOPs count each op of the global graph once: the local ones scaled by
  // global / (local op FLOPs), which is the device count under data parallelism and less
  // where a tensor axis replicates work (norms, residual adds, the loss).
  // (The schedule's FLOP counts already cover every micro-batch of the step.)
  r.hardware_flops_per_step = s.hardware_flops_ * r.devices;
  double local = 0;
  const Graph& lg = prog.local();
  for (const Node& n : lg.nodes()) {
    if (n.recompute || is_collective(n.op)) continue;
    std::vector<TensorType> in, out;
    for (ValueId v : n.inputs) in.push_back(lg.type(v));
    for (ValueId v : n.outputs) out.push_back(lg.type(v));
    local += op_flops(n.op, n.attrs, in, out);
  }
  const double replicas = local > 0 ? prog.model_flops / local : r.devices;
  r.model_flops_per_step = s.model_flops_ * replicas;
  const double peak = run_peak_flops(cluster.device, opt);
  if (r.step_seconds > 0) {
    r.model_tflops_per_device = r.model_flops_per_step / r.step_seconds / r.devices / 1e12;
    r.hardware_tflops_per_device = r.hardware_flops_per_step / r.step_seconds / r.devices / 1e12;
    r.mfu = r.model_tflops_per_device * 1e12 / peak;
    r.hfu = r.hardware_tflops_per_device * 1e12 / peak;
  }
  // Memory: the state (persistent_bytes_at), and the activation arena at the run's precision.
  const double scale = precision_scale(prog, opt);
  r.persistent_bytes =
      persistent_bytes_at(prog, scale, opt.fp8, scale < 1 ? gradient_sum_scale(opt) : 1.0);
  r.arena_bytes = static_cast<double>(prog.memory.arena_bytes) * scale;
  r.peak_memory_bytes = r.persistent_bytes + r.arena_bytes;
  r.host_bytes = host_bytes_at(prog, scale);
  r.offloads_params = prog.plan.offloads_params();
  r.exposed_comm_seconds = std::max(0.0, r.step_seconds - r.compute_seconds - r.offload_seconds);
  return r;
}

std::string chrome_trace(const SimResult& r, const std::string& title) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back(
      {{"ph", "M"}, {"pid", 0}, {"name", "process_name"}, {"args", {{"name", title}}}});
  for (size_t tid = 0; tid < r.streams.size(); ++tid)
    events.push_back({{"ph", "M"},
                      {"pid", 0},
                      {"tid", tid},
                      {"name", "thread_name"},
                      {"args", {{"name", r.streams[tid]}}}});
  for (const TraceEvent& e : r.events)  // microseconds, the format's unit
    events.push_back({{"ph", "X"},
                      {"pid", 0},
                      {"tid", e.stream},
                      {"name", e.name},
                      {"cat", e.category},
                      {"ts", e.start * 1e6},
                      {"dur", e.duration * 1e6}});
  nlohmann::json doc = {{"displayTimeUnit", "ms"}, {"traceEvents", std::move(events)}};
  return doc.dump() + "\n";
}

std::string format_sim_result(const SimResult& r, const ClusterSpec& c) {
  auto pct = [&](double x) { return x > 0 ? 100.0 * x / r.step_seconds : 0.0; };
  // Tokens where the model reads them, else examples (an image classifier's images).
  const bool tokens = r.tokens_per_step > 0;
  const char* unit = tokens ? "tokens" : "examples";
  const double rate = tokens ? r.tokens_per_second : r.examples_per_second;
  const double per_step = tokens ? r.tokens_per_step : r.examples_per_step;
  char buf[1024];
  std::snprintf(
      buf, sizeof buf,
      "step time        %s  (compute %s %.0f%%, exposed comm %s %.0f%%, bubble %s%s)\n"
      "  of which       optimizer %s; comm streams busy %s\n"
      "throughput       %.4g %s/s (%.4g per device), %g %s per step\n"
      "per device       %.1f TFLOP/s model (MFU %.1f%%), %.1f TFLOP/s hardware "
      "(HFU %.1f%%)\n"
      "memory / device  %s peak = %s persistent + %s activations (capacity %s)\n",
      format_seconds(r.step_seconds).c_str(), format_seconds(r.compute_seconds).c_str(),
      pct(r.compute_seconds), format_seconds(r.exposed_comm_seconds).c_str(),
      pct(r.exposed_comm_seconds), format_seconds(r.bubble_seconds).c_str(),
      r.offload_seconds > 0 ? (", offload " + format_seconds(r.offload_seconds)).c_str() : "",
      format_seconds(r.optimizer_seconds).c_str(), format_seconds(r.comm_seconds).c_str(), rate,
      unit, rate / std::max(1, r.devices), per_step, unit, r.model_tflops_per_device, 100 * r.mfu,
      r.hardware_tflops_per_device, 100 * r.hfu, format_bytes(r.peak_memory_bytes).c_str(),
      format_bytes(r.persistent_bytes).c_str(), format_bytes(r.arena_bytes).c_str(),
      format_bytes(c.device.memory_bytes).c_str());
  std::string out = buf;
  if (r.offload_seconds > 0 || r.host_bytes > 0) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "offload          %s on the host: %s exposed (host AdamW %s, host link "
                  "%s busy); %s of host memory per device\n",
                  r.offloads_params ? "optimizer and parameters" : "optimizer",
                  format_seconds(r.offload_seconds).c_str(),
                  format_seconds(r.host_cpu_seconds).c_str(),
                  format_seconds(r.host_link_seconds).c_str(), format_bytes(r.host_bytes).c_str());
    out += line;
  }
  if (!r.stage_peak_bytes.empty()) {
    char line[96];
    std::snprintf(line, sizeof line,
                  "pipeline         bubble %.1f%% of the stages' time; memory by stage",
                  100 * r.bubble_fraction);
    out += line;
    for (size_t s = 0; s < r.stage_peak_bytes.size(); ++s)
      out += (s ? ", " : " ") + format_bytes(r.stage_peak_bytes[s]);
    out += "\n";
  }
  std::vector<std::pair<double, std::string>> ops;
  for (const auto& [name, secs] : r.seconds_by_op) ops.emplace_back(secs, name);
  std::sort(ops.rbegin(), ops.rend());
  out += "busiest ops      ";
  for (size_t i = 0; i < ops.size() && i < 6; ++i)
    out += (i ? ", " : "") + ops[i].second + " " + format_seconds(ops[i].first);
  out += "\n";
  if (c.price_per_device_hour > 0 && r.tokens_per_second > 0) {
    const double per_hour = c.price_per_device_hour * r.devices;
    char line[160];
    std::snprintf(line, sizeof line, "price            $%.0f per hour, $%.3g per million tokens\n",
                  per_hour, per_hour / 3600.0 / r.tokens_per_second * 1e6);
    out += line;
  }
  return out;
}

}  // namespace tessera
