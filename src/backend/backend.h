// The Backend interface: buffers and kernels of one kind of device. The runtime executes a graph
// node by node through it; a backend that cannot run an op says so via supports() so that the
// caller can fall back or report it.
//
//   CpuBackend cpu;
//   cpu.run(graph, node, {x_ptr, w_ptr}, {y_ptr});
#pragma once

#include <span>
#include <vector>

#include "ir/graph.h"

namespace tessera {

// What a kernel gets for one node: its attributes, its values' types, and pointers to its
// buffers (host or device memory, as the backend keeps them), f32 unless the backend says.
struct KernelArgs {
  const Attrs& attrs;
  std::span<const TensorType> in_types;
  std::span<const TensorType> out_types;
  std::vector<const void*> in;
  std::vector<void*> out;

  const float* fin(int i) const { return static_cast<const float*>(in[static_cast<size_t>(i)]); }
  const int32_t* iin(int i) const {
    return static_cast<const int32_t*>(in[static_cast<size_t>(i)]);
  }
  float* fout(int i) const { return static_cast<float*>(out[static_cast<size_t>(i)]); }
  const Shape& in_shape(int i) const { return in_types[static_cast<size_t>(i)].shape; }
  int num_inputs() const { return static_cast<int>(in.size()); }
  const Shape& out_shape(int i) const { return out_types[static_cast<size_t>(i)].shape; }
};

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
