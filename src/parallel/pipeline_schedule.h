// Pipeline schedules as data (DESIGN.md "Program": "a pipeline schedule is data: one function per
// schedule orders the forward (F), backward (B) and weight-gradient (W) actions of each stage").
// A pipeline of `stages` ranks holds stages x virtual_stages model chunks; chunk c of stage s is
// model chunk k = c * stages + s (Megatron's interleaving), so with one virtual stage stage s
// runs model chunk s. make_schedule() lists, per stage, the actions of one optimizer step over
// `micro_batches` micro-batches in the order that stage executes them; time_schedule() replays
// the lists on per-chunk durations (each stage one compute stream, each action after the
// actions it depends on) and gives the step's span and bubble.
//
//   TS_ASSIGN_OR_RETURN(PipelineSchedule s, make_schedule(ScheduleKind::one_f_one_b, 8, 32));
//   ChunkTimes t = ChunkTimes::uniform(8 /*chunks*/, 1.0 /*F*/, 2.0 /*B+W*/);
//   TS_ASSIGN_OR_RETURN(ScheduleTiming r, time_schedule(s, t));
//   r.bubble_fraction;   // (p-1)/(m+p-1) = 7/39 for 1F1B
//
// The schedules (p stages, m micro-batches, V virtual stages):
//   gpipe        every forward, then every backward: m micro-batches of activations stashed
//   1f1b         PipeDream-Flush: p-s-1 warm-up forwards on stage s, then one forward and one
//                backward alternately; at most p-s micro-batches stashed; bubble (p-1)/(m+p-1)
//   interleaved  Megatron's interleaved 1F1B over V chunks per stage (m a multiple of p):
//                bubble (p-1)/(V*m+p-1), for (p-s-1)*2+(V-1)*p+1 chunk activations stashed
//   zb-h1        Qi et al. 2023 "Zero Bubble Pipeline Parallelism", handcrafted schedule 1: the
//                backward split into B (input gradient, on the critical path) and W (weight
//                gradient, deferred into the cool-down bubble); 1F1B's stash, and a bubble of
//                (p-1)(F+B-W) instead of (p-1)(F+B+W)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tessera {

enum class ScheduleKind : uint8_t { gpipe, one_f_one_b, interleaved, zb_h1 };
const char* schedule_name(ScheduleKind k);  // "gpipe", "1f1b", "interleaved", "zb-h1"
Result<ScheduleKind> parse_schedule(std::string_view name);

// Model chunks per stage (virtual stages) worth trying for an interleaved schedule of `pp`
// stages over `layers` blocks: 2 and 4 (uneven cuts allowed), and each divisor of the blocks
// per stage from 3 to 8 (Megatron's rule: 105 blocks over 35 stages interleave 3 ways). The
// planner searches these, and `validate` fills a row's unpublished interleaving from them.
std::vector<int> interleavings(int64_t layers, int pp);

// backward: the whole backward of a chunk (input and weight gradients); zb-h1 splits it into
// backward_input (B) and backward_weight (W).
enum class PipeOp : uint8_t { forward, backward, backward_input, backward_weight };
const char* pipe_op_name(PipeOp op);  // "F", "B", "Bi", "W"

struct PipeAction {
  PipeOp op = PipeOp::forward;
  int micro_batch = 0;
  int chunk = 0;  // virtual stage on this rank; model chunk chunk * stages + stage
  bool operator==(const PipeAction&) const = default;
};

struct PipelineSchedule {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int stages = 1, micro_batches = 1, virtual_stages = 1;
  std::vector<std::vector<PipeAction>> actions;  // per stage, in execution order

  int chunks() const { return stages * virtual_stages; }
  int model_chunk(int stage, int chunk) const { return chunk * stages + stage; }
};

// Errors (one paragraph naming the flag's value and what works): stages, micro-batches or
// virtual stages below 1; virtual stages above 1 on a schedule other than interleaved;
// interleaved with micro-batches not a multiple of the stages.
Result<PipelineSchedule> make_schedule(ScheduleKind kind, int stages, int micro_batches,
                                       int virtual_stages = 1);

// The most micro-batches of activations stage s holds at once: forwards whose backward (the
// last backward part: W under zb-h1) has not run yet, counted per chunk.
int max_in_flight(const PipelineSchedule& s, int stage);

// Seconds of each model chunk's actions (forward, input gradient, weight gradient), and of one
// activation or gradient crossing between neighbouring stages.
struct ChunkTimes {
  std::vector<double> forward, backward_input, backward_weight;  // per model chunk
  double p2p = 0;
  // Each action whose result goes to another stage keeps its stage busy for p2p after it (a
  // send that blocks); otherwise the transfer only delays the action waiting for it.
  bool blocking_p2p = false;
  // Every chunk alike; `backward` (input + weight) split evenly between B and W.
  static ChunkTimes uniform(int chunks, double forward, double backward, double p2p = 0);
};

struct ScheduleTiming {
  double step_seconds = 0;                      // first action's start to last action's end
  std::vector<double> busy_seconds;             // per stage
  double bubble_fraction = 0;                   // idle share of the stages' time, averaged
  std::vector<std::vector<double>> start, end;  // per stage, per action
};

// Replays the lists: each stage runs its actions in order, one at a time; F of model chunk k
// waits for F of chunk k-1 (plus p2p when it is on another stage), B of chunk k for B of chunk
// k+1 (the last chunk's for its own F), W for its own B. An order that waits on itself is an
// error naming the stage and action.
Result<ScheduleTiming> time_schedule(const PipelineSchedule& s, const ChunkTimes& t);

}  // namespace tessera
