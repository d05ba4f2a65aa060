// TrainState's checkpoints, written while training goes on (train_state.h): a host snapshot of
// this rank's state, its files written by a thread of their own, published by finish_save.
#include <deque>
#include <thread>

#include "io/checkpoint.h"
#include "io/sharded_checkpoint.h"
#include "train/train_state.h"

namespace tessera {

// One save in flight: the snapshot the writer thread reads, what it wrote, and what
// finish_save publishes.
struct TrainState::PendingSave {
  std::string root, name;
  int64_t completed = 0;
  nlohmann::json manifest;
  std::deque<std::vector<float>> snapshot;   // host copies (a deque: they stay put)
  std::unique_ptr<CheckpointWriter> single;  // one process: its staged checkpoint
  std::vector<TensorShard> shards;           // distributed: this rank's pieces
  NamedTensorRefs params, moments;           // one process: the tensors, by name
  Status written;                            // the writer's outcome (after join)
  std::thread writer;

  void write(bool distributed, int rank, int world) {
    if (distributed) {
      written = write_checkpoint_shards(root, name, rank, world, shards);
      return;
    }
    single = std::make_unique<CheckpointWriter>(root, name);
    written = single->add_tensors("model.safetensors", params);
    if (written.ok()) written = single->add_tensors("optimizer.safetensors", moments);
  }
};

TrainState::~TrainState() {
  // A save not finished (the run ended on an error): its files stay staged, never published;
  // the next run on this --out removes them.
  if (pending_ && pending_->writer.joinable()) pending_->writer.join();
}

int64_t TrainState::snapshot_bytes() const {
  int64_t floats = 0;
  const bool sharded = distributed();
  for (const HeldParam& h : held_params()) {
    StepRunner& r = *h.runner;  // (state_backend() is not const)
    // Written at once from host memory, the state itself serves (begin_save's `copy`).
    if (opts.sync_checkpoints && r.state_backend().memory() == MemSpace::host) continue;
    const ParamLayout& pl = r.program().part.params[h.index];
    if (!sharded) {
      floats += 3 * pl.global_shape.numel();  // the parameter and its two moments, whole
      continue;
    }
    if (h.writes_param) floats += r.param_piece(h.index).count;
    if (h.writes_optim) floats += 2 * r.optim_piece(h.index).count;
  }
  return floats * static_cast<int64_t>(sizeof(float));
}

Status TrainState::begin_save(const std::string& root, int64_t completed,
                              const BatchStream& train) {
  TS_RETURN_IF_ERROR(finish_save().status());  // at most one in flight
  auto p = std::make_unique<PendingSave>();
  p->root = root;
  p->name = checkpoint_name(completed);
  p->completed = completed;
  p->manifest = manifest(completed, train);
  // The snapshot: this rank's pieces copied to host memory, which the next steps do not touch.
  // Written at once (--sync-checkpoints) from host memory, the state itself serves.
  // (The state is in the runners' state_backend(): host memory when the optimizer is offloaded.)
  Backend* state = nullptr;
  auto copy = [&](const void* src, int64_t n) {
    if (opts.sync_checkpoints && state->memory() == MemSpace::host)
      return static_cast<const float*>(src);
    std::vector<float>& v = p->snapshot.emplace_back(static_cast<size_t>(n));
    state->to_host(v.data(), src, n * static_cast<int64_t>(sizeof(float)));
    return static_cast<const float*>(v.data());
  };
  const bool sharded = distributed();
  for (const HeldParam& h : held_params()) {
    StepRunner& r = *h.runner;
    state = &r.state_backend();
    const size_t i = h.index;
    const ParamLayout& pl = r.program().part.params[i];
    const AdamW& opt = r.optimizer();
    if (!sharded) {  // one process holds every parameter whole: plain safetensors files
      const std::vector<int64_t> shape = pl.global_shape.dims();
      const int64_t n = pl.global_shape.numel();
      p->params.push_back({pl.name, TensorRef{DType::f32, shape, copy(r.param_storage(i), n)}});
      p->moments.push_back({"adam.m." + pl.name, TensorRef{DType::f32, shape, copy(opt.m(i), n)}});
      p->moments.push_back({"adam.v." + pl.name, TensorRef{DType::f32, shape, copy(opt.v(i), n)}});
      continue;
    }
    // Each rank writes the pieces it is the designated writer of (one copy of each element; a
    // tensor-parallel piece as its box of the global tensor).
    const LocalPiece pp = r.param_piece(i), op = r.optim_piece(i);
    const Box box = r.param_box(i);
    if (h.writes_param)
      p->shards.push_back({pl.name, DType::f32, pl.global_shape, pp.offset, pp.count,
                           copy(r.param_storage(i), pp.count), box.lo, box.hi});
    if (h.writes_optim) {
      p->shards.push_back({"adam.m." + pl.name, DType::f32, pl.global_shape, op.offset, op.count,
                           copy(opt.m(i), op.count), box.lo, box.hi});
      p->shards.push_back({"adam.v." + pl.name, DType::f32, pl.global_shape, op.offset, op.count,
                           copy(opt.v(i), op.count), box.lo, box.hi});
    }
  }
  const int rank = comms().world().rank(), world = comms().world().size();
  PendingSave* raw = p.get();
  if (opts.sync_checkpoints)
    raw->write(sharded, rank, world);
  else
    raw->writer = std::thread([raw, sharded, rank, world] { raw->write(sharded, rank, world); });
  pending_ = std::move(p);
  return Status();
}

Result<int64_t> TrainState::finish_save() {
  if (!pending_) return int64_t{-1};
  std::shared_ptr<PendingSave> p = std::move(pending_);
  if (p->writer.joinable()) p->writer.join();
  if (!distributed()) {
    TS_RETURN_IF_ERROR(p->written);
    TS_RETURN_IF_ERROR(p->single->commit(p->manifest));
    if (opts.keep_ckpts > 0)
      TS_RETURN_IF_ERROR(prune_checkpoints(p->root, static_cast<int>(opts.keep_ckpts)));
    return p->completed;
  }
  // All ranks agree that every write succeeded, then rank 0 publishes.
  Communicator& world = comms().world();
  TS_ASSIGN_OR_RETURN(double failed, world.all_reduce_scalar(p->written.ok() ? 0.0 : 1.0, true,
                                                             "checkpoint write"));
  if (!p->written.ok()) return p->written;
  if (failed > 0)
    return error("checkpoint " + p->name + ": another rank failed to write its shards",
                 "see that rank's message; the previous checkpoint is intact");
  Status committed;
  if (world.rank() == 0) {
    committed = commit_checkpoint_shards(p->root, p->name, world.size(), p->manifest);
    if (committed.ok() && opts.keep_ckpts > 0)
      committed = prune_checkpoints(p->root, static_cast<int>(opts.keep_ckpts));
  }
  TS_ASSIGN_OR_RETURN(
      failed, world.all_reduce_scalar(committed.ok() ? 0.0 : 1.0, true, "checkpoint commit"));
  if (!committed.ok()) return committed;
  if (failed > 0) return error("checkpoint " + p->name + ": rank 0 failed to commit it");
  return p->completed;
}

}  // namespace tessera
