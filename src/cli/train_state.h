// Everything a training run holds besides the data: the training step (model, parameters,
// gradients, AdamW), the evaluation graph, and their checkpoint save/load and sampling.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "cli/commands.h"
#include "data/bpe_tokenizer.h"
#include "data/loader.h"
#include "models/model.h"
#include "runtime/train_step.h"

namespace tessera {

class TrainState {
 public:
  TrainState(const ModelConfig& cfg, const TrainOptions& opts, Backend& backend);
  TrainState(const TrainState&) = delete;

  ModelConfig cfg;
  TrainOptions opts;
  Backend& backend;
  ModelGraph model;                 // training graph
  std::unique_ptr<TrainStep> step;  // parameters, gradients, optimizer
  ModelGraph eval_model;            // loss only, same batch shape
  std::unique_ptr<Executor> eval_exec;
  LoaderState val_start;

  void copy_params_to_eval();
  // Writes <root>/step-N (parameters, AdamW moments, loader position, config) and prunes old
  // checkpoints beyond opts.keep_ckpts.
  Status save(const std::string& root, int64_t completed_steps, const DataLoader& train) const;
  // Loads the newest checkpoint under root (or a step directory); returns its completed steps.
  Result<int64_t> load(const std::string& root, DataLoader* train);
  std::string sample(const std::vector<int32_t>& prompt, int tokens, uint64_t seed,
                     const Gpt2Tokenizer& tok);
};

// Copies the named parameters of `src` into the same-named parameters of `dst`.
void copy_params(const Graph& g_src, Executor& src, const Graph& g_dst, Executor& dst);

}  // namespace tessera
