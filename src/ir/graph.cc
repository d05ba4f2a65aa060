#include "ir/graph.h"

#include <sstream>

#include "base/check.h"

namespace tessera {

namespace {
std::string types_to_string(const Graph& g, const std::vector<ValueId>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ", ";
    s += g.type(ids[i]).to_string();
  }
  return s;
}
}  // namespace

Result<NodeId> Graph::add_node(OpKind op, Attrs attrs, std::vector<ValueId> inputs,
                               std::string scope, int layer, bool backward, bool recompute) {
  const OpDef& def = op_def(op);
  if (def.num_inputs >= 0 && static_cast<int>(inputs.size()) != def.num_inputs) {
    return error("op " + std::string(def.name) + " at '" + scope + "' takes " +
                 std::to_string(def.num_inputs) + " inputs, got " + std::to_string(inputs.size()));
  }
  if (attrs.index() != def.attrs_index) {
    return error("op " + std::string(def.name) + " at '" + scope + "' takes " +
                 attrs_type_name(def.attrs_index) + ", got " + attrs_type_name(attrs.index()));
  }
  std::vector<TensorType> in_types;
  in_types.reserve(inputs.size());
  for (ValueId v : inputs) {
    TS_CHECK(v >= 0 && v < static_cast<ValueId>(values_.size())) << "bad value id " << v;
    in_types.push_back(type(v));
  }
  std::vector<TensorType> out_types;
  Status s = def.infer(attrs, in_types, &out_types);
  if (!s.ok()) {
    return error("op " + std::string(def.name) + " at '" + scope + "' with inputs (" +
                     types_to_string(*this, inputs) + "): " + s.message(),
                 s.hint());
  }
  if (def.num_outputs >= 0) {
    TS_CHECK_EQ(static_cast<int>(out_types.size()), def.num_outputs) << def.name;
  }
  const std::string* source =
      op == OpKind::parameter || op == OpKind::input ? &attrs_as<SourceAttrs>(attrs).name : nullptr;
  if (op == OpKind::parameter && param_by_name_.count(*source))
    return error("duplicate parameter name '" + *source + "'");
  if (op == OpKind::input && input_by_name_.count(*source))
    return error("duplicate input name '" + *source + "'");
  NodeId id = static_cast<NodeId>(nodes_.size());
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.scope = std::move(scope);
  n.layer = layer;
  n.backward = backward;
  n.recompute = recompute;
  for (size_t i = 0; i < out_types.size(); ++i) {
    n.outputs.push_back(static_cast<ValueId>(values_.size()));
    values_.push_back(Value{out_types[i], id, static_cast<int>(i)});
  }
  if (op == OpKind::parameter) {
    param_by_name_[*source] = n.outputs[0];
    params_.push_back(n.outputs[0]);
  } else if (op == OpKind::input) {
    input_by_name_[*source] = n.outputs[0];
    inputs_.push_back(n.outputs[0]);
  }
  n.attrs = std::move(attrs);
  nodes_.push_back(std::move(n));
  return id;
}

ValueId Graph::find_param(const std::string& name) const {
  auto it = param_by_name_.find(name);
  return it == param_by_name_.end() ? -1 : it->second;
}

ValueId Graph::find_input(const std::string& name) const {
  auto it = input_by_name_.find(name);
  return it == input_by_name_.end() ? -1 : it->second;
}

const std::string& Graph::name_of(ValueId v) const { return producer(v).attr<SourceAttrs>().name; }

bool Graph::on_host(ValueId v) const {
  const Node& n = producer(v);
  return n.op == OpKind::parameter && n.attr<SourceAttrs>().host;
}

void Graph::mark_output(ValueId v) {
  for (ValueId o : outputs_)
    if (o == v) return;
  outputs_.push_back(v);
}

void Graph::add_metric(const std::string& name, ValueId v) {
  metrics_.emplace_back(name, v);
  mark_output(v);
}

void Graph::set_loss(ValueId v) {
  TS_CHECK_EQ(type(v).shape.numel(), 1) << "the loss must be a scalar";
  loss_ = v;
  mark_output(v);
}

void Graph::set_param_grad(ValueId param, ValueId grad) {
  TS_CHECK(type(param).shape == type(grad).shape) << name_of(param);
  param_grads_[param] = grad;
  mark_output(grad);
}

int64_t Graph::param_count() const {
  int64_t n = 0;
  for (ValueId p : params_) n += type(p).shape.numel();
  return n;
}

double node_flops(const Graph& g, const Node& n) {
  std::vector<TensorType> in, out;
  for (ValueId v : n.inputs) in.push_back(g.type(v));
  for (ValueId v : n.outputs) out.push_back(g.type(v));
  return op_flops(n.op, n.attrs, in, out);
}

double Graph::total_flops() const {
  double f = 0;
  for (const Node& n : nodes_) f += node_flops(*this, n);
  return f;
}

double Graph::forward_flops() const {
  double f = 0;
  for (const Node& n : nodes_)
    if (!n.backward && !n.recompute) f += node_flops(*this, n);
  return f;
}

Status verify(const Graph& g) {
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const OpDef& def = op_def(n.op);
    std::string where = "node %" + std::to_string(i) + " (" + def.name + " at '" + n.scope + "')";
    if (def.num_inputs >= 0 && static_cast<int>(n.inputs.size()) != def.num_inputs)
      return error(where + ": wrong number of inputs");
    if (def.num_outputs >= 0 && static_cast<int>(n.outputs.size()) != def.num_outputs)
      return error(where + ": wrong number of outputs");
    std::vector<TensorType> in;
    for (ValueId v : n.inputs) {
      if (v < 0 || v >= static_cast<ValueId>(g.values().size()))
        return error(where + ": input value out of range");
      if (g.value(v).producer >= static_cast<NodeId>(i))
        return error(where + ": uses %" + std::to_string(v) + " before it is defined");
      in.push_back(g.type(v));
    }
    std::vector<TensorType> out;
    Status s = def.infer(n.attrs, in, &out);
    if (!s.ok()) return error(where + ": " + s.message());
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const Value& v = g.value(n.outputs[k]);
      if (v.producer != static_cast<NodeId>(i) || v.index != static_cast<int>(k))
        return error(where + ": output value not owned by the node");
      if (v.type.shape != out[k].shape || v.type.dtype != out[k].dtype)
        return error(where + ": recorded type " + v.type.to_string() + " != inferred " +
                     out[k].to_string());
    }
  }
  return Status();
}

namespace {

std::string ints_to_string(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

// " 'name'" for sources and rank groups, " {...}" for what the result types do not show.
std::string attrs_to_string(const Attrs& attrs) {
  std::ostringstream s;
  std::visit(
      Overloaded{
          [&](const NoAttrs&) {},
          [&](const ShapeAttrs&) {},
          [&](const CastAttrs&) {},
          [&](const SourceAttrs& a) { s << " '" << a.name << "'" << (a.host ? " {host}" : ""); },
          [&](const FillAttrs& a) { s << " {value=" << a.value << "}"; },
          [&](const ScalarAttrs& a) { s << " {value=" << a.value << "}"; },
          [&](const ReduceAttrs& a) {
            s << " {axes=" << ints_to_string(a.axes) << (a.keepdim ? " keepdim" : "") << "}";
          },
          [&](const TransposeAttrs& a) { s << " {perm=" << ints_to_string(a.perm) << "}"; },
          [&](const SliceAttrs& a) {
            s << " {axis=" << a.axis << " [" << a.start << "," << a.end << ")}";
          },
          [&](const ConcatAttrs& a) { s << " {axis=" << a.axis << "}"; },
          [&](const MatmulAttrs& a) {
            if (a.transpose_a || a.transpose_b) {
              s << " {" << (a.transpose_a ? "ta" : "") << (a.transpose_b ? "tb" : "")
                << (a.fold_batch ? " fold" : "") << "}";
            }
          },
          [&](const EmbeddingGradAttrs& a) { s << " {rows=" << a.rows << "}"; },
          [&](const NormAttrs& a) { s << " {eps=" << a.eps << "}"; },
          [&](const RopeAttrs& a) {
            s << " {theta=" << a.theta << (a.inverse ? " inverse" : "") << "}";
          },
          [&](const PositionBucketsAttrs& a) {
            s << " {buckets=" << a.num_buckets << " max_distance=" << a.max_distance
              << (a.bidirectional ? " bidirectional" : "") << "}";
          },
          [&](const AttentionAttrs& a) {
            s << " {scale=" << a.scale << (a.causal ? " causal" : " bidirectional") << "}";
          },
          [&](const CrossEntropyAttrs& a) {
            if (a.classes > 0 || a.rows > 0)
              s << " {classes=" << a.classes << " rows=" << a.rows << "}";
          },
          [&](const TopKAttrs& a) { s << " {k=" << a.k << "}"; },
          [&](const MoeAttrs& a) {
            s << " {experts=" << a.experts << " capacity=" << a.capacity << "}";
          },
          [&](const GroupAttrs& a) {
            s << " '" << a.axes << "' {ranks=" << a.size;
            if (a.back != 0) s << " back=" << a.back;
            if (a.segments != 1) s << " segments=" << a.segments;
            s << "}";
          },
          [&](const ShardSliceAttrs& a) {
            s << " {axis=" << a.axis << " blocks=" << a.blocks << "}";
          },
      },
      attrs);
  return s.str();
}

}  // namespace

std::string print_graph(const Graph& g) {
  std::ostringstream s;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    for (size_t k = 0; k < n.outputs.size(); ++k) s << (k ? ", " : "") << "%" << n.outputs[k];
    s << " = " << op_name(n.op) << "(";
    for (size_t k = 0; k < n.inputs.size(); ++k) s << (k ? ", " : "") << "%" << n.inputs[k];
    s << ")";
    s << attrs_to_string(n.attrs);
    s << " : ";
    for (size_t k = 0; k < n.outputs.size(); ++k)
      s << (k ? ", " : "") << g.type(n.outputs[k]).to_string();
    if (!n.scope.empty() || n.backward || n.recompute)
      s << "  # " << (n.backward ? "bwd " : "") << (n.recompute ? "recompute " : "") << n.scope;
    s << "\n";
  }
  return s.str();
}

std::vector<char> input_free_values(const Graph& g) {
  std::vector<char> free(g.values().size(), 0);
  for (const Node& n : g.nodes()) {
    bool f = n.op != OpKind::input;
    for (ValueId v : n.inputs) f = f && free[static_cast<size_t>(v)];
    for (ValueId v : n.outputs) free[static_cast<size_t>(v)] = f;
  }
  return free;
}

}  // namespace tessera
