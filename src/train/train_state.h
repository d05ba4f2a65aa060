// Everything a training run holds besides the data: the training step (model, parameters,
// gradients, AdamW), the evaluation graph, and their checkpoint save/load and sampling.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "data/batch_stream.h"
#include "data/tokenizer.h"
#include "io/sharded_checkpoint.h"
#include "models/model.h"
#include "runtime/step_driver.h"
#include "train/train_options.h"

namespace tessera {

// The feed of a host batch: each of its buffers under its input's name.
Feed feed_of(const HostBatch& batch);

class TrainState {
 public:
  // The state of this rank of a run under `plan` (one process: a plan of one rank and
  // MeshComms::single). `comms` must outlive the state.
  static Result<std::unique_ptr<TrainState>> create(const ModelConfig& cfg,
                                                    const TrainOptions& opts, Backend& backend,
                                                    MeshComms& comms, const Plan& plan);
  TrainState(const TrainState&) = delete;

  ModelConfig cfg;
  TrainOptions opts;
  Backend& backend;
  ModelGraph model;  // training graph (global batch)
  // This rank's parameters, gradients and optimizer, and its step under the plan, whatever
  // the plan (runtime/step_driver.h).
  std::unique_ptr<StepDriver> step;
  int rank = 0;
  MeshComms& comms() const { return step->comms(); }
  bool distributed() const { return comms().world().size() > 1; }
  bool is_leader() const { return rank == 0; }  // prints, writes metrics
  const Plan& plan() const { return step->plan(); }
  int64_t micro_batches_per_call() const { return step->micro_batches_per_call(); }

  // `feed`: this rank's rows of micro_batches_per_call() micro-batches, one after the other.
  // Returns their mean loss (global, the same on every rank).
  Result<float> forward_backward(const Feed& feed) { return step->forward_backward(feed); }
  Result<double> apply(double lr, double clip) { return step->apply(lr, clip); }
  // fp16 runs (StepRunner's loss scaling): the scale, and whether the last apply() skipped
  // its update because the gradients overflowed. 0 and false otherwise.
  double loss_scale() const { return step->loss_scale(); }
  int64_t loss_scale_good_steps() const { return step->loss_scale_good_steps(); }
  bool step_skipped() const { return step->step_skipped(); }
  void set_loss_scale(double scale, int64_t good_steps) { step->set_loss_scale(scale, good_steps); }
  void init_params(uint64_t seed) { step->init_params(seed); }
  // The global loss of one evaluation batch (this rank's rows), under the training plan on this
  // rank's parameter pieces in place.
  Result<float> evaluate(const Feed& feed) { return step->evaluate(feed); }
  // The whole parameters in the model graph's order, at least on rank 0. Collective.
  Status gather_params(std::vector<std::vector<float>>* whole) {
    return step->gather_params(whole);
  }
  // Memory measurement around the first forward_backward: the arena (and a pipeline stage's
  // stash slots) painted, then its high-water against the plan.
  void paint_arena() { step->paint_arena(); }
  int64_t measured_arena_bytes() const { return step->measured_arena_bytes(); }
  int64_t planned_arena_bytes() const { return step->planned_arena_bytes(); }
  // What memory the plan gives this run, printed before step 0 (per stage with a pipeline),
  // with the host memory a checkpoint's snapshot takes.
  std::string describe_memory() const;
  // The bytes begin_save() copies to host memory (this rank's pieces of the parameters and
  // AdamW moments, as f32); 0 when checkpoints are written from host-resident state directly
  // (--sync-checkpoints).
  int64_t snapshot_bytes() const;
  // What this rank's process should hold beyond the program: its plan and the snapshot.
  int64_t planned_process_bytes() const { return step->planned_bytes() + snapshot_bytes(); }
  // A line for a device run in bf16/f16 whose vocabulary rows are unaligned (else empty).
  std::string unaligned_vocabulary_note() const;

  // Loss-mode graph of the global batch (evaluated under the training plan without stages).
  ModelGraph eval_model;
  LoaderState val_start;

  // Whether every parameter element is finite (on every rank: collective when distributed).
  Result<bool> params_finite() const;
  // Checkpoints: <root>/step-N (parameters, AdamW moments, loader position, config), old ones
  // pruned beyond opts.keep_ckpts. Distributed: every rank writes its shards, rank 0 commits
  // after all succeeded (the checkpoint loads under any plan). Written while training goes
  // on: begin_save() copies this rank's state to host memory (a snapshot; the only part the
  // step waits for) and writes its files on a thread of its own; finish_save() waits for them
  // and publishes the checkpoint, still atomically (staging, rename, `latest` last). Every rank
  // calls both at the same points (finish_save is collective when distributed); at most one
  // save is in flight (begin_save finishes the one before). With opts.sync_checkpoints the
  // files are written by begin_save itself.
  Status begin_save(const std::string& root, int64_t completed_steps, const BatchStream& train);
  // The step of the published checkpoint, or -1 when none was in flight. Collective.
  Result<int64_t> finish_save();
  bool save_in_flight() const { return pending_ != nullptr; }
  ~TrainState();
  // Loads the newest checkpoint under root (or a step directory), written under any plan,
  // re-sharding to this one; returns its completed steps. Flags of the schedule that differ
  // from the checkpoint's (--lr, --warmup, --min-lr-frac, --clip, --steps) are allowed and
  // listed in resume_changes ("--lr 0.02 (was 0.002)").
  Result<int64_t> load(const std::string& root, BatchStream* train);
  std::vector<std::string> resume_changes;
  // Only the parameters of a checkpoint (any plan; e.g. one `tessera import hf` wrote),
  // for a new run that starts from them: `train --init-from`. The model must match.
  Status init_params_from(const std::string& checkpoint);
  // The share of `batches` whole global batches of `stream` whose top logit is their label
  // (image models), with the whole parameters `whole` (gather_params), in one process.
  double accuracy(const std::vector<std::vector<float>>& whole, BatchStream& stream,
                  int64_t batches);
  // Generates from `whole` (StepRunner::gather_params) in one process.
  Result<std::string> sample(const std::vector<std::vector<float>>& whole,
                             const std::vector<int32_t>& prompt, int tokens, uint64_t seed,
                             const Tokenizer& tok);

 private:
  TrainState(const ModelConfig& cfg, const TrainOptions& opts, Backend& backend);
  Status read_held(const ShardedCheckpoint& ck, bool with_moments);
  struct PendingSave;                     // train_state_save.cc
  std::shared_ptr<PendingSave> pending_;  // shared_ptr: PendingSave is complete in its file
  nlohmann::json manifest(int64_t completed, const BatchStream& train) const;
  using HeldParam = StepDriver::HeldParam;
  std::vector<HeldParam> held_params() const { return step->held_params(); }
};

}  // namespace tessera
