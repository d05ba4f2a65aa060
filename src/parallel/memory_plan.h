// Static memory planning: every activation, temporary and gradient of a step gets an offset in
// one arena, from buffer liveness over the node order, so the peak is known before execution.
// Parameters live outside the arena (persistent storage owned by the runtime).
//
//   MemoryPlan plan = plan_memory(graph);
//   plan.arena_bytes          // the planned peak: size of the arena
//   plan.offset(v)            // where value v lives, -1 for parameters
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"

namespace tessera {

struct BufferPlan {
  int64_t offset = -1;  // byte offset in the arena; -1: not in the arena
  int64_t bytes = 0;
  int first = 0;  // index of the defining node (0 for inputs)
  int last = 0;   // index of the last reading node; num_nodes for graph outputs
};

struct MemoryPlan {
  std::vector<BufferPlan> buffers;  // indexed by ValueId
  int64_t arena_bytes = 0;          // planned peak (highest offset + size)
  int64_t live_peak_bytes = 0;      // max over nodes of bytes live at once (a lower bound)
  int64_t param_bytes = 0;          // parameters, outside the arena
  int64_t offset(ValueId v) const { return buffers[static_cast<size_t>(v)].offset; }
};

// Where each collective of `g` is waited for, indexed by node: the index of the node before
// which its wait happens (g.nodes().size(): at the end of the step; -1 for other nodes). A
// collective whose output is read is waited for just before its first reader. One whose output
// nobody reads in the step (a gradient reduction) is waited for when the
// kUnreadCollectivesInFlight-th later such collective starts, so that only that many
// reductions hold their full-size input at once. The memory planner and lower() both use it.
inline constexpr int kUnreadCollectivesInFlight = 8;
std::vector<int> collective_waits(const Graph& g);

// The value a reshape output `v` is a view of (shares its arena bytes), or -1: reshapes of
// arena values are free; a reshape of a parameter is a copy into the arena.
ValueId reshape_view_of(const Graph& g, ValueId v);

// Greedy best-fit by size over buffer lifetimes; reshape views share their input's offset. Buffers
// are aligned to `alignment` bytes.
MemoryPlan plan_memory(const Graph& g, int64_t alignment = 64);

}  // namespace tessera
