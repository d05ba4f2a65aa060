// Pieces of the simulator shared by its Program and pipeline halves (not a public API).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cost/cluster_spec.h"
#include "cost/collective_cost.h"
#include "sim/simulator.h"

namespace tessera {

// One micro-batch of a pipeline chunk's Program, replayed without its gradient collectives.
struct ChunkSim {
  double micro_seconds = 0;        // the micro-step, start to end (gradient accumulation included)
  double forward_seconds = 0;      // until its last forward instruction ends
  double backward_compute = 0;     // compute-stream seconds of backward (and recomputed) nodes
  double weight_compute = 0;       // of which nodes that only feed parameter gradients (zb-h1's W)
  double grad_reduce_seconds = 0;  // its gradient collectives, back to back, once per step
  double optimizer_seconds = 0;    // the optimizer instructions alone
  double hardware_flops = 0, model_flops = 0;   // per rank, per micro-batch
  std::map<std::string, double> seconds_by_op;  // per micro-batch and the optimizer
};

// The run's element size over f32's: activations, collectives and low-precision copies scale by it.
double precision_scale(const SimOptions& opt);
// The same for one Program: 1 for a program built in the low precision (bf16/f16 parameters:
// its bytes, master weights included, are counted as they are); f32 programs scale.
double precision_scale(const Program& prog, const SimOptions& opt);

// One Program's persistent bytes per rank at the run's precision (`scale`: its element size over
// f32's): as planned in f32; under mixed precision the parameters in the low precision plus an
// f32 master copy sharded like the optimizer state (ZeRO-1 and up shard it, as DeepSpeed's
// ZeRO and Megatron's distributed optimizer do), the f32 gradients and AdamW moments as planned.
// FP8 GEMMs (SimOptions::fp8) add a one-byte copy of each local parameter element;
// `grad_scale` scales the f32 gradient sums (gradient_sum_scale).
double persistent_bytes_at(const Program& prog, double scale, bool fp8, double grad_scale = 1.0);
// The gradient sums' element size over f32's: 1/2 where they are held in f16
// (SimOptions::f16_gradient_sums with f16), else 1.
double gradient_sum_scale(const SimOptions& opt);
// Program::host_bytes at the run's precision (Plan::offload params: its low-precision blocks).
double host_bytes_at(const Program& prog, double scale);

// SimOptions::tp_comm_overlap: for each node of `g` (a rank's local graph) that is a
// collective over the plan's tensor axes, the GEMM it is chunked against: the one producing its
// input, through the reshapes and transposes between them (a reduce-scatter or all-reduce after
// a row-parallel product), or else the one consuming its output (an all-gather before a
// column-parallel product); -1 and -1 for every other node. Empty without tensor axes.
struct TpOverlap {
  NodeId producer = -1, consumer = -1;
};
std::vector<TpOverlap> tp_overlap_gemms(const Graph& g, const Plan& plan);

Status check_sim_inputs(const Plan& plan, const ClusterSpec& cluster, const SimOptions& opt);
ChunkSim simulate_chunk(const Program& prog, const std::vector<char>& weight_grad,
                        const ClusterSpec& cluster, const SimOptions& opt);

}  // namespace tessera
