// The step runner: one optimizer step of a Program on one rank of any plan — one process
// (a mesh of size 1), data parallelism, ZeRO-1/2/3, FSDP, HSDP, tensor and sequence
// parallelism, recomputation — the only class that executes a training step.
//
//   TS_ASSIGN_OR_RETURN(MeshComms comms, MeshComms::create(world, plan));  // or ::single(plan)
//   TS_ASSIGN_OR_RETURN(auto step, StepRunner::create(model.graph, plan, cpu, comms, adamw));
//   step->init_params(seed);                          // the same model on any plan
//   for (int k = 0; k < plan.micro_batches; ++k)
//     TS_ASSIGN_OR_RETURN(float loss, step->forward_backward(Feed(model, {x, y})));  // rows
//   TS_ASSIGN_OR_RETURN(double norm, step->apply(lr, clip));
//
// forward_backward executes the Program's micro_step instructions: compute on the backend,
// collectives started on the comm stream when their input is ready and waited for before
// their first reader. With one micro-batch per step the optimizer reads the reduced gradients
// where the micro-step left them (in the arena); with more they are accumulated in persistent
// buffers (whole or this rank's block). apply() executes the `optimizer` instructions: the
// gradient norm (each element counted once, summed over Plan::grad_norm_axes()), clipping
// folded into AdamW, ZeRO-1/2 parameter syncs. The loss returned is the global micro-batch
// loss (all-reduced), the same on every rank.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "parallel/program.h"
#include "runtime/executor.h"
#include "runtime/feed.h"
#include "runtime/mesh_comms.h"
#include "runtime/optimizer.h"
#include "runtime/step_trace.h"

namespace tessera {

struct ChunkProgram;  // parallel/pipeline_program.h
struct LinkQueue;     // step_runner.cc: an offloaded optimizer's copies to the device

// What this rank holds of one parameter tensor: elements [offset, offset + count) of its
// flattened local piece (ParamLayout::local_shape: the whole tensor unless a tensor axis
// shards it; the whole piece unless ZeRO shards it).
struct LocalPiece {
  int64_t offset = 0, count = 0;
};

class StepRunner {
 public:
  // `global` (the single-device training graph) must outlive the step.
  static Result<std::unique_ptr<StepRunner>> create(const Graph& global, const Plan& plan,
                                                    Backend& backend, MeshComms& comms,
                                                    AdamWConfig opt);
  // One model chunk of a pipeline stage (runtime/pipeline_runner.h drives it): `chunk` (which
  // must outlive the runner) runs phase by phase (run_phase) on executors that share `arena`,
  // the forward's holding the parameters. `model` is the whole model's training graph:
  // parameters start from the model's values (init_params), whatever the cut.
  static Result<std::unique_ptr<StepRunner>> create_chunk(const Graph& model,
                                                          const ChunkProgram& chunk,
                                                          Backend& backend, MeshComms& comms,
                                                          AdamWConfig opt, SharedArena arena);
  StepRunner(const StepRunner&) = delete;
  ~StepRunner();

  const Program& program() const { return prog_; }
  Executor& executor() { return *exec_; }
  AdamW& optimizer() { return *opt_; }
  // Where the f32 master weights (param_storage) and AdamW's moments live: the backend's
  // memory, or host memory when the plan offloads the optimizer (Plan::offload; the runner's
  // own CPU backend then runs AdamW on the host's cores).
  Backend& state_backend() { return host_ ? *host_ : exec_->backend(); }
  MeshComms& comms() { return comms_; }
  int rank() const { return rank_; }

  void init_params(uint64_t seed);
  // `feed`: this rank's rows of the global micro-batch of every model input. A micro-step of
  // compute alone (one rank, no collectives; not fp16) on a backend that records
  // (Backend::record: a CUDA graph) runs eagerly once, is recorded the second time and
  // replayed from then on, unless set_record_steps(false).
  Result<float> forward_backward(const Feed& feed);
  // The program's metrics (Partitioned::metrics) summed over the forward_backward calls since
  // the last take; then zero.
  std::vector<std::pair<std::string, double>> take_metrics();
  void set_record_steps(bool on) { record_steps_ = on; }
  // When set, each instruction run (compute, and the waits for collectives) and each apply()
  // is added to `trace` as a span on its compute track (runtime/step_trace.h); a traced
  // micro-step runs eagerly. Null: none.
  void set_trace(StepTrace* trace) { trace_ = trace; }
  // After plan.micro_batches forward_backward calls: averages the gradients over them, clips
  // to `clip` (<= 0: no clipping) and steps AdamW with lr. Returns the pre-clip norm.
  Result<double> apply(double lr, double clip);

  // fp16 graphs: dynamic loss scaling. The backward pass's seed is the scale (2^16 to start),
  // the optimizer divides it out; a step whose gradients overflow is skipped (no update,
  // apply() returns 0) and halves the scale, and kLossScaleGrowth good steps in a row double
  // it. loss_scale() is 0 for f32 and bf16 graphs. A pipeline's chunks each seed their own
  // loss with it and keep it in step: PipelineRunner::apply calls take_loss_scale on each.
  static constexpr int64_t kLossScaleGrowth = 2000;
  double loss_scale() const { return loss_scale_; }
  int64_t loss_scale_good_steps() const { return good_steps_; }
  bool step_skipped() const { return skipped_; }
  void set_loss_scale(double scale, int64_t good_steps) {
    loss_scale_ = scale;
    good_steps_ = good_steps;
  }
  // fp16, once per step with the squared sum of the scaled gradients (the same on every
  // rank): the scale they carry, or 0 when they overflowed (the step is skipped and the scale
  // halved); the scale doubles for the next step after kLossScaleGrowth good ones.
  double take_loss_scale(double sq);

  // Chunk runners: phase ph's instructions on its executor; then, after the phase computing
  // them, this micro-batch's gradients added to the accumulators; then finish_micro_batch().
  Status run_phase(int ph);
  Executor& phase_executor(int ph) { return ph == 0 ? *exec_ : *phase_execs_[size_t(ph) - 1]; }
  void accumulate_phase_grads(int ph);
  // Chunk runners, after a training phase: the metrics it computed added to take_metrics' sums
  // (the last chunk's: a metric summed over the blocks is finished there).
  void add_phase_metrics(int ph);
  // Chunk runners, once per step after the last micro-batch: runs the reduce phase
  // (ChunkProgram::reduce_phase) on the unreduced gradients accumulate_phase_grads summed, and
  // takes its reduced gradients as the step's. Collective over the data and tensor axes.
  Status reduce_grads();
  void finish_micro_batch() { ++accumulated_; }
  // The accumulated gradient of parameter i in the backend's memory (its local piece; chunk
  // runners and plans with several micro-batches).
  float* grad_data(size_t i) { return grads_[i].data; }
  // apply() in two parts, for a pipeline stage whose gradient norm spans its chunks: the
  // gradients averaged over the micro-batches and their squared sum (all-reduced over
  // Plan::grad_norm_axes()); then AdamW with the gradients scaled by clip_coefficient, and the
  // ZeRO-1/2 parameter syncs.
  Result<double> grad_sq_sum();
  Status step(double lr, double clip_coefficient);
  // Parameter i's gradient is not counted in the norm (a tied copy counted by another stage).
  void exclude_from_norm(size_t i) { opt_->set_norm_weight(i, 0); }

  // Evaluation under the same plan: `eval_global` (the loss-mode graph of the same model and
  // global batch; it must outlive the runner) is lowered like the training graph, and its
  // executor reads this rank's parameter pieces in place, with an arena of its own.
  Status add_evaluation(const Graph& eval_global);
  // The global loss of one evaluation batch (`feed`: this rank's rows), the same on every
  // rank. Collective; after add_evaluation.
  Result<float> evaluate(const Feed& feed);
  Executor* eval_executor() { return eval_exec_.get(); }

  // Parameter i as stored here: pointer to its local piece (f32: the master weights of a
  // bf16/f16 graph, or of an offloaded optimizer, whose working copy refresh_working_params()
  // writes) and where it lies. A host pointer: state in host memory only (it checks).
  float* param_data(size_t i);
  // The same in state_backend()'s memory, for any backend (HostStaging gives host views of it).
  float* param_storage(size_t i);
  // Parameter i's local piece (param_piece(i).count f32 values, the master weights of a
  // bf16/f16 graph) copied to the host: any backend.
  std::vector<float> read_param(size_t i);
  // After writing master weights through param_data (a checkpoint read): updates the graph's
  // bf16/f16 working copy of every parameter (nothing for f32 graphs; with the optimizer
  // offloaded, every parameter's device copy). With all = false only those the optimizer's
  // update does not write itself (after a step's parameter syncs).
  void refresh_working_params(bool all = true);
  LocalPiece param_piece(size_t i) const;
  // AdamW moments of parameter i cover optim_piece(i).
  LocalPiece optim_piece(size_t i) const;
  // Where parameter i's local piece lies in the global tensor: the whole tensor unless a
  // tensor axis shards it. param_piece / optim_piece index this box's row-major order.
  Box param_box(size_t i) const;
  // Whether this rank writes parameter i (its AdamW moments) into a checkpoint: the first of
  // the ranks that hold the same piece does, so each element is written once.
  bool writes_param(size_t i) const { return first_holder(i, prog_.part.params[i].params_sharded); }
  bool writes_optim(size_t i) const { return first_holder(i, prog_.part.params[i].optim_sharded); }
  // When set, forward_backward() records the seconds each compute instruction of the
  // micro-step took, in place (indexed like program().micro_step; others stay 0): the
  // backend's WorkTimer, device time on a device (the micro-step then runs eagerly).
  void time_instructions(std::vector<double>* seconds) { instruction_seconds_ = seconds; }
  // Bytes this rank allocated for parameters, accumulated gradients and AdamW moments in the
  // backend's memory (what Program::persistent_bytes() predicts; counted from the buffers
  // themselves), and in host memory for an offloaded optimizer (Program::host_bytes).
  int64_t state_bytes_allocated();
  int64_t host_state_bytes_allocated();
  // Every rank receives every whole parameter (gathering ZeRO-3 blocks and tensor-parallel
  // pieces).
  Status gather_params(std::vector<std::vector<float>>* whole);

 private:
  StepRunner(const Graph& global, Program prog, Backend& backend, MeshComms& comms, AdamWConfig opt,
             const ChunkProgram* chunk = nullptr, SharedArena arena = {});
  // The value holding parameter i in the forward executor's graph.
  ValueId param_value(size_t i) const;
  int64_t grad_count(size_t i) const { return grads_[i].count; }
  // Runs `list` (instructions of ex's graph) on ex.
  Status run_instructions(const std::vector<Instruction>& list, Executor& ex);
  // Whether v (computed on ex) is a loss seed: the value an fp16 backward pass starts from.
  bool is_loss_seed(const Executor& ex, ValueId v);
  // The micro-step's instructions, eagerly or replayed (forward_backward).
  Status run_micro_step();
  Result<double> apply_body(double lr, double clip);  // apply() but for its trace span
  Status start(const Node& n, Executor& ex);
  Status sync_param(size_t i);
  // Offloaded optimizer: gradient i's optimizer block to the host (widened to f32), and the
  // updated master piece i back to the device in the parameter's dtype.
  void grad_to_host(size_t i);
  // (`staging`: the host buffer a bf16/f16 piece is narrowed in, the calling thread's own.)
  void param_to_device(size_t i, std::vector<uint8_t>& staging);
  // Plan::offload params: where this rank's block of a host-held parameter goes in the output
  // of the all-gather `gather` (the communicator gathers in place), and the block copied there
  // (Instruction::param_fetch).
  void* gather_slot(const Node& gather, Executor& ex);
  void fetch_param(const Node& gather, Executor& ex);
  LocalPiece block_of(size_t i) const;  // this rank's block in the ZeRO group
  // The tensor axes (and the expert axis) on which parameter i is Replicate: where the
  // gradient norm's group holds copies of its elements.
  std::vector<std::string> replicated_tensor_axes(size_t i) const;
  // Whether no rank before this one holds the same piece of parameter i (ZeRO-sharded or not).
  bool first_holder(size_t i, bool zero_sharded) const;

  const Graph& global_;  // the caller keeps it alive
  Program prog_;
  MeshComms& comms_;
  int rank_ = 0;
  int zero_index_ = 0;
  std::unique_ptr<Executor> exec_;  // chunk runners: the forward phase's
  const ChunkProgram* chunk_ = nullptr;
  std::vector<std::unique_ptr<Executor>> phase_execs_;  // chunk runners: the later phases
  std::vector<size_t> model_index_;  // parameter i is the model's parameter model_index_[i]
  // Plan::offload optimizer: host memory and the host's AdamW (declared before every buffer
  // allocated from it, so that it outlives them).
  std::unique_ptr<Backend> host_;
  std::unique_ptr<AdamW> opt_;
  bool one_pass_update_ = false;  // the optimizer list is AdamW::update_all
  size_t norm_index_ = 0;         // the optimizer list's grad_norm
  // Plan::offload optimizer: the gradients' f32 copies in host memory (the master weights are
  // masters_, AdamW's moments opt_'s); where each gradient block is on the device;
  // and a staging buffer for values converted between f32 and their stored dtype.
  std::vector<Buffer> host_grads_;
  // Plan::offload params: the bf16/f16 blocks of host-held parameters in host memory, which
  // AdamW writes and param_fetch copies (empty for f32 ones, whose master is the block); and
  // each parameter's index by name (an evaluation graph's gathers fetch them too).
  std::vector<Buffer> host_params_;
  std::map<std::string, size_t> param_index_;
  std::vector<void*> pinned_;  // host buffers the device backend pinned (unpinned before freed)
  // Plan::offload optimizer: step() hands each updated piece's copy to the device to this
  // thread and goes on with the next parameter's AdamW (the Program's link stream), and waits
  // for the copies before it returns.
  std::unique_ptr<LinkQueue> link_;
  std::vector<uint8_t> link_staging_;  // the link thread's
  struct DeviceGrad {
    const void* data = nullptr;
    DType dtype = DType::f32;
    int64_t count = 0;
  };
  std::vector<DeviceGrad> device_grads_;
  std::vector<uint8_t> staging_;
  std::unique_ptr<Program> eval_prog_;  // add_evaluation's
  std::unique_ptr<Executor> eval_exec_;
  // An f32 gradient sum: in a buffer of its own, or (a chunk runner's) in grad_pool_ at the
  // chunk's offset (ChunkProgram::grad_pool_bytes).
  struct GradSum {
    Buffer own;
    float* data = nullptr;
    int64_t count = 0;
  };
  // Persistent state in the backend's memory. Accumulated reduced gradients (f32, whole or
  // block); none with one micro-batch per step unless a chunk runner.
  std::vector<GradSum> grads_;
  Buffer grad_pool_;
  // Mixed precision (bf16/f16 parameters): the f32 master weights of parameter i (empty for
  // f32 parameters, which the optimizer updates in place). With the optimizer offloaded, every
  // parameter's, in host memory.
  std::vector<Buffer> masters_;
  // Collectives in flight: the communicator each was issued on, and its request.
  struct InFlight {
    Communicator* comm = nullptr;
    Request request, send;        // send: a ring_shift's, beside its receive
    std::vector<Request> pieces;  // a segmented collective's other pieces (GroupAttrs::segments)
  };
  std::map<NodeId, InFlight> inflight_;
  // Collectives of bf16/f16 values in flight: their f32 staging and where the result goes.
  struct Staged {
    std::vector<float> in, out;
    void* dst = nullptr;
    DType dtype = DType::f32;
  };
  std::map<NodeId, Staged> staged_;
  std::vector<float> scratch_;  // padded all-gather staging for ZeRO-1/2 parameter sync
  int accumulated_ = 0;
  std::vector<double> metric_sums_;  // per Partitioned::metrics
  double loss_scale_ = 0;            // fp16 only
  int64_t good_steps_ = 0;           // steps since the scale last changed
  bool skipped_ = false;
  std::vector<char> grad_started_;  // chunk runners: parameter i has a gradient this step
  // Chunk runners: per stash entry into the reduce phase, its sum over this step's
  // micro-batches (empty for other entries), and whether a micro-batch has written it.
  std::vector<GradSum> unreduced_;
  std::vector<char> unreduced_started_;
  std::vector<double>* instruction_seconds_ = nullptr;
  StepTrace* trace_ = nullptr;
  // The micro-step as one Recording (see forward_backward), after one eager run.
  bool record_steps_ = true;
  bool recordable_ = false;  // compute instructions only, no host writes between them
  bool ran_eagerly_ = false;
  std::unique_ptr<Recording> recorded_step_;
};

}  // namespace tessera
