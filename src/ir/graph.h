// The Graph: SSA, append-only, topologically ordered. Each Node applies one op to input Values
// and defines output Values; each node carries a scope ("h.3.attn.qkv") and a layer index so
// that passes can cut stages and name things. Build graphs with Builder (builder.h).
//
//   Graph g;
//   Builder b(&g);
//   Var x = b.input("x", Shape{4, 8});
//   Var w = b.parameter("w", Shape{8, 8}, Init::normal, 0.02);
//   Var y = b.matmul(x, w);
//   g.nodes().size() == 3;  g.value(y.id).type.shape == Shape{4, 8};
#pragma once

#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "ir/op.h"

namespace tessera {

using ValueId = int32_t;
using NodeId = int32_t;

struct Value {
  TensorType type;
  NodeId producer = -1;
  int index = 0;  // which output of the producer
};

struct Node {
  OpKind op = OpKind::fill;
  Attrs attrs = FillAttrs{};
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  std::string scope;  // "h.3.attn.qkv"; "" at top level
  int layer = -1;     // transformer block index, -1 outside blocks
  bool backward = false;
  // A forward node cloned into the backward pass by activation recomputation
  // (parallel/recompute.h): backward stays false, but it runs where the backward pass runs.
  bool recompute = false;

  // The attributes as the op's type (op.h); reading another type is a bug (abort).
  template <class T>
  const T& attr() const {
    return attrs_as<T>(attrs);
  }
};

// Whether a node runs in the backward pass: backward nodes and recomputed forward nodes.
inline bool in_backward_pass(const Node& n) { return n.backward || n.recompute; }

class Graph {
 public:
  // Appends a node after inferring its output types. Errors name the op, the scope and the
  // input types.
  Result<NodeId> add_node(OpKind op, Attrs attrs, std::vector<ValueId> inputs, std::string scope,
                          int layer, bool backward, bool recompute = false);

  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(NodeId id) const { return nodes_[static_cast<size_t>(id)]; }
  const std::vector<Value>& values() const { return values_; }
  const Value& value(ValueId id) const { return values_[static_cast<size_t>(id)]; }
  const TensorType& type(ValueId id) const { return value(id).type; }
  const Node& producer(ValueId id) const { return node(value(id).producer); }

  // Parameters and inputs in creation order.
  const std::vector<ValueId>& params() const { return params_; }
  const std::vector<ValueId>& inputs() const { return inputs_; }
  // Finds a parameter or input by name; -1 when absent.
  ValueId find_param(const std::string& name) const;
  ValueId find_input(const std::string& name) const;
  const std::string& name_of(ValueId param_or_input) const;
  // Whether v is a parameter held in host memory (SourceAttrs::host).
  bool on_host(ValueId v) const;

  // Values that must survive to the end of a step (loss, gradients, metrics).
  void mark_output(ValueId v);
  const std::vector<ValueId>& outputs() const { return outputs_; }
  ValueId loss() const { return loss_; }
  void set_loss(ValueId v);
  // Named scalars a step reports beside the loss (a mixture of experts' routes that found a
  // slot): f32 [], sums over the examples (a data-parallel run's are the ranks' sums). Marked
  // outputs.
  void add_metric(const std::string& name, ValueId v);
  const std::vector<std::pair<std::string, ValueId>>& metrics() const { return metrics_; }
  // The backward pass's seed, d loss / d loss = 1 (a fill; append_backward sets it): the
  // value a runtime scales for fp16 loss scaling.
  ValueId loss_seed() const { return loss_seed_; }
  void set_loss_seed(ValueId v) { loss_seed_ = v; }
  // Gradient of the loss w.r.t. each parameter, filled by append_backward (autodiff.h).
  const std::map<ValueId, ValueId>& param_grads() const { return param_grads_; }
  void set_param_grad(ValueId param, ValueId grad);

  int64_t param_count() const;
  // Sum of op FLOPs over the graph; forward_flops() counts the forward pass only (neither
  // backward nor recomputed nodes).
  double total_flops() const;
  double forward_flops() const;

 private:
  std::vector<Node> nodes_;
  std::vector<Value> values_;
  std::vector<ValueId> params_, inputs_, outputs_;
  std::map<std::string, ValueId> param_by_name_, input_by_name_;
  std::map<ValueId, ValueId> param_grads_;
  std::vector<std::pair<std::string, ValueId>> metrics_;
  ValueId loss_ = -1;
  ValueId loss_seed_ = -1;
};

// FLOPs of one node of g (op_flops on its value types).
double node_flops(const Graph& g, const Node& n);

// Checks SSA and topological order, input/output counts and re-infers every node's output
// types. Returns the first violation, naming the node.
Status verify(const Graph& g);

// Per value: 1 when computed from parameters and constants alone (no graph input upstream:
// T5's position bias from its table), which pipeline cuts recompute and partitioning may
// slice for free.
std::vector<char> input_free_values(const Graph& g);

// One line per node: "%12 = matmul(%3, %7) {tb} : f32[2,16,192]  # h.0.attn.qkv"; "bwd" and
// "recompute" mark backward nodes and recomputed forward nodes.
std::string print_graph(const Graph& g);

}  // namespace tessera
