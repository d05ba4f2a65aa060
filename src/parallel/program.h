// The Program: what one rank executes for one training step under a Plan, and what the
// simulator will time and the memory planner sizes (DESIGN.md "The one idea").
//
//   TS_ASSIGN_OR_RETURN(Program prog, lower(model.graph, plan));
//   prog.memory.arena_bytes      // planned per-rank activation/temporary peak
//   prog.persistent_bytes()      // parameters + gradients + optimizer state per rank
//   prog.host_bytes              // offloaded optimizer state per rank, in host memory
//   prog.comm_bytes_per_step     // bytes this rank sends per optimizer step (ring algorithms)
//   std::puts(print_program(prog).c_str());
//
// `micro_step` runs once per micro-batch: compute instructions on the compute stream, each
// collective as a start on the comm stream (issued as soon as its input is ready, so
// gradient buckets overlap the rest of the backward pass and ZeRO-3 gathers run ahead of
// their use) and a wait just before the first reader of its output. `optimizer` runs once
// per step: the gradient norm (all-reduced over the ZeRO group when gradients or optimizer
// state are sharded), AdamW on each rank's block, and for ZeRO-1/2 the all-gather that makes
// the updated parameters whole again. Every instruction lists the instructions it depends on.
// With the optimizer offloaded (Plan::offload) the list is: each gradient block to the host
// (link), the norm and AdamW on the host, the ZeRO-1/2 all-gathers of the f32 master blocks in
// host memory, and each updated piece back to the device (link). With the parameters offloaded
// too (Plan::offload params, ZeRO-3) the updated blocks stay in host memory, and the micro-step
// copies each block over the link into its slot of the gathered tensor (param_fetch) just
// before the all-gather that reads it.
#pragma once

#include <string>
#include <vector>

#include "parallel/memory_plan.h"
#include "parallel/partition.h"
#include "parallel/plan.h"

namespace tessera {

// Where an instruction runs: the device's compute stream, a rank group's comm stream, and with
// the optimizer offloaded (Plan::offload) the host's threads and the host-device link.
enum class Stream : uint8_t { compute, comm, host, link };
const char* stream_name(Stream s);  // "compute", "comm", "host", "link"

struct Instruction {
  enum Kind : uint8_t {
    compute,     // node of the local graph on the backend
    start,       // collective node: issue on the communicator
    wait,        // collective node: block until done
    grad_norm,   // sum of squared gradients over this rank's blocks (+ all-reduce)
    optimizer,   // AdamW on parameter `param`'s local block
    param_sync,  // all-gather parameter `param`'s updated blocks (ZeRO-1/2)
    // Plan::offload optimizer: the gradient of `param`'s optimizer block to host memory, and
    // its updated piece back to the device (in the parameter's dtype) after AdamW.
    grad_to_host,
    param_to_device,
    // Plan::offload params: this rank's block of the host-held parameter that all-gather
    // `node` reads, copied over the link into the block's slot of the gather's output.
    param_fetch,
  };
  Kind kind = compute;
  Stream stream = Stream::compute;
  NodeId node = -1;       // compute/start/wait
  int param = -1;         // optimizer/param_sync
  int bucket = -1;        // start/wait of gradient collectives
  std::vector<int> deps;  // indices into the same instruction list
};

struct Program {
  Plan plan;
  Partitioned part;
  MemoryPlan memory;
  std::vector<Instruction> micro_step;
  std::vector<Instruction> optimizer;
  int64_t param_bytes = 0, grad_bytes = 0, optim_bytes = 0;  // persistent, per rank
  // Plan::offload optimizer: what this rank keeps in host memory instead (the f32 master of its
  // local piece, AdamW's moments and an f32 copy of the gradient of its optimizer block);
  // optim_bytes is then 0. Plan::offload params: also the parameter blocks in their dtype
  // (bf16/f16; an f32 block is its master), which param_bytes then leaves out.
  int64_t host_bytes = 0;
  double comm_bytes_per_step = 0;  // sent by one rank per optimizer step
  // FLOPs of one micro-batch of the global graph (forward and backward, each op once however
  // many ranks replicate it): the model FLOPs MFU counts.
  double model_flops = 0;

  const Graph& local() const { return part.local; }
  int64_t persistent_bytes() const { return param_bytes + grad_bytes + optim_bytes; }
};

// Partitions `g` for `plan` (after apply_recompute when plan.recompute is not none:
// parallel/recompute.h) and lowers the local graph to instruction streams. part.params[i].global
// and part.global_to_local refer to `g`'s values either way.
Result<Program> lower(const Graph& g, const Plan& plan, TokenShape tokens = {});

// The micro-step instructions of a local graph (Program::micro_step's rule, for a graph cut
// into pipeline phases too): one compute or start per node, a wait before the first reader of
// each collective's output. `buckets` (nodes of g) only label the gradient collectives.
std::vector<Instruction> lower_instructions(const Graph& g,
                                            const std::vector<std::vector<NodeId>>& buckets);

// "compute", "start", "wait", "grad_norm", "adamw", "param_sync", "grad_to_host",
// "param_to_device", "param_fetch".
const char* instruction_name(Instruction::Kind k);

// Whether every dependency of the list points at an earlier instruction: the list's order is
// then a valid schedule for a runner that executes it in order on one stream (StepRunner).
Status check_order(const std::vector<Instruction>& list);

// One line per instruction: "  12 comm  start  all_reduce %88 (h.1 grads, bucket 3) <- 11".
std::string print_program(const Program& p, size_t max_lines = 200);

}  // namespace tessera
