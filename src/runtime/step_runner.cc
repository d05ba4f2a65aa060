#include "runtime/step_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "backend/cpu/cpu_backend.h"
#include "base/check.h"
#include "base/format.h"
#include "parallel/pipeline_program.h"
#include "runtime/link_queue.h"

namespace tessera {

// ---- StepRunner ---------------------------------------------------------------------

namespace {
// The tag of ring_shift's messages on its group's communicator (their order is the issue order,
// the same on every rank).
constexpr int kRingShiftTag = 0;

// The runner executes each list in order on one stream: every dependency must come first, and
// the optimizer list starts with its gradient norm (apply() needs the norm before AdamW), after
// the copies of the gradients to the host where the optimizer is offloaded.
size_t norm_index(const Program& p) {
  size_t k = 0;
  while (k < p.optimizer.size() && p.optimizer[k].kind == Instruction::grad_to_host) ++k;
  return k;
}

Status check_runnable(const Program& p) {
  TS_RETURN_IF_ERROR(check_order(p.micro_step));
  TS_RETURN_IF_ERROR(check_order(p.optimizer));
  const size_t k = norm_index(p);
  if (k == p.optimizer.size() || p.optimizer[k].kind != Instruction::grad_norm)
    return error("the Program's optimizer list does not start with its gradient norm");
  return Status();
}
}  // namespace

namespace {

// A device that cannot hold the Program's memory (what the runner allocates: the NULL-backend
// test holds it to the byte) is an error before any allocation, with the planned parts.
Status check_fits(const Program& p, const Backend& backend) {
  const int64_t free = backend.free_memory();
  const int64_t need = p.persistent_bytes() + p.memory.arena_bytes;
  if (free < 0 || need <= free) return Status();
  return error("this rank needs " + format_bytes(static_cast<double>(need)) + " of " +
                   backend.name() + " memory (parameters " +
                   format_bytes(static_cast<double>(p.param_bytes)) + ", gradients " +
                   format_bytes(static_cast<double>(p.grad_bytes)) + ", optimizer state " +
                   format_bytes(static_cast<double>(p.optim_bytes)) + ", activations " +
                   format_bytes(static_cast<double>(p.memory.arena_bytes)) +
                   ") and the device has " + format_bytes(static_cast<double>(free)) + " free",
               "a smaller --batch or --seq, --recompute full, --precision bf16, --offload "
               "optimizer or (with --zero 3) --offload params (`tessera plan MODEL --batch B "
               "--seq T` prints the bytes per rank of a plan)");
}

}  // namespace

Result<std::unique_ptr<StepRunner>> StepRunner::create(const Graph& global, const Plan& plan,
                                                       Backend& backend, MeshComms& comms,
                                                       AdamWConfig opt) {
  TS_RETURN_IF_ERROR(validate(plan, comms.world().size()));
  if (global.param_grads().empty())
    return error("the step runner needs a training graph (loss and gradients)",
                 "build the model in ModelMode::train; a loss-only graph is evaluated with "
                 "add_evaluation");
  TS_ASSIGN_OR_RETURN(Program prog, lower(global, plan));
  TS_RETURN_IF_ERROR(check_runnable(prog));
  TS_RETURN_IF_ERROR(check_fits(prog, backend));
  return std::unique_ptr<StepRunner>(new StepRunner(global, std::move(prog), backend, comms, opt));
}

Result<std::unique_ptr<StepRunner>> StepRunner::create_chunk(const Graph& model,
                                                             const ChunkProgram& chunk,
                                                             Backend& backend, MeshComms& comms,
                                                             AdamWConfig opt, SharedArena arena) {
  for (const ParamLayout& pl : chunk.program.part.params) {
    if (model.find_param(pl.name) < 0)
      return error("pipeline chunk parameter " + pl.name + " is not in the model");
  }
  TS_RETURN_IF_ERROR(check_runnable(chunk.program));
  return std::unique_ptr<StepRunner>(
      new StepRunner(model, chunk.program, backend, comms, opt, &chunk, std::move(arena)));
}

StepRunner::StepRunner(const Graph& global, Program prog, Backend& backend, MeshComms& comms,
                       AdamWConfig opt, const ChunkProgram* chunk, SharedArena arena)
    : global_(global), prog_(std::move(prog)), comms_(comms), chunk_(chunk) {
  rank_ = comms.world().rank();
  zero_index_ = prog_.plan.mesh.group_index(rank_, prog_.plan.zero_axes);
  if (chunk_) {
    const std::vector<Graph>& phases = chunk_->phases.graphs;
    exec_ = std::make_unique<Executor>(phases[0], backend, nullptr, arena);
    for (size_t ph = 1; ph < phases.size(); ++ph)
      phase_execs_.push_back(std::make_unique<Executor>(phases[ph], backend, exec_.get(), arena));
  } else {
    exec_ = std::make_unique<Executor>(prog_.part.local, backend);
  }
  for (const ParamLayout& pl : prog_.part.params) {
    const std::vector<ValueId>& all = global_.params();
    model_index_.push_back(static_cast<size_t>(
        std::find(all.begin(), all.end(), global_.find_param(pl.name)) - all.begin()));
  }
  norm_index_ = norm_index(prog_);
  if (prog_.plan.offloads_optimizer()) host_ = std::make_unique<CpuBackend>();
  masters_.resize(prog_.part.params.size());
  host_params_.resize(prog_.part.params.size());
  for (size_t i = 0; i < masters_.size(); ++i) {
    const TensorType& t = exec_->graph().type(param_value(i));
    if (t.dtype != DType::f32 || host_)
      masters_[i] = state_backend().allocate(t.shape.numel() * static_cast<int64_t>(sizeof(float)));
    if (prog_.part.params[i].params_on_host && t.dtype != DType::f32)
      host_params_[i] = host_->allocate(t.bytes());
    if (t.dtype == DType::f16) loss_scale_ = 65536.0;
    param_index_[prog_.part.params[i].name] = i;
  }
  if (chunk_ && chunk_->grad_pool_bytes > 0) grad_pool_ = backend.allocate(chunk_->grad_pool_bytes);
  auto pooled = [&](int64_t offset, int64_t count) {
    return GradSum{{}, reinterpret_cast<float*>(grad_pool_.bytes_at(offset)), count};
  };
  std::vector<ParamSlot> slots;
  for (size_t i = 0; i < prog_.part.params.size(); ++i) {
    const ParamLayout& pl = prog_.part.params[i];
    DType grad_dtype = DType::f32;
    // The optimizer reads the reduced gradient where the micro-step leaves it, or (several
    // micro-batches) from its accumulator.
    float* grad = nullptr;
    if (prog_.plan.micro_batches > 1 || chunk_) {
      const int64_t n = prog_.local().type(pl.local_grad).shape.numel();
      const int64_t at = chunk_ && !chunk_->reduced_grad_offset.empty()
                             ? chunk_->reduced_grad_offset[i]
                             : int64_t{-1};
      if (at >= 0) {
        grads_.push_back(pooled(at, n));
      } else {
        Buffer b = backend.allocate(n * static_cast<int64_t>(sizeof(float)));
        float* d = static_cast<float*>(b.data());
        grads_.push_back(GradSum{std::move(b), d, n});
      }
      grad = grads_.back().data;
    } else {  // as stored: bf16/f16 in a mixed-precision graph, widened by the optimizer
      grad = static_cast<float*>(exec_->raw(pl.local_grad));
      grad_dtype = prog_.local().type(pl.local_grad).dtype;
    }
    LocalPiece o = optim_piece(i);
    LocalPiece pp = param_piece(i);
    const int64_t grad_base = pl.grads_sharded ? block_of(i).offset : 0;
    // The gradient's elements are grad_dtype's size (bf16: 2 bytes), not a float's.
    float* grad_at = reinterpret_cast<float*>(reinterpret_cast<char*>(grad) +
                                              (o.offset - grad_base) * dtype_size(grad_dtype));
    if (host_) {  // AdamW reads an f32 copy in host memory, which grad_to_host writes
      device_grads_.push_back({grad_at, grad_dtype, o.count});
      host_grads_.push_back(host_->allocate(o.count * static_cast<int64_t>(sizeof(float))));
      grad_at = static_cast<float*>(host_grads_.back().data());
      grad_dtype = DType::f32;
    }
    slots.push_back(ParamSlot{pl.name, param_storage(i) + (o.offset - pp.offset), grad_at,
                              grad_dtype, o.count, pl.global_shape.rank() >= 2});
    // The update writes a bf16/f16 working copy where it covers the whole local piece (else,
    // ZeRO-1/2, step() converts the master weights after their sync; offloaded, the copy to
    // the device converts them).
    if (masters_[i] && !host_ && o.offset == pp.offset && o.count == pp.count) {
      slots.back().working = exec_->raw(param_value(i));
      slots.back().working_dtype = exec_->graph().type(param_value(i)).dtype;
    }
    if (host_params_[i]) {  // a host-held bf16/f16 block (its optimizer block: ZeRO-3)
      slots.back().working = host_params_[i].data();
      slots.back().working_dtype = exec_->graph().type(param_value(i)).dtype;
    }
    // Elements replicated over a tensor axis are counted once over the norm's group.
    int64_t copies = 1;
    for (const std::string& t : replicated_tensor_axes(i)) copies *= prog_.plan.mesh.axis_size(t);
    slots.back().norm_weight = 1.0 / static_cast<double>(copies);
  }
  grad_started_.assign(grads_.size(), 0);
  if (chunk_) {
    const Phases& ph = chunk_->phases;
    unreduced_.resize(ph.stash.size());
    unreduced_started_.assign(ph.stash.size(), 0);
    for (size_t e = 0; e < ph.stash.size(); ++e)
      if (ph.stash[e].to == chunk_->reduce_phase)  // an f32 sum, whatever the gradient's dtype
        unreduced_[e] = pooled(
            chunk_->unreduced_offset[e],
            ph.graphs[static_cast<size_t>(ph.stash[e].from)].type(ph.stash[e].out).shape.numel());
  }
  opt_ = std::make_unique<AdamW>(std::move(slots), opt, state_backend());
  // The host buffers a device copies to and from every step, page-locked for its copy engines.
  if (host_ && backend.memory() == MemSpace::device) {
    auto pin = [&](Buffer& b) {
      if (!b) return;
      backend.pin_host(b.data(), b.bytes());
      pinned_.push_back(b.data());
    };
    for (Buffer& b : masters_) pin(b);
    for (Buffer& b : host_grads_) pin(b);
    for (Buffer& b : host_params_) pin(b);
  }
  // A micro-step of compute nodes alone, none writing from the host, can be recorded.
  recordable_ = !chunk_ && loss_scale_ == 0 && exec_->backend().memory() == MemSpace::device;
  for (const Instruction& in : prog_.micro_step)
    recordable_ = recordable_ && in.kind == Instruction::compute &&
                  exec_->graph().node(in.node).op != OpKind::axis_index;
  // A list of one update per parameter and nothing else (no ZeRO-1/2 syncs) runs as one pass.
  std::vector<char> seen(opt_->params().size(), 0);
  one_pass_update_ = prog_.optimizer.size() == seen.size() + 1;
  for (size_t k = 1; k < prog_.optimizer.size() && one_pass_update_; ++k) {
    const Instruction& s = prog_.optimizer[k];
    one_pass_update_ = s.kind == Instruction::optimizer && s.param >= 0 &&
                       static_cast<size_t>(s.param) < seen.size() && !seen[s.param]++;
  }
}

StepRunner::~StepRunner() {
  link_.reset();  // its thread stopped before the buffers its copies read are freed
  for (void* p : pinned_) exec_->backend().unpin_host(p);
}

LocalPiece StepRunner::block_of(size_t i) const {
  FlatShard fs{prog_.plan.zero_group(), zero_index_, prog_.part.params[i].local_shape.numel()};
  return {fs.offset(), fs.count()};
}

LocalPiece StepRunner::param_piece(size_t i) const {
  const ParamLayout& pl = prog_.part.params[i];
  return pl.params_sharded ? block_of(i) : LocalPiece{0, pl.local_shape.numel()};
}

LocalPiece StepRunner::optim_piece(size_t i) const {
  const ParamLayout& pl = prog_.part.params[i];
  return pl.optim_sharded ? block_of(i) : LocalPiece{0, pl.local_shape.numel()};
}

ValueId StepRunner::param_value(size_t i) const {
  const ValueId local = prog_.part.params[i].local;
  return chunk_ ? chunk_->phases.value_of[0][static_cast<size_t>(local)] : local;
}

float* StepRunner::param_storage(size_t i) {
  return static_cast<float*>(masters_[i] ? masters_[i].data() : exec_->raw(param_value(i)));
}

float* StepRunner::param_data(size_t i) {
  TS_CHECK(state_backend().memory() == MemSpace::host)
      << "param_data: parameters in the " << state_backend().name()
      << " backend's memory (use param_storage, read_param)";
  return param_storage(i);
}

std::vector<float> StepRunner::read_param(size_t i) {
  std::vector<float> out(static_cast<size_t>(param_piece(i).count));
  state_backend().to_host(out.data(), param_storage(i),
                          static_cast<int64_t>(out.size() * sizeof(float)));
  return out;
}

namespace {

// n elements of dtype dt in the backend's memory, as f32 in host memory, and back.
void read_as_f32(Backend& b, const void* src, DType dt, float* dst, int64_t n) {
  if (b.memory() == MemSpace::host) return convert_elements(src, dt, dst, DType::f32, n);
  if (dt == DType::f32) return b.to_host(dst, src, n * static_cast<int64_t>(sizeof(float)));
  std::vector<uint8_t> stored(static_cast<size_t>(n * dtype_size(dt)));
  b.to_host(stored.data(), src, static_cast<int64_t>(stored.size()));
  convert_elements(stored.data(), dt, dst, DType::f32, n);
}

void write_from_f32(Backend& b, const float* src, void* dst, DType dt, int64_t n) {
  if (b.memory() == MemSpace::host) return convert_elements(src, DType::f32, dst, dt, n);
  if (dt == DType::f32) return b.to_device(dst, src, n * static_cast<int64_t>(sizeof(float)));
  std::vector<uint8_t> stored(static_cast<size_t>(n * dtype_size(dt)));
  convert_elements(src, DType::f32, stored.data(), dt, n);
  b.to_device(dst, stored.data(), static_cast<int64_t>(stored.size()));
}

}  // namespace

Status StepRunner::start(const Node& n, Executor& ex) {
  const GroupAttrs& group = n.attr<GroupAttrs>();
  const Graph& g = ex.graph();
  Backend& b = ex.backend();
  Communicator& c = comms_.group(group.axes, b.memory());
  const std::string what = std::string(op_name(n.op)) + " " + n.scope;
  const DType dt = g.type(n.inputs[0]).dtype;
  const int64_t in_count = g.type(n.inputs[0]).shape.numel();
  const int64_t out_count = g.type(n.outputs[0]).shape.numel();
  // A communicator in the backend's memory takes the values where they are, in their dtype.
  // Otherwise (a device's values, a host communicator) they are staged in host f32 buffers and
  // written into the output (narrowed, copied to the device) when the wait completes.
  const bool direct = c.memory() == b.memory();
  // A host-held parameter's block was fetched into its slot of the output: gathered in place.
  void* src = g.on_host(n.inputs[0]) ? gather_slot(n, ex) : ex.raw(n.inputs[0]);
  void* in = direct ? src : nullptr;
  void* out = direct ? ex.raw(n.outputs[0]) : nullptr;
  const DType wire = direct ? dt : DType::f32;
  Staged staged;
  if (!direct) {
    staged.out.assign(static_cast<size_t>(out_count), 0.0f);
    out = staged.out.data();
    if (n.op == OpKind::all_reduce) {  // reduced in place: widened straight into the output
      in = out;
    } else {
      const int64_t room = n.op == OpKind::reduce_scatter ? out_count * group.size : in_count;
      staged.in.assign(static_cast<size_t>(room), 0.0f);  // the padding comes zeroed
      in = staged.in.data();
    }
    read_as_f32(b, src, dt, static_cast<float*>(in), in_count);
    staged.dst = ex.raw(n.outputs[0]);
    staged.dtype = dt;
  }
  const int64_t esize = dtype_size(wire);
  Request r, second;  // (ring_shift: its send beside its receive)
  std::vector<Request> pieces;
  // A segmented gather or scatter: one collective per piece (ops_comm.cc), the first in r.
  const int64_t k = group.segments;
  auto at = [&](void* p, int64_t elems) { return static_cast<uint8_t*>(p) + elems * esize; };
  switch (n.op) {
    case OpKind::all_reduce:
      if (in != out) b.copy(out, in, in_count * esize);  // reduced in place in the output
      r = c.all_reduce(out, in_count, wire, what);
      break;
    case OpKind::reduce_scatter:
      if (direct && out_count * group.size > in_count)  // the planned padding after the input
        b.fill(static_cast<uint8_t*>(in) + in_count * esize, 0,
               (out_count * group.size - in_count) * esize);
      r = c.reduce_scatter(in, out, out_count / k, wire, what);
      for (int64_t j = 1; j < k; ++j)
        pieces.push_back(c.reduce_scatter(at(in, j * in_count / k), at(out, j * out_count / k),
                                          out_count / k, wire, what));
      break;
    case OpKind::all_gather:
      r = c.all_gather(in, out, in_count / k, wire, what);
      for (int64_t j = 1; j < k; ++j)
        pieces.push_back(c.all_gather(at(in, j * in_count / k), at(out, j * out_count / k),
                                      in_count / k, wire, what));
      break;
    case OpKind::all_to_all:
      r = c.all_to_all(in, out, in_count / group.size, wire, what);
      break;
    case OpKind::ring_shift: {  // to the next rank, from the previous one
      const int n_ranks = c.size(), next = (c.rank() + 1) % n_ranks;
      if (n_ranks == 1) {  // (nothing in flight: the wait finds no request)
        if (direct)
          b.copy(out, in, in_count * esize);
        else
          std::memcpy(out, in, static_cast<size_t>(in_count * esize));
        break;
      }
      second = c.send(in, in_count, wire, next, kRingShiftTag, what);
      r = c.recv(out, in_count, wire, (c.rank() + n_ranks - 1) % n_ranks, kRingShiftTag, what);
      break;
    }
    default:
      return error("not a collective: " + std::string(op_name(n.op)));
  }
  const NodeId id = g.value(n.outputs[0]).producer;
  inflight_[id] = {&c, std::move(r), std::move(second), std::move(pieces)};
  if (!direct) staged_[id] = std::move(staged);
  return Status();
}

Status StepRunner::run_instructions(const std::vector<Instruction>& list, Executor& ex) {
  const Graph& g = ex.graph();
  const bool timed = instruction_seconds_ != nullptr && &list == &prog_.micro_step;
  // Timed: a mark before and after each compute node (device time on a device).
  std::unique_ptr<WorkTimer> timer = timed ? ex.backend().work_timer() : nullptr;
  std::vector<size_t> timed_at;
  if (timed) instruction_seconds_->assign(list.size(), 0.0);
  for (size_t i = 0; i < list.size(); ++i) {
    const Instruction& in = list[i];
    switch (in.kind) {
      case Instruction::compute:
        if (g.node(in.node).op == OpKind::axis_index) {  // this rank's coordinate
          const Node& n = g.node(in.node);
          const GroupAttrs& ga = n.attr<GroupAttrs>();
          const int64_t at = prog_.plan.mesh.group_index(rank_, axes_of_key(ga.axes));
          const int32_t index =
              static_cast<int32_t>(((at - ga.back) % ga.size + ga.size) % ga.size);
          ex.backend().to_device(ex.raw(n.outputs[0]), &index, sizeof(index));
        } else if (timer) {
          timer->mark();
          ex.run_node(g.node(in.node));
          timer->mark();
          timed_at.push_back(i);
        } else if (trace_) {
          const Node& n = g.node(in.node);
          const double start = trace_clock();
          ex.run_node(n);
          trace_->add("compute", std::string(op_name(n.op)) + " " + n.scope, start, trace_clock());
        } else {
          ex.run_node(g.node(in.node));
        }
        if (loss_scale_ > 0) {
          const ValueId out = g.node(in.node).outputs[0];
          if (is_loss_seed(ex, out)) {
            // d (scale loss) / d loss, in the seed's dtype
            const TensorType& t = g.type(out);
            const std::vector<float> scale(static_cast<size_t>(t.shape.numel()),
                                           static_cast<float>(loss_scale_));
            std::vector<uint8_t> stored(static_cast<size_t>(t.bytes()));
            convert_elements(scale.data(), DType::f32, stored.data(), t.dtype, t.shape.numel());
            ex.backend().to_device(ex.raw(out), stored.data(), t.bytes());
          }
        }
        break;
      case Instruction::start:
        TS_RETURN_IF_ERROR(start(g.node(in.node), ex));
        break;
      case Instruction::param_fetch: {
        const double start = trace_ ? trace_clock() : 0;
        fetch_param(g.node(in.node), ex);
        if (trace_)
          trace_->add("compute", "param_fetch " + g.node(in.node).scope, start, trace_clock());
        break;
      }
      case Instruction::wait: {
        auto it = inflight_.find(in.node);
        TS_CHECK(it != inflight_.end()) << "wait without start for node " << in.node;
        const double start = trace_ ? trace_clock() : 0;
        Status s = it->second.request ? it->second.comm->wait(it->second.request) : Status();
        if (it->second.send) {
          Status sent = it->second.comm->wait(it->second.send);
          if (s.ok()) s = sent;
        }
        for (Request& piece : it->second.pieces) {
          Status done = piece ? it->second.comm->wait(piece) : Status();
          if (s.ok()) s = done;
        }
        if (trace_) {
          const Node& n = g.node(in.node);
          trace_->add("compute", "wait " + std::string(op_name(n.op)) + " " + n.scope, start,
                      trace_clock());
        }
        inflight_.erase(it);
        TS_RETURN_IF_ERROR(s);
        if (auto st = staged_.find(in.node); st != staged_.end()) {  // the f32 result, home
          write_from_f32(ex.backend(), st->second.out.data(), st->second.dst, st->second.dtype,
                         static_cast<int64_t>(st->second.out.size()));
          staged_.erase(st);
        }
        break;
      }
      default:
        return error("instruction kind not valid in this list");
    }
  }
  if (timer) {
    const std::vector<double> seconds = timer->intervals();
    for (size_t j = 0; j < timed_at.size(); ++j)
      (*instruction_seconds_)[timed_at[j]] = seconds[2 * j];
  }
  return Status();
}

Status StepRunner::run_micro_step() {
  if (!recordable_ || !record_steps_ || instruction_seconds_ != nullptr || trace_ != nullptr)
    return run_instructions(prog_.micro_step, *exec_);
  if (!recorded_step_ && std::exchange(ran_eagerly_, true)) {  // libraries initialized
    Status s;
    recorded_step_ =
        exec_->backend().record([&] { s = run_instructions(prog_.micro_step, *exec_); });
    TS_RETURN_IF_ERROR(s);
    if (!recorded_step_) recordable_ = false;  // the backend does not record
  }
  if (!recorded_step_) return run_instructions(prog_.micro_step, *exec_);
  recorded_step_->replay();
  return Status();
}

Result<float> StepRunner::forward_backward(const Feed& feed) {
  TS_CHECK_LT(accumulated_, prog_.plan.micro_batches)
      << "forward_backward called more often than the plan's micro_batches before apply()";
  TS_RETURN_IF_ERROR(feed.bind(*exec_));
  TS_RETURN_IF_ERROR(run_micro_step());
  for (size_t i = 0; i < grads_.size(); ++i)
    exec_->backend().accumulate(grad_data(i), exec_->raw(prog_.part.params[i].local_grad),
                                prog_.local().type(prog_.part.params[i].local_grad).dtype,
                                grad_count(i), accumulated_ == 0);
  ++accumulated_;
  metric_sums_.resize(prog_.part.metrics.size(), 0.0);
  for (size_t i = 0; i < prog_.part.metrics.size(); ++i)
    metric_sums_[i] += exec_->read_scalar(prog_.part.metrics[i].second);
  return exec_->read_scalar(prog_.part.loss);
}

std::vector<std::pair<std::string, double>> StepRunner::take_metrics() {
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 0; i < metric_sums_.size(); ++i)
    out.emplace_back(prog_.part.metrics[i].first, std::exchange(metric_sums_[i], 0.0));
  return out;
}

Status StepRunner::run_phase(int ph) {
  TS_CHECK(chunk_ != nullptr) << "run_phase on a runner that is not a pipeline chunk's";
  return run_instructions(chunk_->phase_lists[static_cast<size_t>(ph)], phase_executor(ph));
}

void StepRunner::add_phase_metrics(int ph) {
  const std::vector<ValueId>& in_phase = chunk_->phases.value_of[static_cast<size_t>(ph)];
  Executor& ex = phase_executor(ph);
  metric_sums_.resize(prog_.part.metrics.size(), 0.0);
  for (size_t i = 0; i < prog_.part.metrics.size(); ++i) {
    const ValueId v = in_phase[static_cast<size_t>(prog_.part.metrics[i].second)];
    if (v >= 0 && ex.graph().producer(v).op != OpKind::input) metric_sums_[i] += ex.read_scalar(v);
  }
}

void StepRunner::accumulate_phase_grads(int ph) {
  const std::vector<ValueId>& in_phase = chunk_->phases.value_of[static_cast<size_t>(ph)];
  Executor& ex = phase_executor(ph);
  for (size_t i = 0; i < grads_.size(); ++i) {
    const ValueId g = prog_.part.params[i].local_grad;
    const ValueId v = in_phase[static_cast<size_t>(g)];
    // The phase computing it (a later phase reading it would see it as a stash input).
    if (v < 0 || ex.graph().producer(v).op == OpKind::input) continue;
    // Phases of different micro-batches interleave (zb-h1 runs B of the next before W of
    // this one): the first gradient of the step is the one that overwrites.
    ex.backend().accumulate(grad_data(i), ex.raw(v), ex.graph().type(v).dtype, grad_count(i),
                            !grad_started_[i]);
    grad_started_[i] = 1;
  }
  const std::vector<Phases::Stash>& stash = chunk_->phases.stash;
  for (size_t e = 0; e < stash.size(); ++e) {
    if (stash[e].from != ph || stash[e].to != chunk_->reduce_phase) continue;
    ex.backend().accumulate(unreduced_[e].data, ex.raw(stash[e].out),
                            ex.graph().type(stash[e].out).dtype, unreduced_[e].count,
                            !unreduced_started_[e]);
    unreduced_started_[e] = 1;
  }
}

Status StepRunner::reduce_grads() {
  TS_CHECK(chunk_ != nullptr) << "reduce_grads on a runner that is not a pipeline chunk's";
  const int rp = chunk_->reduce_phase;
  if (rp < 0) return Status();
  Executor& ex = phase_executor(rp);
  const std::vector<Phases::Stash>& stash = chunk_->phases.stash;
  for (size_t e = 0; e < stash.size(); ++e) {
    if (stash[e].to != rp) continue;
    TS_CHECK(unreduced_started_[e]) << "reduce phase input " << e << " has no gradient this step";
    // The f32 sum in the phase's dtype (one rounding for a bf16 gradient). Every sum is read
    // before the phase runs: the reduced gradients written after it share their pool.
    ex.backend().convert(unreduced_[e].data, DType::f32, ex.raw(stash[e].in),
                         ex.graph().type(stash[e].in).dtype, unreduced_[e].count);
    unreduced_started_[e] = 0;
  }
  TS_RETURN_IF_ERROR(run_phase(rp));
  const std::vector<ValueId>& in_phase = chunk_->phases.value_of[static_cast<size_t>(rp)];
  for (size_t i = 0; i < grads_.size(); ++i) {
    const ValueId v = in_phase[static_cast<size_t>(prog_.part.params[i].local_grad)];
    if (v < 0 || ex.graph().producer(v).op == OpKind::input) continue;
    ex.backend().convert(ex.raw(v), ex.graph().type(v).dtype, grad_data(i), DType::f32,
                         grad_count(i));
    grad_started_[i] = 1;
  }
  return Status();
}

Status StepRunner::add_evaluation(const Graph& eval_global) {
  Plan plan = prog_.plan;
  plan.recompute = RecomputePolicy::none;  // no backward pass to recompute for
  plan.recompute_layers = -1;
  plan.micro_batches = 1;
  TS_ASSIGN_OR_RETURN(Program p, lower(eval_global, plan));
  for (const ParamLayout& pl : p.part.params) {
    const ValueId q = prog_.local().find_param(p.local().name_of(pl.local));
    if (q < 0 || !(prog_.local().type(q).shape == p.local().type(pl.local).shape))
      return error("evaluation graph: parameter " + pl.name +
                   " is not laid out as in the training graph");
  }
  eval_prog_ = std::make_unique<Program>(std::move(p));
  eval_exec_ = std::make_unique<Executor>(eval_prog_->part.local, exec_->backend(), *exec_);
  return Status();
}

Result<float> StepRunner::evaluate(const Feed& feed) {
  TS_CHECK(eval_exec_ != nullptr) << "evaluate() before add_evaluation()";
  TS_RETURN_IF_ERROR(feed.bind(*eval_exec_));
  TS_RETURN_IF_ERROR(run_instructions(eval_prog_->micro_step, *eval_exec_));
  return eval_exec_->read_scalar(eval_prog_->part.loss);
}

Status StepRunner::sync_param(size_t i) {
  const ParamLayout& pl = prog_.part.params[i];
  const int group = prog_.plan.zero_group();
  const int64_t numel = pl.local_shape.numel();
  const int64_t block = FlatShard{group, 0, numel}.block();
  const LocalPiece mine = block_of(i);
  Backend& b = state_backend();
  float* p = param_storage(i);  // the state's memory; the transport's buffers are the host's
  std::vector<float> own(static_cast<size_t>(block), 0.0f);
  b.to_host(own.data(), p + mine.offset, mine.count * static_cast<int64_t>(sizeof(float)));
  // Host staging, sized at the first sync by the largest parameter (kept between steps).
  if (scratch_.size() < static_cast<size_t>(block * group))
    scratch_.resize(static_cast<size_t>(block * group));
  Communicator& c = comms_.group(axes_key(prog_.plan.zero_axes));
  Request r = c.all_gather(own.data(), scratch_.data(), block, "parameter sync " + pl.name);
  TS_RETURN_IF_ERROR(c.wait(r));
  b.to_device(p, scratch_.data(), numel * static_cast<int64_t>(sizeof(float)));
  return Status();
}

Result<double> StepRunner::grad_sq_sum() {
  const int micro_steps = prog_.plan.micro_batches;
  TS_CHECK_EQ(accumulated_, micro_steps) << "apply() before the plan's micro-batches ran";
  accumulated_ = 0;
  std::fill(grad_started_.begin(), grad_started_.end(), 0);
  // The optimizer list: (offloaded: each gradient block to the host,) grad_norm (all-reduced
  // over Plan::grad_norm_axes()), one AdamW per parameter, the ZeRO-1/2 parameter syncs
  // (offloaded: each updated piece back to the device).
  for (size_t k = 0; k < norm_index_; ++k)
    grad_to_host(static_cast<size_t>(prog_.optimizer[k].param));
  if (micro_steps > 1) opt_->scale_grads(1.0f / static_cast<float>(micro_steps));
  double sq = opt_->grad_sq_sum();
  if (!prog_.plan.grad_norm_axes().empty()) {
    TS_ASSIGN_OR_RETURN(sq, comms_.group(axes_key(prog_.plan.grad_norm_axes()))
                                .all_reduce_scalar(sq, /*max=*/false, "gradient norm"));
  }
  return sq;
}

Status StepRunner::step(double lr, double clip_coefficient) {
  // The Program's optimizer list after its grad_norm (grad_sq_sum ran it): AdamW on each
  // parameter's block or piece, clipping folded into the update (one pass over the gradients
  // fewer), and each ZeRO-1/2 parameter's sync after its update, in the list's order.
  opt_->begin_step(lr);
  if (one_pass_update_) {
    opt_->update_all(static_cast<float>(clip_coefficient));
    refresh_working_params(/*all=*/false);
    return Status();
  }
  // Offloaded: each piece's copy back to the device runs on the link thread while AdamW goes on
  // with the next parameters (it reads only its own piece's master, updated before it is
  // pushed); all are done before step() returns.
  if (host_ && !link_) link_ = std::make_unique<LinkQueue>();
  Status s_status;
  for (size_t k = norm_index_ + 1; k < prog_.optimizer.size() && s_status.ok(); ++k) {
    const Instruction& s = prog_.optimizer[k];
    if (s.kind == Instruction::optimizer) {
      opt_->update(static_cast<size_t>(s.param), static_cast<float>(clip_coefficient));
    } else if (s.kind == Instruction::param_sync) {
      s_status = sync_param(static_cast<size_t>(s.param));
    } else if (s.kind == Instruction::param_to_device && host_) {
      const size_t i = static_cast<size_t>(s.param);
      link_->push([this, i] { param_to_device(i, link_staging_); });
    } else {
      s_status = error("optimizer list: a " + std::string(instruction_name(s.kind)) +
                       " instruction after its first");
    }
  }
  if (link_) link_->drain();
  TS_RETURN_IF_ERROR(s_status);
  refresh_working_params(/*all=*/false);  // from the synced master weights
  return Status();
}

double StepRunner::take_loss_scale(double sq) {
  const double carried = loss_scale_;
  skipped_ = !std::isfinite(sq);
  if (skipped_) {  // overflow: no update (every rank saw the same all-reduced sum)
    loss_scale_ /= 2;
    good_steps_ = 0;
    return 0.0;
  }
  if (++good_steps_ == kLossScaleGrowth) {
    loss_scale_ *= 2;
    good_steps_ = 0;
  }
  return carried;
}

bool StepRunner::is_loss_seed(const Executor& ex, ValueId v) {
  const std::vector<ValueId>& seeds = prog_.part.loss_seeds;
  if (!chunk_) return &ex == exec_.get() && std::find(seeds.begin(), seeds.end(), v) != seeds.end();
  // A chunk's seeds, in whichever phase computes them: ex's copies of them.
  for (size_t ph = 0; ph < chunk_->phases.value_of.size(); ++ph) {
    if (&ex != &phase_executor(static_cast<int>(ph))) continue;
    for (ValueId seed : seeds)
      if (chunk_->phases.value_of[ph][static_cast<size_t>(seed)] == v) return true;
    return false;
  }
  return false;
}

Result<double> StepRunner::apply(double lr, double clip) {
  const double start = trace_ ? trace_clock() : 0;
  Result<double> norm = apply_body(lr, clip);
  if (trace_) trace_->add("compute", "optimizer", start, trace_clock());
  return norm;
}

Result<double> StepRunner::apply_body(double lr, double clip) {
  TS_ASSIGN_OR_RETURN(const double sq, grad_sq_sum());
  // fp16: the gradients carry the loss scale (0: they overflowed, no update).
  const double scale = loss_scale_ > 0 ? take_loss_scale(sq) : 1.0;
  if (scale == 0) return 0.0;
  const double norm = std::sqrt(sq) / scale;
  const double coef = clip > 0 ? AdamW::clip_coefficient(norm, clip) : 1.0;
  TS_RETURN_IF_ERROR(step(lr, coef / scale));
  return norm;
}

int64_t StepRunner::state_bytes_allocated() {
  int64_t bytes = exec_->plan().param_bytes;
  for (const GradSum& g : grads_) bytes += g.own.bytes();
  bytes += grad_pool_.bytes();
  if (host_) return bytes;
  for (const Buffer& m : masters_) bytes += m.bytes();
  return bytes + opt_->state_bytes();
}

int64_t StepRunner::host_state_bytes_allocated() {
  if (!host_) return 0;
  int64_t bytes = opt_->state_bytes();
  for (const Buffer& m : masters_) bytes += m.bytes();
  for (const Buffer& g : host_grads_) bytes += g.bytes();
  for (const Buffer& p : host_params_) bytes += p.bytes();
  return bytes;
}

}  // namespace tessera
