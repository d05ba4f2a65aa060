// A pipeline-parallel training step: the model cut into chunks (pipeline_split.h), each lowered
// to the Program its stage's ranks run for one micro-batch (its blocks' forward, then their
// backward, partitioned over the plan's data and tensor axes), and the schedule ordering those
// micro-steps on every stage (pipeline_schedule.h). The simulator times it; the memory figures
// are the stage's static plan under the schedule.
//
//   Plan plan = Plan::pipeline_parallel(4, 2, 2, /*zero=*/1);
//   plan.micro_batches = 8;
//   TS_ASSIGN_OR_RETURN(PipelineProgram pp, lower_pipeline(model.graph, plan));
//   pp.chunks[k].program        // model chunk k, on stage k % 4
//   pp.stage_arena_bytes[s]     // the largest phase arena of stage s's chunks + a stash slot
//                               // per micro-batch in flight (sized by its largest chunk stash)
//
// Gradients are reduced over the data axes once per step, after the stage's last backward:
// each chunk's gradient collectives form a phase of their own (ChunkProgram::reduce_phase).
#pragma once

#include <vector>

#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_split.h"
#include "parallel/pipeline_stages.h"
#include "parallel/program.h"

namespace tessera {

// A chunk's phases, run apart by the schedule: forward and backward, or under zb-h1 forward,
// backward_input (B) and backward_weight (W).
// The gradient reduction, once per step, is the phase after the last (ChunkProgram::reduce_phase).
enum ChunkPhase : int { kForwardPhase = 0, kBackwardPhase = 1, kWeightPhase = 2 };

struct ChunkProgram {
  Program program;
  int first_block = 0, blocks = 0;
  // The Program's local graph cut into its phases (split_phases), each with its instruction list
  // (lower_instructions) and memory plan; the phases of a stage share one arena.
  Phases phases;
  std::vector<std::vector<Instruction>> phase_lists;
  std::vector<MemoryPlan> phase_memory;
  // Boundaries, as values of the local graph: activations received (inputs) and their
  // gradients (outputs), activations sent (outputs) and their gradients (inputs).
  std::vector<ValueId> recv, recv_grads, send, send_grads;
  // Per micro-batch in flight: the forward values (and inputs) later phases read, and under
  // zb-h1 the backward_input values backward_weight reads.
  int64_t stash_bytes = 0, weight_stash_bytes = 0;
  int64_t send_bytes = 0;       // per micro-batch: local activations sent to the next chunk
  int64_t send_grad_bytes = 0;  // per micro-batch: their gradients sent back to the previous
  // Per local node: a backward node that only feeds parameter gradients (zb-h1's W part); the
  // other backward nodes compute the gradients that flow to earlier blocks (its B part).
  std::vector<char> weight_grad;
  // The last phase when the gradients are reduced over the data (and tensor) axes: the
  // gradient collectives and what follows them, run once per step on the unreduced gradients
  // summed over the micro-batches (the reduction is linear); -1 when nothing is reduced.
  int reduce_phase = -1;
  // The f32 sums of those unreduced gradients (the reduce phase's stash inputs) live until the
  // reduce phase has read them; the f32 accumulators of the gradients it computes are written
  // only after that and read by the optimizer before the next step's first sum: one pool
  // (grad_pool_bytes) holds both in turn, at these byte offsets (kGradPoolAlign-aligned) --
  // per stash entry (-1: not an input of the reduce phase) and per parameter (-1: an
  // accumulator of its own, its gradient computed by a backward phase).
  static constexpr int64_t kGradPoolAlign = 256;
  std::vector<int64_t> unreduced_offset, reduced_grad_offset;
  int64_t grad_pool_bytes = 0;
};

struct PipelineProgram {
  Plan plan;
  PipelineSchedule schedule;
  std::vector<int> per_chunk;  // blocks per model chunk
  std::vector<ChunkProgram> chunks;
  double model_flops = 0;  // one micro-batch of the whole graph (forward and backward)
  // Parameters whose gradients are summed across chunks on different stages (tied embeddings):
  // bytes per rank, all-reduced between those stages once per step.
  int64_t shared_param_bytes = 0;
  std::vector<int> in_flight;                   // per stage: max_in_flight
  std::vector<int> weight_in_flight;            // per stage: micro-batches between B and W (zb-h1)
  std::vector<int64_t> stage_persistent_bytes;  // per stage: its chunks' parameters, gradients,
                                                // AdamW state
  std::vector<int64_t> stage_arena_bytes;       // per stage, see the header comment
  std::vector<int64_t> stage_stash_bytes;       // per stage: its stash slots (in the arena bytes)
  // Send buffers, per stage, allocated once: a send holds its slot until it completes. A chunk's
  // activations for micro-batch j are received before the next chunk's forward of j, which
  // precedes that chunk's backward of j and so this chunk's: sends in flight are among this
  // stage's micro-batches in flight (in_flight slots). Gradients sent back for j are received
  // before the previous chunk's backward of j, whose forward has run: among the previous
  // stage's in flight (its in_flight slots). Each slot holds the stage's largest message.
  struct SendPool {
    int slots = 0;
    int64_t slot_bytes = 0;
  };
  std::vector<SendPool> activation_sends, gradient_sends;  // per stage
  std::vector<int64_t> stage_p2p_bytes;                    // per stage: both pools' bytes
};

// plan.stages() must be > 1. Chunks are cut at plan.stage_layers, or balanced by the FLOPs one
// rank of a stage runs (rank_layer_flops): the runtime and the simulator cut the same way.
// Errors: more chunks than blocks, stage_layers that do not sum to the blocks, and the
// schedule's own (micro-batches for interleaved).
// `only_stage` >= 0 lowers that stage's chunks alone (the others stay empty, and only that
// stage's figures are filled): its memory costs a fraction of the whole pipeline's lowering.
Result<PipelineProgram> lower_pipeline(const Graph& g, const Plan& plan, int only_stage = -1);

// The FLOPs of each block, and of what comes before and after the blocks, on one rank of the
// plan's tensor group with its recomputation: g partitioned over the tensor axes, so that what
// the ranks replicate weighs in full (an LM head whose vocabulary does not divide the group is
// computed whole on every rank) and recomputed forward nodes count in their block.
Result<LayerCosts> rank_layer_flops(const Graph& g, const Plan& plan);

// The chunk of a model chunk index: its stage.
inline int stage_of_chunk(const PipelineProgram& p, int chunk) { return chunk % p.schedule.stages; }

}  // namespace tessera
