// The training loop: data, learning-rate schedule, gradient accumulation, evaluation, metrics
// (tokens/s, MFU), progress, checkpoints and exact resume, safe stops (signals, divergence,
// the run-directory lock) and a sample at the end, around the StepRunner of this rank. The
// command line only turns flags into a TrainJob (cli/train_command.cc).
//
//   TrainJob job{cfg, plan, world.get(), default_data_dir()};  // world null: one process
//   TS_RETURN_IF_ERROR(train(options, job));
#pragma once

#include <string>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "models/model.h"
#include "parallel/plan.h"
#include "train/train_options.h"

namespace tessera {

struct TrainJob {
  ModelConfig cfg;
  Plan plan;                      // placements settled; a plan of one rank for one process
  Communicator* world = nullptr;  // this process's MPI world; null: one process
  std::string shipped_data_dir;   // the tokenizer and the corpus used without --data
  Backend* backend = nullptr;     // where the step runs; null: the CPU backend
  // The ranks' device communicator (NCCL), split like `world`, for the collectives of values in
  // the backend's device memory; null: they are staged through host memory over `world`.
  Communicator* device_world = nullptr;
};

// --out against --resume: a checkpoint to continue from when resuming, none otherwise.
// Checked by train(), and by `tessera launch` before it starts the ranks.
Status check_run_dir(const TrainOptions& o);

// Trains under job.plan on this rank. A stop signal ends the process (exit 128 + signal)
// after saving a checkpoint.
Status train(const TrainOptions& o, const TrainJob& job);

}  // namespace tessera
