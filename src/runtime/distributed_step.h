// One optimizer step of a Program on one rank of a distributed run: the counterpart of
// TrainStep (train_step.h) for any data-axis Plan — DP, ZeRO-1/2/3, FSDP, HSDP.
//
//   TS_ASSIGN_OR_RETURN(MeshComms comms, MeshComms::create(*world, plan));
//   TS_ASSIGN_OR_RETURN(auto step, DistributedStep::create(model.graph, plan, cpu, comms, adamw));
//   step->init_params(seed);                          // same model as a 1-rank run
//   for (micro...) TS_ASSIGN_OR_RETURN(float loss, step->forward_backward(x, y));  // local rows
//   TS_ASSIGN_OR_RETURN(double norm, step->apply(lr, clip, micro_steps));
//
// forward_backward executes the Program's micro_step instructions: compute on the backend,
// collectives started on the comm stream when their input is ready and waited for before
// their first reader; the reduced gradients are accumulated in persistent buffers (whole or
// this rank's block). apply() executes the `optimizer` instructions. The loss returned is
// the global micro-batch loss (all-reduced), the same on every rank.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "parallel/program.h"
#include "runtime/executor.h"
#include "runtime/optimizer.h"

namespace tessera {

// The communicators of a plan's rank groups, keyed by the comma-joined axes of the group
// ("dp", "dp_rep,dp_shard"), split from the world communicator.
class MeshComms {
 public:
  static Result<MeshComms> create(Communicator& world, const Plan& plan);
  Communicator& world() const { return *world_; }
  // The group spanned by `axes` (a comma-joined list) that this rank belongs to.
  Communicator& group(const std::string& axes) const;
  // Bytes sent by this rank over all groups (and the world) since the last reset.
  int64_t bytes_sent() const;
  void reset_stats();
  void set_timeout(double seconds);

 private:
  Communicator* world_ = nullptr;
  std::map<std::string, std::shared_ptr<Communicator>> groups_;
};

// What this rank holds of one parameter tensor: elements [offset, offset + count) of its
// flattened local piece (ParamLayout::local_shape: the whole tensor unless a tensor axis
// shards it; the whole piece unless ZeRO shards it).
struct LocalPiece {
  int64_t offset = 0, count = 0;
};

class DistributedStep {
 public:
  // `global` (the single-device training graph) must outlive the step.
  static Result<std::unique_ptr<DistributedStep>> create(const Graph& global, const Plan& plan,
                                                         Backend& backend, MeshComms& comms,
                                                         AdamWConfig opt);
  DistributedStep(const DistributedStep&) = delete;

  const Program& program() const { return prog_; }
  Executor& executor() { return *exec_; }
  AdamW& optimizer() { return *opt_; }
  MeshComms& comms() { return comms_; }
  int rank() const { return rank_; }

  void init_params(uint64_t seed);
  // tokens/targets: this rank's rows of the global micro-batch.
  Result<float> forward_backward(const int32_t* tokens, const int32_t* targets);
  Result<double> apply(double lr, double clip, int micro_steps);

  // Parameter i as stored here: pointer to its local piece and where that piece lies.
  float* param_data(size_t i);
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
  // micro-step took, in place (indexed like program().micro_step; others stay 0).
  void time_instructions(std::vector<double>* seconds) { instruction_seconds_ = seconds; }
  // Bytes this rank allocated for parameters, accumulated gradients and AdamW moments (what
  // Program::persistent_bytes() predicts; counted from the buffers themselves).
  int64_t state_bytes_allocated();
  // Every rank receives every whole parameter (gathering ZeRO-3 blocks and tensor-parallel
  // pieces).
  Status gather_params(std::vector<std::vector<float>>* whole);

 private:
  DistributedStep(const Graph& global, Program prog, Backend& backend, MeshComms& comms,
                  AdamWConfig opt);
  Status run_instructions(const std::vector<Instruction>& list);
  Status start(const Node& n);
  Status sync_param(size_t i);
  LocalPiece block_of(size_t i) const;  // this rank's block in the ZeRO group
  // The tensor axes on which parameter i is Replicate.
  std::vector<std::string> replicated_tensor_axes(size_t i) const;
  // Whether no rank before this one holds the same piece of parameter i (ZeRO-sharded or not).
  bool first_holder(size_t i, bool zero_sharded) const;

  const Graph& global_;  // the caller keeps it alive
  Program prog_;
  MeshComms& comms_;
  int rank_ = 0;
  int zero_index_ = 0;
  std::unique_ptr<Executor> exec_;
  std::unique_ptr<AdamW> opt_;
  std::vector<std::vector<float>> grads_;  // accumulated reduced gradients (whole or block)
  std::map<NodeId, Request> inflight_;
  std::vector<float> scratch_;  // padded all-gather staging for ZeRO-1/2 parameter sync
  int accumulated_ = 0;
  std::vector<double>* instruction_seconds_ = nullptr;
};

}  // namespace tessera
