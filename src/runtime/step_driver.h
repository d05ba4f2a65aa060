// StepDriver: the one interface a training loop drives this rank's step through, whatever the
// plan. make_step_driver picks the driver: an SPMD plan (one process, data, ZeRO-1/2/3, HSDP,
// tensor and sequence parallelism) runs its StepRunner; a pipeline plan runs this rank's stage
// (PipelineRunner: its chunk StepRunners on the stage's schedule). The loop — and the state
// that saves, loads and evaluates (train/train_state.h) — never asks which.
//
//   TS_ASSIGN_OR_RETURN(auto step, make_step_driver(model.graph, eval.graph, plan, cpu, comms,
//                                                   adamw));
//   step->init_params(seed);
//   for (int k = 0; k < plan.micro_batches / step->micro_batches_per_call(); ++k)
//     TS_ASSIGN_OR_RETURN(float loss, step->forward_backward(feed));  // this rank's rows
//   TS_ASSIGN_OR_RETURN(double norm, step->apply(lr, clip));
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/step_runner.h"

namespace tessera {

class StepDriver {
 public:
  virtual ~StepDriver() = default;

  virtual const Plan& plan() const = 0;
  virtual MeshComms& comms() const = 0;
  // Micro-batches one forward_backward call takes: all of the step's with pipeline stages (the
  // schedule interleaves them), else one.
  virtual int64_t micro_batches_per_call() const = 0;

  // The same model on any plan.
  virtual void init_params(uint64_t seed) = 0;
  // `feed`: this rank's rows of micro_batches_per_call() micro-batches, one after the other.
  // Returns their mean loss (global, the same on every rank).
  virtual Result<float> forward_backward(const Feed& feed) = 0;
  // The model's metrics (Graph::metrics, global) summed over the forward_backward calls since
  // the last take, in the graph's order; then zero. None under pipeline stages (yet).
  virtual std::vector<std::pair<std::string, double>> take_metrics() { return {}; }
  // After plan().micro_batches micro-batches: clips to `clip` (<= 0: none) by the global norm
  // and steps AdamW. Returns the pre-clip norm (0 for an fp16 step skipped on overflow).
  virtual Result<double> apply(double lr, double clip) = 0;
  // fp16 (StepRunner's dynamic loss scaling, shared by a pipeline's stages): the scale, and
  // whether the last apply() skipped its update. 0 and false for f32 and bf16.
  virtual double loss_scale() const = 0;
  virtual int64_t loss_scale_good_steps() const = 0;
  virtual bool step_skipped() const = 0;
  virtual void set_loss_scale(double scale, int64_t good_steps) = 0;

  // The global loss of one evaluation batch (`feed`: this rank's rows of one micro-batch)
  // under the training plan, on this rank's parameter pieces in place. Collective.
  virtual Result<float> evaluate(const Feed& feed) = 0;
  // The whole parameters in the model graph's order, at least on world rank 0. Collective.
  virtual Status gather_params(std::vector<std::vector<float>>* whole) = 0;

  // Memory measurement around a forward_backward: paint, then the high-water against the plan.
  virtual void paint_arena() = 0;
  virtual int64_t measured_arena_bytes() const = 0;
  virtual int64_t planned_arena_bytes() const = 0;
  // The planned memory of this plan, as printed before step 0: "per rank arena ..." (one line
  // per stage with stages).
  virtual std::string describe_memory() const = 0;
  // The bytes that description adds up to for this rank: what its process should hold beyond
  // the program itself (arena, parameters, gradients, optimizer state on the device or the
  // host, evaluation arena; a pipeline stage's stash and send buffers).
  virtual int64_t planned_bytes() const = 0;
  // This rank's pipeline stage, or -1 without stages (for messages).
  virtual int stage() const { return -1; }
  // Records what the step runs into `trace` (null: stop): the compute of every runner and
  // every communicator's operations (runtime/step_trace.h).
  virtual void set_trace(StepTrace* trace) = 0;

  // Every parameter piece this rank holds (a pipeline stage: each of its chunks'), in order,
  // with whether this rank writes it, and its AdamW moments, into a checkpoint: one copy of
  // every element over all ranks.
  struct HeldParam {
    StepRunner* runner;
    size_t index;  // in runner's program
    bool writes_param, writes_optim;
  };
  virtual std::vector<HeldParam> held_params() const = 0;
};

// The driver of `plan` on this rank. `model` (the single-device training graph) and `eval` (its
// loss-mode graph, for an SPMD plan's evaluation) must outlive the driver.
Result<std::unique_ptr<StepDriver>> make_step_driver(const Graph& model, const Graph& eval,
                                                     const Plan& plan, Backend& backend,
                                                     MeshComms& comms, AdamWConfig opt);

}  // namespace tessera
