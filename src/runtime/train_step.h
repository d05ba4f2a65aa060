// One optimizer step of a model graph on one process: forward + backward per micro-batch with
// gradient accumulation, global-norm clipping, AdamW. The training loop (cli/train_command.cc)
// adds data, schedule, logging and checkpoints around it.
//
//   TrainStep ts(model, cpu, AdamWConfig{});
//   ts.executor().init_params(seed);
//   for (int micro = 0; micro < k; ++micro) loss += ts.forward_backward(x, y);
//   double norm = ts.apply(lr, /*clip=*/1.0, /*micro_steps=*/k);
//
// With RecomputePolicy::full it executes apply_recompute(model.graph) (parallel/recompute.h):
// the same loss and gradients with less activation memory and more FLOPs.
#pragma once

#include <memory>
#include <vector>

#include "models/model.h"
#include "parallel/plan.h"
#include "runtime/executor.h"
#include "runtime/optimizer.h"

namespace tessera {

class TrainStep {
 public:
  TrainStep(const ModelGraph& model, Backend& backend, AdamWConfig opt,
            RecomputePolicy recompute = RecomputePolicy::none);

  Executor& executor() { return *exec_; }
  AdamW& optimizer() { return *opt_; }
  const ModelGraph& model() const { return model_; }
  // The graph executed: model.graph, or its recomputed copy (same parameter ids).
  const Graph& graph() const { return recomputed_ ? *recomputed_ : model_.graph; }

  // Runs forward and backward on one micro-batch (tokens and targets: B*T ids each) and adds
  // the gradients to the accumulators. Returns the micro-batch loss.
  float forward_backward(const int32_t* tokens, const int32_t* targets);
  // Averages the accumulated gradients over micro_steps, clips them to clip (<= 0: no
  // clipping), steps AdamW with lr and clears the accumulators. Returns the pre-clip norm.
  double apply(double lr, double clip, int micro_steps);
  // Accumulated gradient of parameter i (the optimizer's order: graph.params()).
  const float* grad(size_t i) const;

 private:
  const ModelGraph& model_;
  std::unique_ptr<Graph> recomputed_;  // null without recomputation
  std::unique_ptr<Executor> exec_;
  std::unique_ptr<AdamW> opt_;
  std::vector<std::vector<float>> grads_;  // accumulators, filled from a second micro-batch on
  int accumulated_ = 0;
};

}  // namespace tessera
