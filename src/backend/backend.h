// The Backend interface: buffers and kernels of one kind of device. The runtime executes a graph
// node by node through it; a backend that cannot run an op says so via supports() so that the
// caller can fall back or report it.
//
//   CpuBackend cpu;
//   cpu.run(graph, node, {x_ptr, w_ptr}, {y_ptr});
#pragma once

#include <span>

#include "ir/graph.h"

namespace tessera {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual bool supports(OpKind op) const = 0;
  // Runs one node. inputs/outputs point at buffers of the node's value types, densely packed
  // row-major. Outputs never alias inputs.
  virtual void run(const Graph& g, const Node& node, std::span<const void* const> inputs,
                   std::span<void* const> outputs) = 0;
};

}  // namespace tessera
