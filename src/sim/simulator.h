// The simulator: times the Program the runtime executes (DESIGN.md "The one idea") on a
// ClusterSpec. One representative rank's instruction streams are replayed as a discrete-event
// schedule: the compute stream runs compute instructions in order; each rank group's comm
// stream (one per communicator, as in the runtime) runs that group's collectives from their
// start instructions, in issue order; a wait blocks the compute stream
// until its collective ends; every instruction also waits for its dependencies. The
// micro-step runs plan.micro_batches times, then the optimizer instructions.
//
//   TS_ASSIGN_OR_RETURN(Program prog, lower(model.graph, plan));
//   TS_ASSIGN_OR_RETURN(SimResult r, simulate(prog, cluster, SimOptions{}));
//   r.step_seconds;  r.tokens_per_second;  r.mfu;  r.peak_memory_bytes
//   write_file("trace.json", chrome_trace(r));   // chrome://tracing or ui.perfetto.dev
//
// Precision: the Program is f32 (what the CPU runtime executes). SimOptions::precision bf16
// times it as mixed precision: compute at the bf16 peak, activations and collectives in bf16
// (2 bytes), an fp32 master copy of parameters and fp32 AdamW state; the memory estimate
// scales the planned activation arena and gradients accordingly.
//
// Breakdown of a step (they sum to step_seconds):
//   compute_seconds        time the compute stream is busy
//   exposed_comm_seconds   time the compute stream waits on a collective
//   bubble_seconds         pipeline bubble: the critical stage idle inside the schedule
//   offload_seconds        Plan::offload: the device idle while its optimizer runs on the host
//                          (gradients out over the host link, the norm and AdamW on the node's
//                          CPUs at their share of its memory bandwidth, on a stream "host";
//                          each updated piece back on a stream "host link" beside the next
//                          updates, as the runner's link thread copies them), and with the
//                          parameters offloaded the blocks' copies in for their gathers (on the
//                          compute stream, as the runner copies them)
//
// A pipeline (PipelineProgram, parallel/pipeline_program.h) is timed per chunk: one micro-batch
// of each chunk's Program gives its forward and backward seconds (the backward split into
// input- and weight-gradient parts by the nodes' share for zb-h1), the schedule is replayed on
// them with a point-to-point transfer between stages (time_schedule), and each stage then
// reduces its gradients over the data axes once, sums tied parameters' gradients with the
// stage holding their other copy, and runs its optimizer. The step is the slowest stage's;
// the breakdown is that stage's; the trace has one thread per stage.
// Rank placement: ranks are numbered row-major over the mesh (the last axis varies fastest)
// and fill nodes of cluster.node.devices consecutively.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cost/cluster_spec.h"
#include "cost/collective_cost.h"
#include "cost/op_cost.h"
#include "parallel/program.h"
#include "parallel/sharding_search.h"

namespace tessera {

struct SimOptions {
  DType precision = DType::f32;  // f32, or bf16/f16 mixed precision
  // With bf16: the GEMMs in FP8 as Transformer Engine runs them (e4m3/e5m2 operands with
  // per-tensor scales, the activation operand cast in a pass of its own, bf16 output; an FP8
  // copy of each weight kept beside it), at DeviceSpec::peak_flops_fp8. Attention, norms and
  // everything else stay bf16.
  bool fp8 = false;
  CollAlgo algo = CollAlgo::automatic;
  bool trace = false;  // record events for chrome_trace()
  // Pipelines: each send between stages holds the sending stage until it is done, as the
  // frameworks whose stage-to-stage sends block do (DeepSpeed's pipeline engine:
  // framework_blocks_pipeline_sends). Tessera's runtime sends on its own and goes on computing
  // (false).
  bool blocking_p2p = false;
  // How attention runs: Tessera's fused kernel, or the kernels around a score matrix in memory
  // of the frameworks before FlashAttention (op_cost.h; framework_materializes_attention).
  AttentionKernel attention = AttentionKernel::fused;
  // Several micro-batches: each weight-gradient GEMM adds into the f32 gradient sums itself
  // (beta = 1, as Megatron's gradient-accumulation fusion does:
  // framework_fuses_grad_accumulation), so no pass adds the micro-batch's gradients afterwards.
  // Tessera's runtime runs that pass (false).
  bool fused_grad_accumulation = false;
  // With f16: each parameter's gradient sum over the micro-batches held in f16 (2 bytes), as
  // the frameworks that do so hold it (framework_sums_f16_gradients_in_f16), not in f32 as
  // Tessera's runtime does. Memory only.
  bool f16_gradient_sums = false;
  // A tensor-parallel collective chunked against the GEMM beside it, as Transformer Engine's
  // userbuffers run them (Megatron's --tp-comm-overlap): a reduce-scatter or all-reduce of a
  // GEMM's output may start with that GEMM, and the GEMM consuming an all-gather's output may
  // start before the gather ends, so the pair costs the step the longer of the two. Tessera's
  // runtime runs each collective after its producer and before its consumer (false).
  bool tp_comm_overlap = false;
  // ZeRO-1/2: the all-gathers of the updated parameters run beside the next step's forward
  // (Megatron's --overlap-param-gather), so the step waits only for the part that one
  // micro-batch's forward does not cover. Tessera's runtime waits for each sync (false).
  bool overlap_param_gather = false;
};

// The sharding search's figures for `plan` on `cluster`: its FLOP/byte ratio between tensor
// ranks, and the device's memory as the budget of the parameters' state of a rank holding
// `blocks` transformer blocks (its stage's) in `precision`.
SearchCost cluster_search_cost(const ClusterSpec& cluster, DType precision, const Plan& plan,
                               int64_t blocks);

// --precision: "f32", "bf16", "f16" (and their long names) or "fp8" (FP8 GEMMs beside bf16)
// into opt's precision and fp8; an error naming the choices otherwise.
Status parse_sim_precision(const std::string& name, SimOptions* opt);
// "fp8" for FP8 GEMMs, else the precision's dtype name.
const char* sim_precision_name(const SimOptions& opt);
// Whether the cluster's device runs opt's precision (a peak for it; FP8 beside bf16 only).
Status check_precision(const ClusterSpec& cluster, const SimOptions& opt);
// The peak the run's FLOPs are measured against (MFU): the FP8 peak for FP8 GEMMs.
double run_peak_flops(const DeviceSpec& dev, const SimOptions& opt);

struct TraceEvent {
  std::string name;                // "matmul h.3.mlp.fc", "all_gather h.4 params"
  std::string category;            // "compute", "comm", "optimizer"
  int stream = 0;                  // index into SimResult::streams (0: compute)
  double start = 0, duration = 0;  // seconds
};

struct SimResult {
  double step_seconds = 0;
  double compute_seconds = 0, exposed_comm_seconds = 0, bubble_seconds = 0;
  double comm_seconds = 0;       // busy time summed over the comm streams (overlapped or not)
  double optimizer_seconds = 0;  // part of compute_seconds spent in the optimizer
  // Offloaded optimizer: the exposed phase, and the host threads' and host link's busy time.
  double offload_seconds = 0, host_cpu_seconds = 0, host_link_seconds = 0;
  bool offloads_params = false;  // Plan::offload params: the blocks copied in over the link too
  // Global: positions of the model's "tokens" input (a language model's sequences, T5's
  // encoder inputs; none for an image classifier) and examples (sequences, images).
  double tokens_per_step = 0, tokens_per_second = 0;
  double examples_per_step = 0, examples_per_second = 0;
  int devices = 0;
  double model_flops_per_step = 0;     // global, no recomputation
  double hardware_flops_per_step = 0;  // global, as executed
  double model_tflops_per_device = 0, hardware_tflops_per_device = 0;
  double mfu = 0, hfu = 0;       // fractions of device peak at the compute dtype
  double peak_memory_bytes = 0;  // per device: persistent state + planned arena
  double persistent_bytes = 0, arena_bytes = 0;
  double host_bytes = 0;  // per device, in host memory: the offloaded optimizer state
  std::map<std::string, double> seconds_by_op;  // busy time per op kind ("matmul", "all_gather")
  std::vector<TraceEvent> events;               // when SimOptions::trace
  // "compute", then "comm <axes>" for each rank group's comm stream, in order of first use.
  std::vector<std::string> streams = {"compute"};
  // Pipelines: the schedule's idle share of the stages' time, and each stage's peak memory.
  double bubble_fraction = 0;
  std::vector<double> stage_peak_bytes;
  std::vector<int> stage_layers;  // blocks per model chunk, as cut
};

// Tokens and examples (the leading dim of the model's inputs) of one global micro-batch of a
// Program whose local graph holds the model's inputs (a pipeline's first chunk).
struct MicroBatchCounts {
  double tokens = 0, examples = 0;
};
MicroBatchCounts micro_batch_counts(const Program& p);

Result<SimResult> simulate(const Program& prog, const ClusterSpec& cluster, const SimOptions& opt);
struct PipelineProgram;
Result<SimResult> simulate(const PipelineProgram& prog, const ClusterSpec& cluster,
                           const SimOptions& opt);
// Lowers the training graph `g` for `plan` (lower(), or lower_pipeline() with stages balanced
// by this cluster's op times when the plan has pipeline stages) and simulates it.
Result<SimResult> simulate_plan(const Graph& g, const Plan& plan, const ClusterSpec& cluster,
                                const SimOptions& opt);
// A pipeline plan's peak bytes per device on one stage (SimResult::stage_peak_bytes[stage]),
// from lowering that stage's chunks alone: the planner's cheap memory check.
Result<double> simulate_stage_memory(const Graph& g, const Plan& plan, const ClusterSpec& cluster,
                                     const SimOptions& opt, int stage);

// Chrome trace event format (JSON), one step, one process with a thread per stream (compute,
// then one per rank group's comm stream).
std::string chrome_trace(const SimResult& r, const std::string& title);

// Multi-line summary: step time and breakdown, tokens/s, TFLOP/s, MFU, HFU, memory.
std::string format_sim_result(const SimResult& r, const ClusterSpec& cluster);

// The bytes a collective node moves, as collective_time takes them (all_gather: its gathered
// output; the others: their input), at the run's element size over f32 (`scale`; the loss
// scalar stays f32).
double collective_bytes(const Graph& g, const Node& n, double scale);
// How many collectives a collective node runs: GroupAttrs::segments of a gather or scatter
// (one per piece, each of collective_bytes / pieces), else 1.
double collective_pieces(const Node& n);

// Where the members of rank 0's group over `axes` sit: how many share a node (the layout
// collective_time takes).
GroupLayout group_layout(const Mesh& mesh, const std::vector<std::string>& axes,
                         int devices_per_node);

}  // namespace tessera
