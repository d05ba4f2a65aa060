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

Var Builder::parameter(const std::string& name, Shape shape, Init init, double std, DType dtype) {
  Attrs a;
  a.name = scope_.empty() ? name : scope_ + "." + name;
  a.ints = shape.dims();
  a.init = init;
  a.init_std = std;
  a.dtype = dtype == DType::f32 ? param_dtype_ : dtype;
  return apply1(OpKind::parameter, a, {});
}

Var Builder::input(const std::string& name, Shape shape, DType dtype) {
  Attrs a;
  a.name = name;
  a.ints = shape.dims();
  a.dtype = dtype;
  return apply1(OpKind::input, a, {});
}

Var Builder::fill(Shape shape, double value, DType dtype) {
  Attrs a;
  a.ints = shape.dims();
  a.scalar = value;
  a.dtype = dtype;
  return apply1(OpKind::fill, a, {});
}

Var Builder::add(Var a, Var b) { return apply1(OpKind::add, {}, {a, b}); }
Var Builder::sub(Var a, Var b) { return apply1(OpKind::sub, {}, {a, b}); }
Var Builder::mul(Var a, Var b) { return apply1(OpKind::mul, {}, {a, b}); }
Var Builder::div(Var a, Var b) { return apply1(OpKind::div, {}, {a, b}); }

Var Builder::scale(Var x, double s) {
  Attrs a;
  a.scalar = s;
  return apply1(OpKind::scale, a, {x});
}

Var Builder::add_scalar(Var x, double s) {
  Attrs a;
  a.scalar = s;
  return apply1(OpKind::add_scalar, a, {x});
}

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
  Attrs a;
  a.ints = std::move(axes);
  a.keepdim = keepdim;
  return apply1(OpKind::reduce_sum, a, {x});
}

Var Builder::sum_to(Var x, const Shape& shape) {
  if (x.shape() == shape) return x;
  Attrs a;
  a.ints = shape.dims();
  return apply1(OpKind::sum_to, a, {x});
}

Var Builder::broadcast_to(Var x, const Shape& shape) {
  if (x.shape() == shape) return x;
  Attrs a;
  a.ints = shape.dims();
  return apply1(OpKind::broadcast_to, a, {x});
}

Var Builder::reshape(Var x, const Shape& shape) {
  if (x.shape() == shape) return x;
  Attrs a;
  a.ints = shape.dims();
  return apply1(OpKind::reshape, a, {x});
}

Var Builder::transpose(Var x, std::vector<int64_t> perm) {
  Attrs a;
  a.ints = std::move(perm);
  return apply1(OpKind::transpose, a, {x});
}

Var Builder::slice(Var x, int axis, int64_t start, int64_t end) {
  Attrs a;
  a.axis = axis;
  a.start = start;
  a.end = end;
  return apply1(OpKind::slice, a, {x});
}

Var Builder::concat(const std::vector<Var>& xs, int axis) {
  Attrs a;
  a.axis = axis;
  return apply1(OpKind::concat, a, xs);
}

Var Builder::cast(Var x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Attrs a;
  a.dtype = dtype;
  return apply1(OpKind::cast, a, {x});
}

Var Builder::matmul(Var a, Var b, bool transpose_a, bool transpose_b) {
  Attrs at;
  at.transpose_a = transpose_a;
  at.transpose_b = transpose_b;
  return apply1(OpKind::matmul, at, {a, b});
}

Var Builder::linear(Var x, Var w, Var bias) {
  Var y = matmul(x, w, false, true);
  return bias.valid() ? y + bias : y;
}

Var Builder::embedding(Var table, Var ids) { return apply1(OpKind::embedding, {}, {table, ids}); }

Var Builder::embedding_grad(Var dy, Var ids, int64_t vocab) {
  Attrs a;
  a.vocab = vocab;
  return apply1(OpKind::embedding_grad, a, {dy, ids});
}

std::vector<Var> Builder::layernorm(Var x, Var w, Var bias, double eps) {
  Attrs a;
  a.eps = eps;
  return apply(OpKind::layernorm, a, {x, w, bias});
}

std::vector<Var> Builder::layernorm_grad(Var dy, Var x, Var w, Var mean, Var rstd) {
  return apply(OpKind::layernorm_grad, {}, {dy, x, w, mean, rstd});
}

std::vector<Var> Builder::rmsnorm(Var x, Var w, double eps) {
  Attrs a;
  a.eps = eps;
  return apply(OpKind::rmsnorm, a, {x, w});
}

std::vector<Var> Builder::rmsnorm_grad(Var dy, Var x, Var w, Var rstd) {
  return apply(OpKind::rmsnorm_grad, {}, {dy, x, w, rstd});
}

Var Builder::rope(Var x, double theta, bool inverse) {
  Attrs a;
  a.theta = theta;
  a.inverse = inverse;
  return apply1(OpKind::rope, a, {x});
}

Var Builder::softmax(Var x) { return apply1(OpKind::softmax, {}, {x}); }
Var Builder::softmax_grad(Var y, Var dy) { return apply1(OpKind::softmax_grad, {}, {y, dy}); }

Var Builder::causal_mask(Var scores, double fill) {
  Attrs a;
  a.scalar = fill;
  return apply1(OpKind::causal_mask, a, {scores});
}

Var Builder::position_buckets(int64_t tq, int64_t tk, bool bidirectional, int64_t num_buckets,
                              int64_t max_distance) {
  Attrs a;
  a.ints = {tq, tk, num_buckets, max_distance};
  a.causal = !bidirectional;
  a.dtype = DType::i32;
  return apply1(OpKind::position_buckets, a, {});
}

std::vector<Var> Builder::attention(Var q, Var k, Var v, double scale, bool causal, Var bias) {
  Attrs a;
  a.scalar = scale;
  a.causal = causal;
  if (bias.valid()) return apply(OpKind::attention, a, {q, k, v, bias});
  return apply(OpKind::attention, a, {q, k, v});
}

std::vector<Var> Builder::attention_grad(Var q, Var k, Var v, Var out, Var lse, Var dout,
                                         double scale, bool causal, Var bias) {
  Attrs a;
  a.scalar = scale;
  a.causal = causal;
  if (bias.valid()) return apply(OpKind::attention_grad, a, {q, k, v, out, lse, dout, bias});
  return apply(OpKind::attention_grad, a, {q, k, v, out, lse, dout});
}

std::vector<Var> Builder::cross_entropy(Var logits, Var targets, int64_t classes) {
  Attrs a;
  a.vocab = classes == logits.shape()[-1] ? 0 : classes;
  return apply(OpKind::cross_entropy, a, {logits, targets});
}

Var Builder::cross_entropy_grad(Var logits, Var targets, Var lse, Var dloss, int64_t classes) {
  Attrs a;
  a.vocab = classes == logits.shape()[-1] ? 0 : classes;
  return apply1(OpKind::cross_entropy_grad, a, {logits, targets, lse, dloss});
}

}  // namespace tessera
