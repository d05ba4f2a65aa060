// Sources, elementwise arithmetic, activations and cast.
#include <cmath>

#include "ir/ops_common.h"
#include "ir/sharding_rules.h"

namespace tessera::ops_detail {

namespace {

// parameter and input (SourceAttrs), fill (FillAttrs): a tensor of the attributes' shape.
template <class T>
Status infer_source(const Attrs& attrs, std::span<const TensorType>, std::vector<TensorType>* out) {
  const T& a = attrs_as<T>(attrs);
  for (int64_t d : a.shape)
    if (d < 0) return error("negative dimension in shape");
  out->push_back({Shape(a.shape), a.dtype});
  return Status();
}

Status infer_binary(const Attrs&, std::span<const TensorType> in, std::vector<TensorType>* out) {
  TS_RETURN_IF_ERROR(same_dtype(in[0], in[1]));
  TS_RETURN_IF_ERROR(need_float(in[0], "operand"));
  Shape s;
  if (!broadcast_shapes(in[0].shape, in[1].shape, &s))
    return error("shapes " + in[0].shape.to_string() + " and " + in[1].shape.to_string() +
                 " do not broadcast");
  out->push_back({s, in[0].dtype});
  return Status();
}

Status infer_unary(const Attrs&, std::span<const TensorType> in, std::vector<TensorType>* out) {
  TS_RETURN_IF_ERROR(need_float(in[0], "input"));
  out->push_back(in[0]);
  return Status();
}

// Ops with several same-shaped inputs (x, dy) and one or more outputs shaped like them.
template <int kOutputs>
Status infer_same(const Attrs&, std::span<const TensorType> in, std::vector<TensorType>* out) {
  for (const TensorType& t : in) {
    TS_RETURN_IF_ERROR(need_float(t, "input"));
    if (t.shape != in[0].shape || t.dtype != in[0].dtype)
      return error("inputs must have one type, got " + in[0].to_string() + " and " + t.to_string());
  }
  for (int i = 0; i < kOutputs; ++i) out->push_back(in[0]);
  return Status();
}

Status infer_cast(const Attrs& a, std::span<const TensorType> in, std::vector<TensorType>* out) {
  out->push_back({in[0].shape, attrs_as<CastAttrs>(a).dtype});
  return Status();
}

template <int kPerElement>
double flops_per_element(const Attrs&, std::span<const TensorType>,
                         std::span<const TensorType> out) {
  return kPerElement * out_numel(out);
}

double no_bytes(const Attrs&, std::span<const TensorType>, std::span<const TensorType>) {
  return 0;
}
double out_bytes(const Attrs&, std::span<const TensorType>, std::span<const TensorType> out) {
  return static_cast<double>(out[0].bytes());
}

void vjp_add(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = b.sum_to(g[0], in_var(b, n, 0).shape());
  (*dx)[1] = b.sum_to(g[0], in_var(b, n, 1).shape());
}
void vjp_sub(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = b.sum_to(g[0], in_var(b, n, 0).shape());
  (*dx)[1] = b.sum_to(-g[0], in_var(b, n, 1).shape());
}
void vjp_mul(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  Var x = in_var(b, n, 0), y = in_var(b, n, 1);
  (*dx)[0] = b.sum_to(g[0] * y, x.shape());
  (*dx)[1] = b.sum_to(g[0] * x, y.shape());
}
void vjp_div(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  Var x = in_var(b, n, 0), y = in_var(b, n, 1), q = out_var(b, n, 0);
  (*dx)[0] = b.sum_to(g[0] / y, x.shape());
  (*dx)[1] = b.sum_to(-(g[0] * q / y), y.shape());
}
void vjp_scale(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = b.scale(g[0], n.attr<ScalarAttrs>().value);
}
void vjp_identity(Builder&, const Node&, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = g[0];
}
void vjp_exp(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = g[0] * out_var(b, n, 0);
}
void vjp_log(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = g[0] / in_var(b, n, 0);
}
void vjp_sqrt(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = (g[0] / out_var(b, n, 0)) * 0.5f;
}
void vjp_rsqrt(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  Var y = out_var(b, n, 0);
  (*dx)[0] = g[0] * (y * y * y) * -0.5f;
}
void vjp_tanh(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  Var y = out_var(b, n, 0);
  (*dx)[0] = g[0] * ((y * y) * -1.0f + 1.0f);
}
void vjp_gelu(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = b.gelu_grad(in_var(b, n, 0), g[0]);
}
void vjp_silu(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = b.silu_grad(in_var(b, n, 0), g[0]);
}
void vjp_relu(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = b.relu_grad(in_var(b, n, 0), g[0]);
}
void vjp_swiglu(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  std::vector<Var> d = b.swiglu_grad(in_var(b, n, 0), in_var(b, n, 1), g[0]);
  (*dx)[0] = d[0];
  (*dx)[1] = d[1];
}
void vjp_cast(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = b.cast(g[0], in_var(b, n, 0).dtype());
}

using P = Placement;
using Out = std::vector<Placement>;

// add/sub/mul/div with numpy broadcasting: sharded inputs must map to one output dim that the
// replicated inputs broadcast along (absent or of size 1).
bool binary(OpKind op, const ShardingRuleArgs& a, Out* out) {
  const P &x = a.p(0), &y = a.p(1);
  const int orank = a.out[0].shape.rank();
  if (x.is_partial() || y.is_partial()) {
    bool linear_both = op == OpKind::add || op == OpKind::sub;
    if (x.is_partial() && y.is_partial()) return linear_both && all_outputs(a, out, P::partial());
    // Partial times (or over) a replicated factor stays Partial.
    if (op == OpKind::mul && (x.is_replicate() || y.is_replicate()))
      return all_outputs(a, out, P::partial());
    if (op == OpKind::div && x.is_partial() && y.is_replicate())
      return all_outputs(a, out, P::partial());
    return false;
  }
  int odim = -1;
  for (int i = 0; i < 2; ++i) {
    const P& p = a.p(i);
    if (!p.is_shard()) continue;
    int d = p.dim + (orank - a.in[static_cast<size_t>(i)].shape.rank());
    if (a.in[static_cast<size_t>(i)].shape[p.dim] != a.out[0].shape[d]) return false;
    if (odim >= 0 && odim != d) return false;
    odim = d;
  }
  for (int i = 0; i < 2; ++i) {
    const P& p = a.p(i);
    if (!p.is_replicate()) continue;
    const Shape& s = a.in[static_cast<size_t>(i)].shape;
    int d = odim - (orank - s.rank());
    if (d >= 0 && s[d] != 1) return false;
  }
  return all_outputs(a, out, P::shard(odim));
}

template <OpKind K>
bool binary_rule(const ShardingRuleArgs& a, Out* out) {
  return binary(K, a, out);
}
}  // namespace

void define_elementwise_ops(OpDef* t) {
  def(t, OpKind::parameter).infer = infer_source<SourceAttrs>;
  def(t, OpKind::input).infer = infer_source<SourceAttrs>;
  def(t, OpKind::fill).infer = infer_source<FillAttrs>;
  def(t, OpKind::fill).bytes = out_bytes;
  def(t, OpKind::parameter).bytes = no_bytes;
  def(t, OpKind::input).bytes = no_bytes;

  struct Binary {
    OpKind kind;
    VjpFn vjp;
  };
  for (Binary op : {Binary{OpKind::add, vjp_add}, Binary{OpKind::sub, vjp_sub},
                    Binary{OpKind::mul, vjp_mul}, Binary{OpKind::div, vjp_div}}) {
    def(t, op.kind).infer = infer_binary;
    def(t, op.kind).flops = flops_per_element<1>;
    def(t, op.kind).vjp = op.vjp;
  }

  struct Unary {
    OpKind kind;
    CostFn flops;
    VjpFn vjp;
  };
  for (Unary op : {Unary{OpKind::scale, flops_per_element<1>, vjp_scale},
                   Unary{OpKind::add_scalar, flops_per_element<1>, vjp_identity},
                   Unary{OpKind::exp, flops_per_element<1>, vjp_exp},
                   Unary{OpKind::log, flops_per_element<1>, vjp_log},
                   Unary{OpKind::sqrt, flops_per_element<1>, vjp_sqrt},
                   Unary{OpKind::rsqrt, flops_per_element<2>, vjp_rsqrt},
                   Unary{OpKind::tanh, flops_per_element<1>, vjp_tanh},
                   Unary{OpKind::gelu, flops_per_element<8>, vjp_gelu},
                   Unary{OpKind::silu, flops_per_element<4>, vjp_silu},
                   Unary{OpKind::relu, flops_per_element<1>, vjp_relu}}) {
    def(t, op.kind).infer = infer_unary;
    def(t, op.kind).flops = op.flops;
    def(t, op.kind).vjp = op.vjp;
  }

  def(t, OpKind::gelu_grad).infer = infer_same<1>;
  def(t, OpKind::gelu_grad).flops = flops_per_element<12>;
  def(t, OpKind::gelu_grad).gradient_of = "gelu";
  def(t, OpKind::silu_grad).infer = infer_same<1>;
  def(t, OpKind::silu_grad).flops = flops_per_element<6>;
  def(t, OpKind::silu_grad).gradient_of = "silu";
  def(t, OpKind::relu_grad).infer = infer_same<1>;
  def(t, OpKind::relu_grad).flops = flops_per_element<1>;
  def(t, OpKind::relu_grad).gradient_of = "relu";
  def(t, OpKind::swiglu).infer = infer_same<1>;
  def(t, OpKind::swiglu).flops = flops_per_element<5>;
  def(t, OpKind::swiglu).vjp = vjp_swiglu;
  def(t, OpKind::swiglu_grad).infer = infer_same<2>;
  def(t, OpKind::swiglu_grad).flops = flops_per_element<10>;
  def(t, OpKind::swiglu_grad).gradient_of = "swiglu";

  def(t, OpKind::cast).infer = infer_cast;
  def(t, OpKind::cast).vjp = vjp_cast;

  // Sharding along one mesh axis (ir/sharding_rules.h).
  def(t, OpKind::add).sharding = binary_rule<OpKind::add>;
  def(t, OpKind::sub).sharding = binary_rule<OpKind::sub>;
  def(t, OpKind::mul).sharding = binary_rule<OpKind::mul>;
  def(t, OpKind::div).sharding = binary_rule<OpKind::div>;
  def(t, OpKind::scale).sharding = linear_unary;
  def(t, OpKind::cast).sharding = linear_unary;
  for (OpKind k : {OpKind::add_scalar, OpKind::exp, OpKind::log, OpKind::sqrt, OpKind::rsqrt,
                   OpKind::tanh, OpKind::gelu, OpKind::silu, OpKind::relu})
    def(t, k).sharding = elementwise_unary;
  for (OpKind k : {OpKind::gelu_grad, OpKind::silu_grad, OpKind::relu_grad, OpKind::swiglu,
                   OpKind::swiglu_grad})
    def(t, k).sharding = same_shape;
}

}  // namespace tessera::ops_detail
