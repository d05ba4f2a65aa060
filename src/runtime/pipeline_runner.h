// The pipeline step runner: one optimizer step of a pipeline-parallel plan on one rank, which
// holds one stage (its virtual stages' model chunks, each a chunk StepRunner) of a data- and
// tensor-parallel pipeline. It executes the stage's schedule (parallel/pipeline_schedule.h)
// action by action:
//
//   F  receive the previous chunk's activations (p2p on the pipeline axis), run the forward
//      phase, keep its stash in a slot, send the activations on (all on the p2p stream, posted
//      one action ahead and overlapping compute);
//   B  receive the next chunk's gradients, run the backward phase from the stash, send the input
//      gradients back; under zb-h1 B computes only those, and
//   W  runs the weight gradients later from a stash of its own.
//
// Gradients are accumulated over the micro-batches unreduced, and reduced over the data and
// tensor axes once per step (each chunk's reduce phase, StepRunner::reduce_grads); parameters held
// on two stages (GPT-2's tied wte on the first and the last) have their gradients summed between
// them; the norm spans every stage; each stage steps AdamW on its own chunks.
//
//   TS_ASSIGN_OR_RETURN(PipelineProgram pp, lower_pipeline(model.graph, plan));
//   TS_ASSIGN_OR_RETURN(auto step, PipelineRunner::create(model.graph, pp, cpu, comms, adamw));
//   step->init_params(seed);                    // the same model as on one rank
//   TS_ASSIGN_OR_RETURN(float loss, step->forward_backward(feed));  // all micro-batches
//   TS_ASSIGN_OR_RETURN(double norm, step->apply(lr, clip));
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "parallel/pipeline_program.h"
#include "runtime/step_driver.h"
#include "runtime/step_runner.h"

namespace tessera {

// A pipeline stage's StepDriver (runtime/step_driver.h; make_step_driver makes one for a plan
// with stages).
class PipelineRunner final : public StepDriver {
 public:
  // `model` (the single-device training graph) and `program` (lower_pipeline's, for this plan)
  // must outlive the runner.
  static Result<std::unique_ptr<PipelineRunner>> create(const Graph& model,
                                                        const PipelineProgram& program,
                                                        Backend& backend, MeshComms& comms,
                                                        AdamWConfig opt);
  // The same, owning the program.
  static Result<std::unique_ptr<PipelineRunner>> create(const Graph& model,
                                                        std::unique_ptr<PipelineProgram> program,
                                                        Backend& backend, MeshComms& comms,
                                                        AdamWConfig opt);
  PipelineRunner(const PipelineRunner&) = delete;
  ~PipelineRunner() override;

  const PipelineProgram& program() const { return pp_; }
  const Plan& plan() const override { return pp_.plan; }
  MeshComms& comms() const override { return comms_; }
  int64_t micro_batches_per_call() const override { return pp_.plan.micro_batches; }
  int stage() const override { return stage_; }
  // This stage's model chunks, by virtual stage: model chunk v * stages + stage.
  int local_chunks() const { return static_cast<int>(chunks_.size()); }
  StepRunner& chunk(int v) { return *chunks_[static_cast<size_t>(v)]; }
  int model_chunk(int v) const { return v * pp_.schedule.stages + stage_; }

  void init_params(uint64_t seed) override;
  // The forward and backward passes of one step over plan.micro_batches micro-batches.
  // `feed`: this rank's rows of every micro-batch of each model input, one micro-batch after
  // the other. Returns the mean loss over the micro-batches, the same on every rank.
  Result<float> forward_backward(const Feed& feed) override;
  // The model's metrics summed over this step's micro-batches, from the stage finishing each.
  // Collective over the pipeline axis.
  std::vector<std::pair<std::string, double>> take_metrics() override;
  // Clips to `clip` (<= 0: none) by the norm over every stage and steps AdamW. Returns the
  // pre-clip norm, the same on every rank. fp16: the stages share one dynamic loss scale
  // (StepRunner::loss_scale); gradients that overflow on any stage skip the step on all.
  Result<double> apply(double lr, double clip) override;
  double loss_scale() const override { return chunks_[0]->loss_scale(); }
  int64_t loss_scale_good_steps() const override { return chunks_[0]->loss_scale_good_steps(); }
  bool step_skipped() const override { return chunks_[0]->step_skipped(); }
  void set_loss_scale(double scale, int64_t good_steps) override {
    for (auto& c : chunks_) c->set_loss_scale(scale, good_steps);
  }

  // The loss of one batch (`feed`: this rank's rows of one micro-batch), the forward phases
  // only, passed down the stages; the same on every rank. Collective. Between steps.
  Result<float> evaluate(const Feed& feed) override;
  // Whether this rank's chunk v writes parameter i into a checkpoint as far as the pipeline is
  // concerned: a tied parameter is written by its first holder only (StepRunner::writes_param
  // picks among the stage's data and tensor ranks).
  bool writes_tied_copy(int v, size_t i) const;
  // The whole parameters, in the model graph's order, on world rank 0 (every stage's ranks
  // gather their chunks' pieces; the stages send them to stage 0). Other ranks get them
  // partly or not at all. Collective. Between steps.
  Status gather_params(std::vector<std::vector<float>>* whole) override;
  // Each chunk's parameters; a tied copy is written by its first holder only.
  std::vector<HeldParam> held_params() const override;

  // Memory measurement, off the hot path: paint_arena() before a forward_backward, then
  // measured_arena_bytes() is the arena's high-water mark since plus the stash slots this stage
  // holds, against the plan's stage_arena_bytes.
  void paint_arena() override { arena_.paint(); }
  int64_t measured_arena_bytes() const override;
  int64_t planned_arena_bytes() const override {
    return pp_.stage_arena_bytes[static_cast<size_t>(stage_)];
  }
  // The plan and, per stage, its blocks, arena (with the stash), send buffers and persistent
  // bytes.
  std::string describe_memory() const override;
  int64_t planned_bytes() const override;
  void set_trace(StepTrace* trace) override {
    for (auto& c : chunks_) c->set_trace(trace);
    comms_.set_trace_sink(trace);
  }
  // Bytes of activations and gradients held for in-flight sends at most, against the plan's
  // send buffers (PipelineProgram::stage_p2p_bytes, allocated once).
  int64_t p2p_buffer_bytes() const { return p2p_high_water_; }
  int64_t planned_p2p_bytes() const;

 private:
  PipelineRunner(const Graph& model, const PipelineProgram& program, MeshComms& comms);
  struct Message;  // a boundary transfer in flight
  Status run_action(const PipeAction& a);
  // The forward phase's inputs of action a (micro-batch a.micro_batch): the previous chunk's
  // activations and this micro-batch's tokens and targets.
  Status feed_forward(const PipeAction& a, Executor& ex);
  // Posts the receive action a needs (if any, and not yet posted).
  void post_recv(const PipeAction& a);
  // Waits for action a's receive and copies it into the inputs `into` of ex.
  Status take_recv(const PipeAction& a, Executor& ex, const std::vector<ValueId>& into);
  Status send(const PipeAction& a, Executor& ex, const std::vector<ValueId>& from, int ph);
  // Completes finished sends (all: every one), returning their buffers to their pools.
  Status reap_sends(bool all);
  Status sum_tied_grads();
  void load_stash(int v, int ph, Executor& ex, int slot, int wslot);
  int take_slot(std::vector<int>& free);

  std::unique_ptr<PipelineProgram> owned_;  // create()'s with ownership; else null
  const Graph& model_;
  const PipelineProgram& pp_;
  MeshComms& comms_;
  Communicator* pipe_ = nullptr;  // the pipeline axis's group: local rank = stage
  int stage_ = 0;
  SharedArena arena_;
  std::vector<std::unique_ptr<StepRunner>> chunks_;
  // Stash slots: stage_stash_bytes split into in_flight forward slots and weight_in_flight
  // weight slots; (v, micro-batch) -> slot while in flight.
  std::vector<Buffer> slots_, wslots_;  // stash slots in the backend's memory
  std::vector<int> free_slots_, free_wslots_;
  std::map<std::pair<int, int>, int> slot_of_, wslot_of_;
  std::vector<std::vector<int64_t>> offsets_;  // per local chunk: each stash entry's slot offset
  // p2p: receives posted ahead, keyed by (forward?, v, micro-batch); sends in flight, oldest
  // first, each in a buffer of its pool (0: activations, 1: gradients).
  std::map<std::tuple<bool, int, int>, std::unique_ptr<Message>> recvs_;
  struct SendPool {
    std::vector<std::vector<float>> buffers;
    std::vector<int> free;
  };
  SendPool send_pools_[2];
  struct Send {
    int pool, buffer;
    int64_t bytes;
    Request req;
  };
  std::vector<Send> sends_;
  // Waits for send `it`, returns its buffer to its pool; the send after it.
  Result<std::vector<Send>::iterator> retire(std::vector<Send>::iterator it);
  int64_t p2p_bytes_ = 0, p2p_high_water_ = 0;
  const Feed* feed_ = nullptr;  // forward_backward's or evaluate's, during the call
  double loss_sum_ = 0;
  // Tied parameters: (local chunk, parameter index) and the model chunks holding each, in order.
  struct Tied {
    int v;
    size_t param;
    std::vector<int> holders;  // model chunks, ascending
  };
  std::vector<Tied> tied_;
};

}  // namespace tessera
