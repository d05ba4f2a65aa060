// Everything a training run holds besides the data: the training step (model, parameters,
// gradients, AdamW), the evaluation graph, and their checkpoint save/load and sampling.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "data/bpe_tokenizer.h"
#include "data/loader.h"
#include "models/model.h"
#include "runtime/step_runner.h"
#include "train/train_options.h"

namespace tessera {

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
  ModelGraph model;                    // training graph (global batch)
  std::unique_ptr<StepRunner> runner;  // this rank's parameters, gradients and optimizer
  int rank = 0;
  bool distributed() const { return runner->comms().world().size() > 1; }
  bool is_leader() const { return rank == 0; }  // prints, writes metrics

  // tokens/targets: this rank's rows.
  Result<float> forward_backward(const int32_t* tokens, const int32_t* targets) {
    return runner->forward_backward(tokens, targets);
  }
  Result<double> apply(double lr, double clip) { return runner->apply(lr, clip); }
  Executor& executor() { return runner->executor(); }
  void init_params(uint64_t seed) { runner->init_params(seed); }
  // Loss only, global batch: evaluated under the training plan (StepRunner::evaluate), on this
  // rank's parameter pieces in place.
  ModelGraph eval_model;
  LoaderState val_start;

  // Whether every parameter element is finite (on every rank: collective when distributed).
  Result<bool> params_finite() const;
  // Writes <root>/step-N (parameters, AdamW moments, loader position, config) and prunes old
  // checkpoints beyond opts.keep_ckpts. Distributed: every rank writes its shards, rank 0
  // commits after all succeeded (the checkpoint loads under any plan).
  Status save(const std::string& root, int64_t completed_steps, const DataLoader& train) const;
  // Loads the newest checkpoint under root (or a step directory), written under any plan,
  // re-sharding to this one; returns its completed steps.
  Result<int64_t> load(const std::string& root, DataLoader* train);
  // Generates from `whole` (StepRunner::gather_params) in one process.
  std::string sample(const std::vector<std::vector<float>>& whole,
                     const std::vector<int32_t>& prompt, int tokens, uint64_t seed,
                     const Gpt2Tokenizer& tok);

 private:
  TrainState(const ModelConfig& cfg, const TrainOptions& opts, Backend& backend);
  Status save_sharded(const std::string& root, int64_t completed,
                      const nlohmann::json& manifest) const;
  nlohmann::json manifest(int64_t completed, const DataLoader& train) const;
};

}  // namespace tessera
