#include "ir/builder.h"

#include "base/check.h"

namespace tessera {

TensorType Var::type() const { return b->graph().type(id); }

Var operator+(Var a, Var b) { return a.b->add(a, b); }
Var operator-(Var a, Var b) { return a.b->sub(a, b); }
Var operator*(Var a, Var b) { return a.b->mul(a, b); }
Var operator/(Var a, Var b) { return a.b->div(a, b); }
Var operator*(Var a, float s) { return a.b->scale(a, s); }
Var operator+(Var a, float s) { return a.b->add_scalar(a, s); }
Var operator-(Var a) { return a.b->scale(a, -1.0); }

Builder::ScopeGuard Builder::scope(const std::string& name) {
  size_t saved = scope_.size();
  scope_ += scope_.empty() ? name : "." + name;
  return ScopeGuard(this, saved);
}

std::vector<Var> Builder::apply(OpKind op, const Attrs& attrs, const std::vector<Var>& inputs) {
  std::vector<ValueId> ids;
  ids.reserve(inputs.size());
  for (const Var& v : inputs) {
    TS_CHECK(v.valid()) << "invalid input to " << op_name(op) << " at '" << scope_ << "'";
    ids.push_back(v.id);
  }
  Result<NodeId> r = g_->add_node(op, attrs, std::move(ids), scope_, layer_, backward_);
  TS_CHECK(r.ok()) << r.status().to_string();
  std::vector<Var> out;
  for (ValueId v : g_->node(r.value()).outputs) out.push_back(Var{this, v});
  return out;
}

namespace {
SourceAttrs parameter_attrs(const std::string& scope, const std::string& name, const Shape& shape,
                            Init init, double std, DType dtype) {
  SourceAttrs a;
  a.name = scope.empty() ? name : scope + "." + name;
  a.shape = shape.dims();
  a.init = init;
  a.init_std = std;
  a.dtype = dtype;
  return a;
}
}  // namespace

Var Builder::parameter(const std::string& name, Shape shape, Init init, double std, DType dtype) {
  return op<OpKind::parameter>({}, parameter_attrs(scope_, name, shape, init, std,
                                                   dtype == DType::f32 ? param_dtype_ : dtype))[0];
}

Var Builder::expert_parameter(const std::string& name, Shape shape, Init init, double std) {
  SourceAttrs a = parameter_attrs(scope_, name, shape, init, std, param_dtype_);
  a.experts = true;
  return op<OpKind::parameter>({}, std::move(a))[0];
}

Var Builder::input(const std::string& name, Shape shape, DType dtype) {
  return op<OpKind::input>({}, {.name = name, .shape = shape.dims(), .dtype = dtype})[0];
}

Var Builder::fill(Shape shape, double value, DType dtype) {
  return op<OpKind::fill>({}, {.shape = shape.dims(), .value = value, .dtype = dtype})[0];
}

Var Builder::add(Var a, Var b) { return apply1(OpKind::add, {}, {a, b}); }
Var Builder::sub(Var a, Var b) { return apply1(OpKind::sub, {}, {a, b}); }
Var Builder::mul(Var a, Var b) { return apply1(OpKind::mul, {}, {a, b}); }
Var Builder::div(Var a, Var b) { return apply1(OpKind::div, {}, {a, b}); }

Var Builder::scale(Var x, double s) { return op<OpKind::scale>({x}, {.value = s})[0]; }

Var Builder::add_scalar(Var x, double s) { return op<OpKind::add_scalar>({x}, {.value = s})[0]; }

Var Builder::exp(Var x) { return apply1(OpKind::exp, {}, {x}); }
Var Builder::log(Var x) { return apply1(OpKind::log, {}, {x}); }
Var Builder::sqrt(Var x) { return apply1(OpKind::sqrt, {}, {x}); }
Var Builder::rsqrt(Var x) { return apply1(OpKind::rsqrt, {}, {x}); }
Var Builder::tanh(Var x) { return apply1(OpKind::tanh, {}, {x}); }
Var Builder::gelu(Var x) { return apply1(OpKind::gelu, {}, {x}); }
Var Builder::gelu_grad(Var x, Var dy) { return apply1(OpKind::gelu_grad, {}, {x, dy}); }
Var Builder::silu(Var x) { return apply1(OpKind::silu, {}, {x}); }
Var Builder::silu_grad(Var x, Var dy) { return apply1(OpKind::silu_grad, {}, {x, dy}); }
Var Builder::relu(Var x) { return apply1(OpKind::relu, {}, {x}); }
Var Builder::relu_grad(Var x, Var dy) { return apply1(OpKind::relu_grad, {}, {x, dy}); }
Var Builder::swiglu(Var gate, Var up) { return apply1(OpKind::swiglu, {}, {gate, up}); }
std::vector<Var> Builder::swiglu_grad(Var gate, Var up, Var dy) {
  return apply(OpKind::swiglu_grad, {}, {gate, up, dy});
}

Var Builder::reduce_sum(Var x, std::vector<int64_t> axes, bool keepdim) {
  return op<OpKind::reduce_sum>({x}, {.axes = std::move(axes), .keepdim = keepdim})[0];
}

Var Builder::sum_to(Var x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return op<OpKind::sum_to>({x}, {.shape = shape.dims()})[0];
}

Var Builder::broadcast_to(Var x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return op<OpKind::broadcast_to>({x}, {.shape = shape.dims()})[0];
}

Var Builder::reshape(Var x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return op<OpKind::reshape>({x}, {.shape = shape.dims()})[0];
}

Var Builder::transpose(Var x, std::vector<int64_t> perm) {
  return op<OpKind::transpose>({x}, {.perm = std::move(perm)})[0];
}

Var Builder::slice(Var x, int axis, int64_t start, int64_t end) {
  return op<OpKind::slice>({x}, {.axis = axis, .start = start, .end = end})[0];
}

Var Builder::concat(const std::vector<Var>& xs, int axis) {
  return op<OpKind::concat>(xs, {.axis = axis})[0];
}

Var Builder::cast(Var x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return op<OpKind::cast>({x}, {.dtype = dtype})[0];
}

Var Builder::matmul(Var a, Var b, bool transpose_a, bool transpose_b) {
  return op<OpKind::matmul>({a, b}, {.transpose_a = transpose_a, .transpose_b = transpose_b})[0];
}

Var Builder::matmul_folded(Var a, Var b) {
  return op<OpKind::matmul>({a, b}, {.transpose_a = true, .fold_batch = true})[0];
}

Var Builder::linear(Var x, Var w, Var bias) {
  Var y = matmul(x, w, false, true);
  return bias.valid() ? y + bias : y;
}

Var Builder::embedding(Var table, Var ids) { return apply1(OpKind::embedding, {}, {table, ids}); }

Var Builder::embedding_grad(Var dy, Var ids, int64_t vocab) {
  return op<OpKind::embedding_grad>({dy, ids}, {.rows = vocab})[0];
}

std::vector<Var> Builder::layernorm(Var x, Var w, Var bias, double eps) {
  return op<OpKind::layernorm>({x, w, bias}, {.eps = eps});
}

std::vector<Var> Builder::layernorm_grad(Var dy, Var x, Var w, Var mean, Var rstd) {
  return apply(OpKind::layernorm_grad, {}, {dy, x, w, mean, rstd});
}

std::vector<Var> Builder::rmsnorm(Var x, Var w, double eps) {
  return op<OpKind::rmsnorm>({x, w}, {.eps = eps});
}

std::vector<Var> Builder::rmsnorm_grad(Var dy, Var x, Var w, Var rstd) {
  return apply(OpKind::rmsnorm_grad, {}, {dy, x, w, rstd});
}

Var Builder::rope(Var x, double theta, bool inverse) {
  return op<OpKind::rope>({x}, {.theta = theta, .inverse = inverse})[0];
}

Var Builder::softmax(Var x) { return apply1(OpKind::softmax, {}, {x}); }
Var Builder::softmax_grad(Var y, Var dy) { return apply1(OpKind::softmax_grad, {}, {y, dy}); }

Var Builder::causal_mask(Var scores, double fill) {
  return op<OpKind::causal_mask>({scores}, {.value = fill})[0];
}

Var Builder::position_buckets(int64_t tq, int64_t tk, bool bidirectional, int64_t num_buckets,
                              int64_t max_distance) {
  return op<OpKind::position_buckets>({}, {.tq = tq,
                                           .tk = tk,
                                           .num_buckets = num_buckets,
                                           .max_distance = max_distance,
                                           .bidirectional = bidirectional})[0];
}

std::vector<Var> Builder::attention(Var q, Var k, Var v, double scale, bool causal, Var bias) {
  const AttentionAttrs a{.scale = scale, .causal = causal};
  if (bias.valid()) return op<OpKind::attention>({q, k, v, bias}, a);
  return op<OpKind::attention>({q, k, v}, a);
}

std::vector<Var> Builder::attention_grad(Var q, Var k, Var v, Var out, Var lse, Var dout,
                                         double scale, bool causal, Var bias) {
  const AttentionAttrs a{.scale = scale, .causal = causal};
  if (bias.valid()) return op<OpKind::attention_grad>({q, k, v, out, lse, dout, bias}, a);
  return op<OpKind::attention_grad>({q, k, v, out, lse, dout}, a);
}

std::vector<Var> Builder::cross_entropy(Var logits, Var targets, int64_t classes) {
  const int64_t c = classes == logits.shape()[-1] ? 0 : classes;
  return op<OpKind::cross_entropy>({logits, targets}, {.classes = c});
}

Var Builder::cross_entropy_grad(Var logits, Var targets, Var lse, Var dloss, int64_t classes) {
  const int64_t c = classes == logits.shape()[-1] ? 0 : classes;
  return op<OpKind::cross_entropy_grad>({logits, targets, lse, dloss}, {.classes = c})[0];
}

}  // namespace tessera
