// The planner: chooses the parallel configuration of a training run from the cost model. It
// enumerates plans — data parallelism with ZeRO-1, 2 or 3, or HSDP (ZeRO-3 within groups of 1,
// 2 or 4 nodes, replicated across them), tensor parallelism within a node
// (with or without sequence parallelism), pipeline stages with their schedules, context
// parallelism (language models: groups of 2, 4, ... ranks, LLaMA's in zigzag order; from
// 32K-token sequences each with its keys and values gathered and passed round in a ring),
// expert parallelism (mixtures of experts, without a pipeline), the
// micro-batch size, recomputation and, where the cluster spec gives its host side, offloading
// the optimizer to host memory (not with a pipeline) — for a model, a cluster, a device count and a
// global batch; prunes those that cannot fit or cannot beat the best found (analytic bounds,
// below); and times the rest with the simulator on the Program each would execute. Memory is a hard
// constraint: a plan whose simulated peak exceeds the device is never returned.
//
//   PlannerOptions o;  o.gpus = 1024;  o.global_batch = 1536;  o.seq = 2048;
//   TS_ASSIGN_OR_RETURN(PlanSearch s, search_plans(gpt3_175b, dgx_a100, o));
//   s.best[0].plan;  s.best[0].sim.step_seconds;   // fastest first
//
// Pruning. Per candidate, before lowering anything:
//   memory bound  the state this rank must hold at least: N / (tp x pp) parameters with their
//                 f32 master, bf16 copy, AdamW moments and (over several micro-batches, or
//                 with a pipeline) f32 gradient accumulator, ZeRO dividing what it shards by
//                 dp; then, with the activations: what each block keeps from its forward pass
//                 for its backward (the tp rank's graph under the candidate's recomputation)
//                 times the blocks and the micro-batches in flight (one without a pipeline;
//                 with one, the schedule's own count per stage, the blocks spread over the
//                 stages as evenly in bytes as possible). A candidate above the device is
//                 dropped. A pipeline candidate's first stage (the most in flight) is then
//                 lowered alone before the whole plan is simulated, and its exact peak drops
//                 the candidate when that stage alone does not fit;
//   time bound    a tensor-parallel rank's compute stream for one micro-batch (the ops of the
//                 graph it executes under the candidate's placements, sequence parallelism and
//                 recomputation, timed by the cost model, with the waits on its tensor-parallel
//                 collectives in both passes, each collective started when its input is ready
//                 and never queued; on models of one and two blocks, multiplied out to the
//                 depth); without a pipeline, each micro-batch takes at least that or its
//                 data-parallel collectives' time (one per parameter tensor, latencies
//                 included; ZeRO-3 gathers twice), plus adding up the micro-batches'
//                 gradients; with one, the compute over pp stages (or the ceil(L / pp) blocks
//                 some stage holds, whichever is more), times the micro-batches, stretched by
//                 the schedule's ideal bubble ((p - 1) / m for 1F1B, divided by V interleaved,
//                 times (1 + F/t) / 2 under zb-h1 with F/t the forward's share of a
//                 micro-batch: its W is at most half of the rest); plus AdamW's pass over this
//                 rank's share of the state at the optimizer's bandwidth; less 5%.
// Candidates are simulated in order of their time bound; the search stops when the next bound
// is no faster than the K-th fastest fitting plan found. A pipeline candidate's turn first
// replays its schedule on bounds of its chunks' times (pipeline_schedule_bound): one that
// cannot beat the K-th plan then is not simulated. A test checks on every simulated
// candidate that the bounds stay below the simulator's figures, and that the pruned search
// finds the exhaustive search's best plans.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cost/cluster_spec.h"
#include "models/model.h"
#include "parallel/pipeline_stages.h"
#include "parallel/plan.h"
#include "sim/simulator.h"

namespace tessera {

struct PlannerOptions {
  int gpus = 8;
  int64_t global_batch = 0;  // sequences per optimizer step (0: one per device)
  int64_t seq = 0;           // tokens per sequence (0: the model's max_seq_len)
  DType precision = DType::bf16;
  bool fp8 = false;  // with bf16: the blocks' GEMMs in FP8 (SimOptions::fp8)
  int top_k = 5;
  int threads = 0;           // candidates simulated at once (0: every core)
  int max_micro_batch = 16;  // sequences per rank per micro-batch, at most
};

struct PlanCandidate {
  Plan plan;
  int64_t micro_batch = 1;  // sequences per data-parallel rank per micro-batch
  double memory_bound = 0;  // bytes per device, the analytic lower bound
  double time_bound = 0;    // seconds per step, the analytic lower bound
  // A pipeline's first stage (the most micro-batches in flight) lowered alone before the whole
  // plan is: its exact peak bytes per device, another lower bound (0 until checked).
  double first_stage_bytes = 0;
  // A pipeline's schedule replayed on lower bounds of its chunks' times (pipeline_schedule_bound),
  // computed when the candidate's turn to be simulated comes: a tighter time bound that may
  // spare the simulation (0 until computed, or when there is none).
  double schedule_bound = 0;
  bool simulated = false;
  SimResult sim;      // when simulated
  std::string error;  // lowering or simulation failed (then not simulated)
  bool beyond_memory(double device_bytes) const {  // by a bound, simulated or not
    return memory_bound > device_bytes || first_stage_bytes > device_bytes;
  }
  bool host_fits = true;  // an offloaded optimizer's state fits the node's host memory
  bool fits(double device_bytes) const {
    return simulated && host_fits && sim.peak_memory_bytes <= device_bytes;
  }
  // "tp=8 pp=8 dp=16 zero=1 mb=1x96 1f1b rc=full" — every knob the planner sets.
  std::string describe() const;
};

struct PlanSearch {
  std::vector<PlanCandidate> best;  // fitting, fastest first, at most top_k
  int enumerated = 0;               // plans in the search space
  int pruned_by_memory = 0;         // dropped by a memory bound (or the first stage's peak)
  int simulated = 0;                // lowered and timed
  int failed = 0;                   // could not be lowered (reason in the candidate)
  double seconds = 0;               // the search's wall time (the space's creation included)
  // Every simulated candidate (best first among those that fit), for explanations and tests.
  std::vector<PlanCandidate> all;
};

// The search space of one model, cluster and options: every candidate within the memory bound
// with its bounds, fastest bound first, and the simulations run so far — shared by the searches
// made on it (the top K, then each of --explain's alternatives), so no candidate is simulated
// twice.
class PlanSpace {
 public:
  // Enumerates and bounds the candidates. Errors: bad options, and no plan splitting the batch.
  static Result<std::unique_ptr<PlanSpace>> create(const ModelConfig& cfg,
                                                   const ClusterSpec& cluster,
                                                   const PlannerOptions& opt);
  ~PlanSpace();

  using Filter = std::function<bool(const PlanCandidate&)>;
  // The k fastest candidates that fit in memory among those `keep` accepts (every one when keep
  // is empty), fastest first. Simulates those not yet simulated in order of their time bound,
  // on opt.threads threads, until no bound left can beat the k-th fitting plan found.
  std::vector<const PlanCandidate*> fastest(int k, const Filter& keep = nullptr);

  const std::vector<PlanCandidate>& candidates() const;  // within the memory bound
  const ModelConfig& model() const;
  const ClusterSpec& cluster() const;
  const PlannerOptions& options() const;  // with seq and global_batch resolved
  int enumerated() const;
  int pruned_by_memory() const;
  int failed_bounds() const;             // candidates whose bound could not be computed
  double smallest_memory_bound() const;  // over the candidates the memory bound dropped
  double create_seconds() const;         // enumerating and bounding

 private:
  struct Impl;
  explicit PlanSpace(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The search. Errors: bad options (named), and no plan fitting in memory — one paragraph with
// the smallest memory any candidate needs and what would make it fit.
Result<PlanSearch> search_plans(const ModelConfig& cfg, const ClusterSpec& cluster,
                                const PlannerOptions& opt);
// The same on a space already created (which then keeps its simulations for explain_best).
Result<PlanSearch> search_plans(PlanSpace& space);

// The bounds of one candidate (see above).
// Bytes a rank holds per parameter of its share: the f32 master (in f32 the parameter itself,
// which ZeRO-3 shards; under mixed precision optimizer state, which ZeRO-1 and up shard), AdamW's
// two moments (ZeRO-1 and up), the low-precision parameter (ZeRO-3), the f32 gradient
// accumulated over micro-batches (ZeRO-2 and up).
// Offloaded (Plan::offload), the master and the moments leave the device: it keeps the
// parameter it computes with and the accumulator; host_bytes_per_param is then what each rank
// holds in host memory per parameter of its share (the f32 master of its piece, the moments
// and an f32 copy of the gradient of its block). With the parameters offloaded too (ZeRO-3)
// the device keeps only the accumulator, and the host the low-precision blocks besides.
double state_bytes_per_param(const Plan& plan, DType precision);
double host_bytes_per_param(const Plan& plan, DType precision);
double plan_memory_bound(const ModelConfig& cfg, const Plan& plan, DType precision);
// The parameters one rank holds a piece of, at most: the model's over the tensor and pipeline
// ranks, its experts' over the expert-parallel ranks too.
double params_per_rank(const ModelConfig& cfg, const Plan& plan);
// The state's bound with the activations: a rank keeps `saved_per_block` bytes of each of its
// blocks per micro-batch in flight (the schedule's count), besides `state_per_block` bytes of
// each block's state (see planner.cc for the pipeline's arithmetic).
double with_activations(const Plan& plan, double state_bound, double state_per_block,
                        double saved_per_block, int64_t blocks);
// AdamW's pass over this rank's share of the state.
double optimizer_time_bound(const ModelConfig& cfg, const ClusterSpec& cluster, const Plan& plan);
// The same with the optimizer offloaded: the gradient blocks over the host link and the norm's
// pass on the host, then the host's AdamW and the ZeRO-1/2 syncs (`sync_seconds`,
// param_sync_time_bound) beside the parameters' copies back (the runner's link thread); with
// the parameters offloaded, each micro-batch's copies of the blocks in for the forward pass's
// gathers (on the compute stream, as the runner copies them).
double offload_time_bound(const ModelConfig& cfg, const ClusterSpec& cluster, const Plan& plan,
                          DType precision, double sync_seconds);
// A tensor-parallel rank's compute stream for one micro-batch of the whole model, as the
// simulator runs it with its tensor-parallel collectives never queued behind one another: the
// ops' time and the waits of both passes on collectives whose input came late (what the
// forward pass's all-reduce before the residual add costs, and the backward's); the forward
// pass's part of it; one block's (0 when the blocks differ, as T5's); and the waits among
// them, all and the forward pass's (zb-h1's bubble is bounded on the ops alone).
// With context parallelism, the seconds of the collectives over the context axis too, one after
// another (its comm stream is busy that long).
struct MicroBatchTime {
  double seconds = 0, forward_seconds = 0, block_seconds = 0;
  double wait_seconds = 0, forward_wait_seconds = 0;
  double context_comm_seconds = 0;
};
// Parameter tensors of one shape on a tensor-parallel rank, the unit of the data-parallel
// collectives (one per tensor): the local elements, whether the backward pass reads them
// (ZeRO-3 then gathers them a second time), whether the tensor axis splits them (a replicated
// one reduces its gradient over the tensor axis as well, possibly as one collective over both),
// and how many of the model's tensors are like this.
// An expert-stacked tensor (SourceAttrs::experts) is split over the expert axis as well, and its
// gradient is not reduced over that axis.
struct ParamTensors {
  int64_t elems = 0;
  bool read_backward = false, tp_split = false;
  double count = 0;
  bool experts = false;
};
// A lower bound on the seconds the busiest data-parallel comm stream is busy for one
// micro-batch (pipelines: for the step's one reduction, averaged over the stages): a
// collective per tensor timed by the simulator's collective model with its latencies —
// the gradient's all-reduce, or under ZeRO-2/3 its reduce-scatter (HSDP: then the replicas'
// all-reduce of the block, on that group's own stream), and ZeRO-3's gathers before the
// forward and the backward pass's reads. 0 without data parallelism.
double data_comm_time_bound(const std::vector<ParamTensors>& params, const ClusterSpec& cluster,
                            const Plan& plan, DType precision);
// A tensor-parallel rank's costs per transformer block of the whole model, for a pipeline's
// stages: FLOPs (what the runtime's cut balances: rank_layer_flops) and the compute stream's
// seconds of the forward and the backward pass (ops and tensor-parallel waits); and the local
// parameter elements one block adds (its gradient is added up after each micro-batch).
struct PipelineCosts {
  LayerCosts flops, forward, backward;
  double block_param_elems = 0;
};
// The pipeline's step at least: the stages cut as the runtime cuts them (balance_stages on the
// FLOPs), each chunk's forward and backward from its blocks' seconds (plus its gradients'
// accumulation), the schedule replayed on them (time_schedule; zb-h1: the busiest stage's
// work, as its W may fill any bubble), then the optimizer — or the data-parallel comm stream's
// time — less 5%. 0 when the costs are missing or the plan has no pipeline.
double pipeline_schedule_bound(const Plan& plan, const PipelineCosts& costs,
                               const ClusterSpec& cluster, double optimizer_seconds,
                               double comm_seconds);
// Seconds ZeRO-1/2's gathers of the updated parameters take after AdamW (the simulator runs
// each after its tensor's update, before the next one): one all-gather per tensor (pipelines:
// the average stage's share). 0 for other plans.
double param_sync_time_bound(const std::vector<ParamTensors>& params, const ClusterSpec& cluster,
                             const Plan& plan, DType precision);
// Seconds per step the gradients of several micro-batches take to add up (the simulator's
// accumulate_grads: the first copies, later ones read both and write one, at the optimizer's
// bandwidth): the whole step's without a pipeline, one micro-batch's with one. 0 for one
// micro-batch.
double accumulate_time_bound(const std::vector<ParamTensors>& params, const ClusterSpec& cluster,
                             const Plan& plan);
// The step's bound. Without a pipeline every micro-batch ends when its compute and its
// collectives have (the simulator adds its gradients up after both), then the optimizer:
// m x max(compute, data comm) + accumulation + optimizer. With one: the compute of its
// micro-batches with the pipeline's idle share plus the optimizer, or the step's reduction,
// whichever is larger (`accumulate_seconds` is then one micro-batch's, added to its compute).
double plan_time_bound(const Plan& plan, const MicroBatchTime& t, int64_t blocks,
                       double optimizer_seconds, double comm_seconds = 0,
                       double accumulate_seconds = 0);

}  // namespace tessera
