#include "runtime/pipeline_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "base/check.h"
#include "base/format.h"

namespace tessera {

namespace {

// Tags on the pipeline axis: the activations into model chunk k travel on 2k, the gradients
// into chunk k (from k + 1) on 2k + 1; tied gradients on the last two tags.
constexpr int kTiedUpTag = Communicator::kMaxP2PTag - 1;
constexpr int kTiedDownTag = Communicator::kMaxP2PTag;
// Elements of a tied gradient sent up to its owner at a time (16 MiB of f32).
constexpr int64_t kTiedPiece = int64_t{4} << 20;

// The phase-graph copies of local-graph values.
std::vector<ValueId> in_phase(const ChunkProgram& c, int ph, const std::vector<ValueId>& vs) {
  std::vector<ValueId> out;
  for (ValueId v : vs) out.push_back(c.phases.value_of[static_cast<size_t>(ph)][size_t(v)]);
  return out;
}

int64_t bytes_of(const Graph& g, const std::vector<ValueId>& vs) {
  int64_t b = 0;
  for (ValueId v : vs) b += g.type(v).bytes();
  return b;
}

// Offset of each stash entry in its slot (the forward's or, from phase 1, the weight slot's):
// a value read by two later phases is kept once. The reduce phase's entries are accumulated
// by the chunk's StepRunner instead (-1).
std::vector<int64_t> slot_offsets(const Phases& ph, int reduce_phase) {
  std::vector<int64_t> off(ph.stash.size(), 0);
  int64_t end[2] = {0, 0};
  for (size_t e = 0; e < ph.stash.size(); ++e) {
    const Phases::Stash& st = ph.stash[e];
    if (st.to == reduce_phase) {
      off[e] = -1;
      continue;
    }
    size_t first = e;
    for (size_t f = 0; f < e; ++f)
      if (ph.stash[f].from == st.from && ph.stash[f].out == st.out && off[f] >= 0) first = f;
    if (first != e) {
      off[e] = off[first];
      continue;
    }
    int64_t& at = end[st.from == kForwardPhase ? 0 : 1];
    off[e] = at;
    at += ph.graphs[static_cast<size_t>(st.from)].type(st.out).bytes();
  }
  return off;
}

// The float-sized words a message of `bytes` travels in (bf16 values: two to a word, the last
// word padded).
int64_t floats(int64_t bytes) { return (bytes + 3) / 4; }

}  // namespace

struct PipelineRunner::Message {
  std::vector<float> data;
  Request req;
};

PipelineRunner::PipelineRunner(const Graph& model, const PipelineProgram& program, MeshComms& comms)
    : model_(model), pp_(program), comms_(comms) {}

PipelineRunner::~PipelineRunner() = default;

int64_t PipelineRunner::planned_bytes() const {
  const size_t u = static_cast<size_t>(stage());
  return pp_.stage_arena_bytes[u] + pp_.stage_p2p_bytes[u] + pp_.stage_persistent_bytes[u];
}

Result<std::unique_ptr<PipelineRunner>> PipelineRunner::create(
    const Graph& model, std::unique_ptr<PipelineProgram> program, Backend& backend,
    MeshComms& comms, AdamWConfig opt) {
  TS_ASSIGN_OR_RETURN(std::unique_ptr<PipelineRunner> r,
                      create(model, *program, backend, comms, opt));
  r->owned_ = std::move(program);  // pp_ refers to it: the pointee stays put
  return r;
}

std::vector<StepDriver::HeldParam> PipelineRunner::held_params() const {
  std::vector<HeldParam> out;
  for (int v = 0; v < local_chunks(); ++v) {
    StepRunner& r = *chunks_[static_cast<size_t>(v)];
    for (size_t i = 0; i < r.program().part.params.size(); ++i) {
      const bool copy = !writes_tied_copy(v, i);
      out.push_back({&r, i, !copy && r.writes_param(i), !copy && r.writes_optim(i)});
    }
  }
  return out;
}

std::string PipelineRunner::describe_memory() const {
  auto b = [](int64_t n) { return format_bytes(static_cast<double>(n)); };
  const Plan& p = pp_.plan;
  std::string s = "plan " + p.describe() + " on " + std::to_string(p.mesh.size()) + " ranks\n";
  for (int st = 0; st < pp_.schedule.stages; ++st) {
    const size_t u = static_cast<size_t>(st);
    std::string blocks;
    for (int k = st; k < pp_.schedule.chunks(); k += pp_.schedule.stages) {
      const ChunkProgram& c = pp_.chunks[static_cast<size_t>(k)];
      blocks += (blocks.empty() ? "" : ", ") + std::to_string(c.first_block) + "-" +
                std::to_string(c.first_block + c.blocks - 1);
    }
    s += "  stage " + std::to_string(st) + " (blocks " + blocks + "): per rank arena " +
         b(pp_.stage_arena_bytes[u]) + " (stash " + b(pp_.stage_stash_bytes[u]) + " for " +
         std::to_string(pp_.in_flight[u]) + " micro-batches in flight), send buffers " +
         b(pp_.stage_p2p_bytes[u]) + ", parameters, gradients and optimizer " +
         b(pp_.stage_persistent_bytes[u]) + "\n";
  }
  return s;
}

Result<std::unique_ptr<PipelineRunner>> PipelineRunner::create(const Graph& model,
                                                               const PipelineProgram& program,
                                                               Backend& backend, MeshComms& comms,
                                                               AdamWConfig opt) {
  const Plan& plan = program.plan;
  TS_RETURN_IF_ERROR(validate(plan, comms.world().size()));
  const int stages = program.schedule.stages;
  if (2 * program.schedule.chunks() >= kTiedUpTag)
    return error("pipeline: " + std::to_string(program.schedule.chunks()) +
                     " model chunks; the runtime takes at most " +
                     std::to_string(kTiedUpTag / 2 - 1),
                 "use fewer stages or virtual stages");
  std::unique_ptr<PipelineRunner> r(new PipelineRunner(model, program, comms));
  r->pipe_ = &comms.group(plan.pipeline_axis);
  r->stage_ = r->pipe_->rank();
  TS_CHECK_EQ(r->stage_, plan.mesh.group_index(comms.world().rank(), {plan.pipeline_axis}));
  const size_t st = static_cast<size_t>(r->stage_);

  int64_t arena = 0, stash = 0, wstash = 0;
  for (int v = 0; v < program.schedule.virtual_stages; ++v) {
    const ChunkProgram& c = program.chunks[static_cast<size_t>(v * stages + r->stage_)];
    for (const MemoryPlan& m : c.phase_memory) arena = std::max(arena, m.arena_bytes);
    stash = std::max(stash, c.stash_bytes);
    wstash = std::max(wstash, c.weight_stash_bytes);
    for (const Graph& g : c.phases.graphs)
      for (ValueId in : g.inputs()) {
        const std::string& name = g.name_of(in);
        if (model.find_input(name) < 0 && !is_pipeline_input(name))
          return error("pipeline: chunk input '" + name + "' has no source",
                       "the pipeline runtime feeds the model's inputs and the pipeline's "
                       "activations and gradients");
      }
  }
  r->arena_ = SharedArena::make(backend, arena);
  for (int v = 0; v < program.schedule.virtual_stages; ++v) {
    const ChunkProgram& c = program.chunks[static_cast<size_t>(v * stages + r->stage_)];
    TS_ASSIGN_OR_RETURN(std::unique_ptr<StepRunner> chunk,
                        StepRunner::create_chunk(model, c, backend, comms, opt, r->arena_));
    r->chunks_.push_back(std::move(chunk));
    r->offsets_.push_back(slot_offsets(c.phases, c.reduce_phase));
  }
  for (int i = 0; i < program.in_flight[st]; ++i) {
    r->slots_.push_back(backend.allocate(stash));
    r->free_slots_.push_back(i);
  }
  for (int i = 0; i < program.weight_in_flight[st]; ++i) {
    r->wslots_.push_back(backend.allocate(wstash));
    r->free_wslots_.push_back(i);
  }
  const PipelineProgram::SendPool pools[2] = {program.activation_sends[st],
                                              program.gradient_sends[st]};
  for (int p = 0; p < 2; ++p)
    for (int i = 0; i < pools[p].slots; ++i) {
      r->send_pools_[p].buffers.emplace_back(static_cast<size_t>(floats(pools[p].slot_bytes)));
      r->send_pools_[p].free.push_back(i);
    }

  // Parameters held by several model chunks: summed between their stages before the step.
  for (int v = 0; v < r->local_chunks(); ++v) {
    const Program& p = program.chunks[static_cast<size_t>(r->model_chunk(v))].program;
    for (size_t i = 0; i < p.part.params.size(); ++i) {
      Tied t{v, i, {}};
      for (size_t k = 0; k < program.chunks.size(); ++k)
        if (program.chunks[k].program.local().find_param(p.part.params[i].name) >= 0)
          t.holders.push_back(static_cast<int>(k));
      if (t.holders.size() < 2) continue;
      for (size_t h = 1; h < t.holders.size(); ++h)
        if (t.holders[h] % stages == t.holders[0] % stages)
          return error("pipeline: parameter " + p.part.params[i].name +
                           " is read by two model chunks of one stage",
                       "cut the model into other stages");
      if (t.holders[0] != r->model_chunk(v)) r->chunks_[size_t(v)]->exclude_from_norm(i);
      r->tied_.push_back(std::move(t));
    }
  }
  std::sort(r->tied_.begin(), r->tied_.end(), [&](const Tied& a, const Tied& b) {
    return r->chunk(a.v).program().part.params[a.param].name <
           r->chunk(b.v).program().part.params[b.param].name;
  });
  return r;
}

void PipelineRunner::init_params(uint64_t seed) {
  for (auto& c : chunks_) c->init_params(seed);
}

int PipelineRunner::take_slot(std::vector<int>& free) {
  TS_CHECK(!free.empty()) << "pipeline stage " << stage_ << ": more micro-batches in flight "
                          << "than the schedule's count";
  const int s = free.back();
  free.pop_back();
  return s;
}

void PipelineRunner::post_recv(const PipeAction& a) {
  const bool fwd = a.op == PipeOp::forward;
  if (!fwd && a.op != PipeOp::backward && a.op != PipeOp::backward_input) return;
  const int k = model_chunk(a.chunk), stages = pp_.schedule.stages;
  const int last = pp_.schedule.chunks() - 1;
  if ((fwd && k == 0) || (!fwd && k == last)) return;
  const auto key = std::make_tuple(fwd, a.chunk, a.micro_batch);
  if (recvs_.count(key)) return;
  const ChunkProgram& c = pp_.chunks[static_cast<size_t>(k)];
  const int ph = fwd ? kForwardPhase : kBackwardPhase;
  const int64_t bytes =
      bytes_of(c.phases.graphs[size_t(ph)], in_phase(c, ph, fwd ? c.recv : c.send_grads));
  auto m = std::make_unique<Message>();
  m->data.resize(static_cast<size_t>(floats(bytes)));
  const int peer = (fwd ? k - 1 : k + 1) % stages;
  const std::string what = std::string(fwd ? "activations into chunk " : "gradients into chunk ") +
                           std::to_string(k) + ", micro-batch " + std::to_string(a.micro_batch);
  m->req = pipe_->recv(m->data.data(), floats(bytes), peer, fwd ? 2 * k : 2 * k + 1, what);
  recvs_[key] = std::move(m);
}

Status PipelineRunner::take_recv(const PipeAction& a, Executor& ex,
                                 const std::vector<ValueId>& into) {
  post_recv(a);
  const bool fwd = a.op == PipeOp::forward;
  auto it = recvs_.find(std::make_tuple(fwd, a.chunk, a.micro_batch));
  TS_CHECK(it != recvs_.end());
  std::unique_ptr<Message> m = std::move(it->second);
  recvs_.erase(it);
  TS_RETURN_IF_ERROR(pipe_->wait(m->req));
  const uint8_t* src = reinterpret_cast<const uint8_t*>(m->data.data());
  for (ValueId v : into) {
    const int64_t b = ex.graph().type(v).bytes();
    ex.backend().to_device(ex.raw(v), src, b);
    src += b;
  }
  return Status();
}

Status PipelineRunner::send(const PipeAction& a, Executor& ex, const std::vector<ValueId>& from,
                            int ph) {
  const bool fwd = ph == kForwardPhase;
  const int k = model_chunk(a.chunk), stages = pp_.schedule.stages;
  const int to = fwd ? k + 1 : k - 1;
  TS_RETURN_IF_ERROR(reap_sends(false));
  SendPool& pool = send_pools_[fwd ? 0 : 1];
  // The plan's slot count bounds the sends in flight (PipelineProgram::SendPool); a send whose
  // completion the transport has not reported yet may still hold one: wait for the oldest.
  while (pool.free.empty()) {
    auto oldest = std::find_if(sends_.begin(), sends_.end(),
                               [&](const Send& x) { return x.pool == (fwd ? 0 : 1); });
    TS_CHECK(oldest != sends_.end()) << "pipeline stage " << stage_ << ": no send buffer";
    TS_RETURN_IF_ERROR(retire(oldest).status());
  }
  const int buffer = pool.free.back();
  pool.free.pop_back();
  std::vector<float>& data = pool.buffers[static_cast<size_t>(buffer)];
  const int64_t bytes = bytes_of(ex.graph(), from);
  TS_CHECK_LE(bytes, static_cast<int64_t>(data.size() * 4))
      << "pipeline stage " << stage_ << ": a message larger than its send buffer";
  uint8_t* dst = reinterpret_cast<uint8_t*>(data.data());
  for (ValueId v : from) {
    const int64_t b = ex.graph().type(v).bytes();
    ex.backend().to_host(dst, ex.raw(v), b);
    dst += b;
  }
  const std::string what = std::string(fwd ? "activations into chunk " : "gradients into chunk ") +
                           std::to_string(to) + ", micro-batch " + std::to_string(a.micro_batch);
  Request req =
      pipe_->send(data.data(), floats(bytes), to % stages, fwd ? 2 * to : 2 * to + 1, what);
  sends_.push_back({fwd ? 0 : 1, buffer, bytes, std::move(req)});
  p2p_bytes_ += bytes;
  p2p_high_water_ = std::max(p2p_high_water_, p2p_bytes_);
  return Status();
}

Status PipelineRunner::reap_sends(bool all) {
  for (auto it = sends_.begin(); it != sends_.end();) {
    if (!all && !pipe_->test(it->req)) {
      ++it;
      continue;
    }
    TS_ASSIGN_OR_RETURN(it, retire(it));
  }
  return Status();
}

Result<std::vector<PipelineRunner::Send>::iterator> PipelineRunner::retire(
    std::vector<Send>::iterator it) {
  TS_RETURN_IF_ERROR(pipe_->wait(it->req));
  p2p_bytes_ -= it->bytes;
  send_pools_[it->pool].free.push_back(it->buffer);
  return sends_.erase(it);
}

int64_t PipelineRunner::planned_p2p_bytes() const {
  return pp_.stage_p2p_bytes[static_cast<size_t>(stage_)];
}

Status PipelineRunner::feed_forward(const PipeAction& a, Executor& ex) {
  const ChunkProgram& c = pp_.chunks[static_cast<size_t>(model_chunk(a.chunk))];
  if (!c.recv.empty()) TS_RETURN_IF_ERROR(take_recv(a, ex, in_phase(c, 0, c.recv)));
  return feed_->bind(ex, a.micro_batch);
}

void PipelineRunner::load_stash(int v, int ph, Executor& ex, int slot, int wslot) {
  const Phases& phases = pp_.chunks[static_cast<size_t>(model_chunk(v))].phases;
  const std::vector<int64_t>& off = offsets_[static_cast<size_t>(v)];
  for (size_t e = 0; e < phases.stash.size(); ++e) {
    const Phases::Stash& st = phases.stash[e];
    if (st.to != ph) continue;
    const Buffer& src = st.from == kForwardPhase ? slots_[size_t(slot)] : wslots_[size_t(wslot)];
    ex.backend().copy(ex.raw(st.in), src.bytes_at(off[e]), ex.graph().type(st.in).bytes());
  }
}

Status PipelineRunner::run_action(const PipeAction& a) {
  const int v = a.chunk, j = a.micro_batch, k = model_chunk(v);
  const ChunkProgram& c = pp_.chunks[static_cast<size_t>(k)];
  StepRunner& r = chunk(v);
  const auto key = std::make_pair(v, j);
  // Saves phase `from`'s stash entries (its distinct outputs) into `slot`.
  auto save = [&](int from, Executor& ex, const Buffer& slot) {
    const std::vector<int64_t>& off = offsets_[static_cast<size_t>(v)];
    for (size_t e = 0; e < c.phases.stash.size(); ++e) {
      const Phases::Stash& st = c.phases.stash[e];
      if (st.from != from || off[e] < 0) continue;
      ex.backend().copy(slot.bytes_at(off[e]), ex.raw(st.out), ex.graph().type(st.out).bytes());
    }
  };
  switch (a.op) {
    case PipeOp::forward: {
      Executor& ex = r.phase_executor(kForwardPhase);
      const Graph& g = ex.graph();
      TS_RETURN_IF_ERROR(feed_forward(a, ex));
      TS_RETURN_IF_ERROR(r.run_phase(kForwardPhase));
      r.add_phase_metrics(kForwardPhase);
      const int slot = take_slot(free_slots_);
      slot_of_[key] = slot;
      save(kForwardPhase, ex, slots_[size_t(slot)]);
      if (g.loss() >= 0) loss_sum_ += ex.read_scalar(g.loss());
      if (!c.send.empty()) TS_RETURN_IF_ERROR(send(a, ex, in_phase(c, 0, c.send), kForwardPhase));
      return Status();
    }
    case PipeOp::backward:
    case PipeOp::backward_input: {
      Executor& ex = r.phase_executor(kBackwardPhase);
      load_stash(v, kBackwardPhase, ex, slot_of_.at(key), -1);
      if (!c.send_grads.empty()) TS_RETURN_IF_ERROR(take_recv(a, ex, in_phase(c, 1, c.send_grads)));
      TS_RETURN_IF_ERROR(r.run_phase(kBackwardPhase));
      if (!c.recv_grads.empty())
        TS_RETURN_IF_ERROR(send(a, ex, in_phase(c, 1, c.recv_grads), kBackwardPhase));
      r.accumulate_phase_grads(kBackwardPhase);
      r.add_phase_metrics(kBackwardPhase);
      if (a.op == PipeOp::backward_input) {
        const int w = take_slot(free_wslots_);
        wslot_of_[key] = w;
        save(kBackwardPhase, ex, wslots_[size_t(w)]);
        return Status();
      }
      break;
    }
    case PipeOp::backward_weight: {
      Executor& ex = r.phase_executor(kWeightPhase);
      const int w = wslot_of_.at(key);
      load_stash(v, kWeightPhase, ex, slot_of_.at(key), w);
      TS_RETURN_IF_ERROR(r.run_phase(kWeightPhase));
      r.accumulate_phase_grads(kWeightPhase);
      free_wslots_.push_back(w);
      wslot_of_.erase(key);
      break;
    }
  }
  // The micro-batch is done on this chunk.
  free_slots_.push_back(slot_of_.at(key));
  slot_of_.erase(key);
  r.finish_micro_batch();
  return Status();
}

Result<float> PipelineRunner::forward_backward(const Feed& feed) {
  feed_ = &feed;
  loss_sum_ = 0;
  const std::vector<PipeAction>& actions = pp_.schedule.actions[static_cast<size_t>(stage_)];
  for (size_t t = 0; t < actions.size(); ++t) {
    post_recv(actions[t]);
    if (t + 1 < actions.size()) post_recv(actions[t + 1]);  // overlaps this action
    TS_RETURN_IF_ERROR(run_action(actions[t]));
  }
  TS_RETURN_IF_ERROR(reap_sends(true));
  TS_CHECK(slot_of_.empty() && recvs_.empty())
      << "pipeline stage " << stage_ << ": micro-batches left in flight";
  // Once per step: each chunk's gradients, summed over the micro-batches, reduced.
  for (auto& c : chunks_) TS_RETURN_IF_ERROR(c->reduce_grads());
  TS_ASSIGN_OR_RETURN(const double loss,
                      pipe_->all_reduce_scalar(loss_sum_, /*max=*/false, "pipeline loss"));
  return static_cast<float>(loss / pp_.schedule.micro_batches);
}

std::vector<std::pair<std::string, double>> PipelineRunner::take_metrics() {
  std::map<std::string, double> here;  // this stage's chunks'
  for (auto& c : chunks_)
    for (const auto& [name, x] : c->take_metrics()) here[name] += x;
  // Each metric is finished on one stage (the last chunk's): summed over the pipeline axis, the
  // same on every rank. A failed sum is NaN (the step's own collectives report the failure).
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, v] : model_.metrics()) {
    Result<double> sum = pipe_->all_reduce_scalar(here[name], /*max=*/false, "metric " + name);
    out.emplace_back(name, sum.ok() ? sum.value() : std::nan(""));
  }
  return out;
}

Status PipelineRunner::sum_tied_grads() {
  const int stages = pp_.schedule.stages;
  for (const Tied& t : tied_) {
    StepRunner& r = chunk(t.v);
    const int64_t count = static_cast<int64_t>(
        r.program().local().type(r.program().part.params[t.param].local_grad).shape.numel());
    // The gradient where the transport reads it: in place on a host backend, else a host copy
    // written back when `host` goes.
    HostStaging host(r.executor().backend());
    float* g = host.write(r.grad_data(t.param), count);
    const std::string what = "tied gradient " + r.program().part.params[t.param].name;
    if (t.holders[0] == model_chunk(t.v)) {  // the owner sums in holder order and sends back
      // The other holders' copies arrive a piece at a time, each added before the next is
      // received: a token table's gradient is not held twice (gpt2-small: 147 MiB).
      std::vector<float> piece(static_cast<size_t>(std::min(count, kTiedPiece)));
      for (int64_t at = 0; at < count; at += kTiedPiece) {
        const int64_t len = std::min(kTiedPiece, count - at);
        for (size_t h = 1; h < t.holders.size(); ++h) {
          TS_RETURN_IF_ERROR(
              pipe_->wait(pipe_->recv(piece.data(), len, t.holders[h] % stages, kTiedUpTag, what)));
          for (int64_t i = 0; i < len; ++i) g[at + i] += piece[size_t(i)];
        }
      }
      std::vector<Request> back;
      for (size_t h = 1; h < t.holders.size(); ++h)
        back.push_back(pipe_->send(g, count, t.holders[h] % stages, kTiedDownTag, what));
      for (const Request& q : back) TS_RETURN_IF_ERROR(pipe_->wait(q));
    } else {
      const int owner = t.holders[0] % stages;
      for (int64_t at = 0; at < count; at += kTiedPiece)  // in the owner's pieces, in order
        TS_RETURN_IF_ERROR(pipe_->wait(
            pipe_->send(g + at, std::min(kTiedPiece, count - at), owner, kTiedUpTag, what)));
      TS_RETURN_IF_ERROR(pipe_->wait(pipe_->recv(g, count, owner, kTiedDownTag, what)));
    }
  }
  return Status();
}

Result<double> PipelineRunner::apply(double lr, double clip) {
  TS_RETURN_IF_ERROR(sum_tied_grads());
  double sq = 0;
  for (auto& c : chunks_) {
    TS_ASSIGN_OR_RETURN(const double s, c->grad_sq_sum());
    sq += s;
  }
  // fp16: every chunk's gradients carry the same loss scale, kept in step by the same sum
  // (0: they overflowed somewhere in the pipeline; no stage updates).
  double scale = 1.0;
  if (loss_scale() > 0)
    for (auto& c : chunks_) scale = c->take_loss_scale(sq);
  if (scale == 0) return 0.0;
  const double norm = std::sqrt(sq) / scale;
  const double coef = clip > 0 ? AdamW::clip_coefficient(norm, clip) : 1.0;
  for (auto& c : chunks_) TS_RETURN_IF_ERROR(c->step(lr, coef / scale));
  return norm;
}

Result<float> PipelineRunner::evaluate(const Feed& feed) {
  feed_ = &feed;
  double loss = 0;
  // Local chunks in model-chunk order: chunk v waits for chunk v * stages - 1 of the last stage.
  for (int v = 0; v < local_chunks(); ++v) {
    const ChunkProgram& c = pp_.chunks[static_cast<size_t>(model_chunk(v))];
    Executor& ex = chunk(v).phase_executor(kForwardPhase);
    const PipeAction a{PipeOp::forward, 0, v};
    TS_RETURN_IF_ERROR(feed_forward(a, ex));
    TS_RETURN_IF_ERROR(chunk(v).run_phase(kForwardPhase));
    if (ex.graph().loss() >= 0) loss += ex.read_scalar(ex.graph().loss());
    if (!c.send.empty()) TS_RETURN_IF_ERROR(send(a, ex, in_phase(c, 0, c.send), kForwardPhase));
  }
  TS_RETURN_IF_ERROR(reap_sends(true));
  TS_ASSIGN_OR_RETURN(loss, pipe_->all_reduce_scalar(loss, /*max=*/false, "evaluation loss"));
  return static_cast<float>(loss);
}

bool PipelineRunner::writes_tied_copy(int v, size_t i) const {
  for (const Tied& t : tied_)
    if (t.v == v && t.param == i) return t.holders[0] == model_chunk(v);
  return true;
}

Status PipelineRunner::gather_params(std::vector<std::vector<float>>* whole) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < model_.params().size(); ++i) index[model_.name_of(model_.params()[i])] = i;
  whole->assign(model_.params().size(), {});
  // Each stage's ranks gather their chunks' whole parameters (tied copies left out).
  std::vector<size_t> mine;  // model indices, in the order they travel to stage 0
  for (int v = 0; v < local_chunks(); ++v) {
    std::vector<std::vector<float>> w;
    TS_RETURN_IF_ERROR(chunk(v).gather_params(&w));
    const std::vector<ParamLayout>& params = chunk(v).program().part.params;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!writes_tied_copy(v, i)) continue;
      const size_t m = index.at(params[i].name);
      (*whole)[m] = std::move(w[i]);
      mine.push_back(m);
    }
  }
  // The pipeline group of world rank 0 brings them to it, one message per parameter.
  const Plan& plan = pp_.plan;
  const int world_rank = comms_.world().rank();
  if (plan.mesh.group_color(world_rank, {plan.pipeline_axis}) !=
      plan.mesh.group_color(0, {plan.pipeline_axis}))
    return Status();
  const int stages = pp_.schedule.stages;
  if (stage_ != 0) {
    for (size_t m : mine) {
      const std::vector<float>& w = (*whole)[m];
      TS_RETURN_IF_ERROR(
          pipe_->wait(pipe_->send(w.data(), static_cast<int64_t>(w.size()), 0, kTiedUpTag,
                                  "gather " + model_.name_of(model_.params()[m]))));
    }
    return Status();
  }
  // Stage 0: the other stages' parameters from their first holders, in the order each stage
  // sends them (its chunks ascending, parameters in chunk order).
  std::vector<char> seen(model_.params().size(), 0);
  std::vector<std::vector<const ParamLayout*>> from(static_cast<size_t>(stages));
  for (int k = 0; k < pp_.schedule.chunks(); ++k)
    for (const ParamLayout& pl : pp_.chunks[static_cast<size_t>(k)].program.part.params) {
      const size_t m = index.at(pl.name);
      if (seen[m]) continue;
      seen[m] = 1;
      from[static_cast<size_t>(k % stages)].push_back(&pl);
    }
  for (int s = 1; s < stages; ++s)
    for (const ParamLayout* pl : from[static_cast<size_t>(s)]) {
      std::vector<float>& w = (*whole)[index.at(pl->name)];
      w.resize(static_cast<size_t>(pl->global_shape.numel()));
      TS_RETURN_IF_ERROR(pipe_->wait(pipe_->recv(w.data(), static_cast<int64_t>(w.size()), s,
                                                 kTiedUpTag, "gather " + pl->name)));
    }
  return Status();
}

int64_t PipelineRunner::measured_arena_bytes() const {
  int64_t slots = 0;
  for (const Buffer& s : slots_) slots += s.bytes();
  for (const Buffer& s : wslots_) slots += s.bytes();
  return arena_.high_water() + slots;
}

}  // namespace tessera
