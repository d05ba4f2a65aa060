// Fused ops. GEMM epilogues: one matrix product and the elementwise work that follows it, in one
// op, so that a kernel writes the result once (cuBLASLt's epilogues on a GPU; one pass after the
// GEMM on the CPU). The fusion pass (parallel/fuse.h) makes them of a rank's local graph, after
// autodiff and partitioning; model code never builds them.
//
//   matmul_bias(a, b, bias [N])      -> matmul(a, b) + bias, the bias along the last dim
//   matmul_bias_gelu(a, b, bias [N]) -> (gelu(pre), pre) with pre = matmul(a, b) + bias; pre is
//                                       what gelu_grad reads in the backward pass
//   matmul_dgelu_bgrad(dy, b, pre)   -> (d, db): d = gelu_grad(pre, matmul(dy, b)) and db, d
//                                       summed over every dim but the last: the bias gradient
//                                       of the product that made pre
//   matmul_bgrad(dy, x)              -> (matmul(dy, x), db) of a batch-folding product
//                                       (transpose_a, fold_batch: a weight gradient) and db,
//                                       dy summed over every dim but the last: the bias
//                                       gradient beside the weight's
//
// MatmulAttrs as matmul's (fold_batch only for matmul_bgrad, which needs it).
//
// And a residual add fused with the layernorm that reads its sum, forward and backward:
//   add_layernorm(x, y, w, b) {eps}       -> (s, layernorm(s, w, b)...) with s = x + y: the sum
//                                            (the residual stream), the normalized rows, mean,
//                                            rstd
//   layernorm_grad_add(dy, x, w, mean, rstd, dres)
//                                         -> (dres + dx, dw, db) of layernorm_grad: the residual
//                                            stream's gradient with the norm's added
//   add_rmsnorm(x, y, w) {eps}, rmsnorm_grad_add(dy, x, w, rstd, dres): the same for rmsnorm
//
// The epilogues' sharding rules are matmul's, with the epilogue's constraints: a product summed
// over the split contraction (Partial) takes no bias, since the bias would be added once per
// rank. The norms' are layernorm's row-wise rule, the residual split as x.
#include "ir/ops_common.h"
#include "ir/sharding_rules.h"

namespace tessera::ops_detail {

namespace {

using P = Placement;
using Out = std::vector<Placement>;

// The product's type (matmul's inference on inputs 0 and 1).
Status infer_product(const Attrs& attrs, std::span<const TensorType> in, const char* op,
                     TensorType* product) {
  if (attrs_as<MatmulAttrs>(attrs).fold_batch)
    return error(std::string(op) + " does not take a batch-folding product");
  std::vector<TensorType> out;
  TS_RETURN_IF_ERROR(infer_matmul(attrs, in.first(2), &out));
  *product = out[0];
  return Status();
}

Status need_bias(const TensorType& bias, const TensorType& product, const char* op) {
  const int64_t n = product.shape[-1];
  if (bias.shape != Shape{n} || bias.dtype != product.dtype)
    return error(std::string(op) + " needs a bias " +
                 TensorType{Shape{n}, product.dtype}.to_string() + ", got " + bias.to_string());
  return Status();
}

// The product with its bias [N] added: the product's type.
Status biased_product(const Attrs& attrs, std::span<const TensorType> in, const char* op,
                      std::vector<TensorType>* out) {
  TensorType y;
  TS_RETURN_IF_ERROR(infer_product(attrs, in, op, &y));
  TS_RETURN_IF_ERROR(need_bias(in[2], y, op));
  out->push_back(y);
  return Status();
}

Status infer_matmul_bias(const Attrs& attrs, std::span<const TensorType> in,
                         std::vector<TensorType>* out) {
  return biased_product(attrs, in, "matmul_bias", out);
}

// gelu(pre), then pre: the biased product's type twice.
Status infer_matmul_bias_gelu(const Attrs& attrs, std::span<const TensorType> in,
                              std::vector<TensorType>* out) {
  TS_RETURN_IF_ERROR(biased_product(attrs, in, "matmul_bias_gelu", out));
  out->push_back(out->back());
  return Status();
}

Status infer_matmul_dgelu_bgrad(const Attrs& attrs, std::span<const TensorType> in,
                                std::vector<TensorType>* out) {
  TensorType d;
  TS_RETURN_IF_ERROR(infer_product(attrs, in, "matmul_dgelu_bgrad", &d));
  if (in[2].shape != d.shape || in[2].dtype != d.dtype)
    return error("matmul_dgelu_bgrad needs pre shaped as the product " + d.to_string() + ", got " +
                 in[2].to_string());
  out->push_back(d);
  out->push_back({Shape{d.shape[-1]}, d.dtype});
  return Status();
}

Status infer_matmul_bgrad(const Attrs& attrs, std::span<const TensorType> in,
                          std::vector<TensorType>* out) {
  const MatmulAttrs& m = attrs_as<MatmulAttrs>(attrs);
  if (!m.fold_batch || !m.transpose_a)
    return error("matmul_bgrad takes a batch-folding product with transpose_a (a weight gradient)");
  TS_RETURN_IF_ERROR(infer_matmul(attrs, in, out));
  out->push_back({Shape{in[0].shape[-1]}, in[0].dtype});
  return Status();
}

// A residual norm: x + y (one type), then the norm of the sum with the weights in[2..]. The
// sum is output 0, the norm's outputs follow.
Status infer_add_norm(InferFn norm, const char* op, const Attrs& attrs,
                      std::span<const TensorType> in, std::vector<TensorType>* out) {
  if (in[0].shape != in[1].shape || in[0].dtype != in[1].dtype)
    return error(std::string(op) + " needs x and y of one type, got " + in[0].to_string() +
                 " and " + in[1].to_string());
  out->push_back(in[0]);  // s
  std::vector<TensorType> args = {in[0]};
  args.insert(args.end(), in.begin() + 2, in.end());
  return norm(attrs, args, out);
}

// A norm's gradient, then dres (the last input, shaped as x) added to dx.
Status infer_norm_grad_add(InferFn grad, const char* op, const Attrs& attrs,
                           std::span<const TensorType> in, std::vector<TensorType>* out) {
  TS_RETURN_IF_ERROR(grad(attrs, in.first(in.size() - 1), out));
  const TensorType& dres = in.back();
  if (dres.shape != in[1].shape || dres.dtype != (*out)[0].dtype)
    return error(std::string(op) + " needs dres shaped as x " + in[1].to_string() + ", got " +
                 dres.to_string());
  return Status();
}

Status infer_add_layernorm(const Attrs& a, std::span<const TensorType> in,
                           std::vector<TensorType>* out) {
  return infer_add_norm(infer_layernorm, "add_layernorm", a, in, out);
}
Status infer_layernorm_grad_add(const Attrs& a, std::span<const TensorType> in,
                                std::vector<TensorType>* out) {
  return infer_norm_grad_add(infer_layernorm_grad, "layernorm_grad_add", a, in, out);
}
Status infer_add_rmsnorm(const Attrs& a, std::span<const TensorType> in,
                         std::vector<TensorType>* out) {
  return infer_add_norm(infer_rmsnorm, "add_rmsnorm", a, in, out);
}
Status infer_rmsnorm_grad_add(const Attrs& a, std::span<const TensorType> in,
                              std::vector<TensorType>* out) {
  return infer_norm_grad_add(infer_rmsnorm_grad, "rmsnorm_grad_add", a, in, out);
}

// The product's FLOPs plus `per_element` for each of its elements.
template <int kPerElement>
double flops_epilogue(const Attrs& attrs, std::span<const TensorType> in,
                      std::span<const TensorType> out) {
  return flops_matmul(attrs, in, out.first(1)) + kPerElement * out_numel(out);
}

// matmul_bgrad: the weight gradient's product, and an add per element of dy for the sum.
double flops_bgrad(const Attrs& attrs, std::span<const TensorType> in,
                   std::span<const TensorType> out) {
  return flops_matmul(attrs, in, out.first(1)) + static_cast<double>(in[0].shape.numel());
}

// The placement of the product, matmul's rule on inputs 0 and 1; false where matmul has none.
bool product_placement(const ShardingRuleArgs& a, P* product) {
  Out o;
  const ShardingRuleArgs m{a.attrs, a.in.first(2), a.out.first(1), a.placements.first(2)};
  if (!matmul_sharding(m, &o)) return false;
  *product = o[0];
  return true;
}

// matmul_bias, matmul_bias_gelu: a bias split like the product's last dim, else whole.
bool bias_epilogue(const ShardingRuleArgs& a, Out* out) {
  P y;
  if (!product_placement(a, &y) || y.is_partial()) return false;
  const int last = a.out[0].shape.rank() - 1;
  const bool split_cols = y.is_shard(last);
  if (split_cols ? !a.p(2).is_shard(0) : !a.p(2).is_replicate()) return false;
  return all_outputs(a, out, y);
}

// matmul_dgelu_bgrad: pre split as the product; the bias gradient split on the product's last
// dim, or Partial when the product's rows are split.
bool dgelu_bgrad(const ShardingRuleArgs& a, Out* out) {
  P d;
  if (!product_placement(a, &d) || d.is_partial() || !(a.p(2) == d)) return false;
  const int last = a.out[0].shape.rank() - 1;
  out->assign({d, d.is_replicate() ? d : d.is_shard(last) ? P::shard(0) : P::partial()});
  return true;
}

// matmul_bgrad: matmul's rule for the weight gradient; the bias gradient splits with dy's last
// dim, is Partial where dy's rows are split (as the weight gradient is), else whole.
bool bgrad(const ShardingRuleArgs& a, Out* out) {
  P dw;
  if (!product_placement(a, &dw)) return false;
  const P& dy = a.p(0);
  const int last = a.in[0].shape.rank() - 1;
  const P db = dy.is_shard(last) ? P::shard(0) : dy.is_replicate() ? dy : P::partial();
  if (dy.is_partial() && !dw.is_partial()) return false;
  out->assign({dw, db});
  return true;
}

// The fused norms: layernorm's row-wise rule, the residual's operands split as x.
bool add_layernorm(const ShardingRuleArgs& a, Out* out) { return rowwise(a, out, {0, 1}, 4); }
bool layernorm_grad_add(const ShardingRuleArgs& a, Out* out) {
  return rowwise(a, out, {0, 1, 3, 4, 5}, 1);
}
bool add_rmsnorm(const ShardingRuleArgs& a, Out* out) { return rowwise(a, out, {0, 1}, 3); }
bool rmsnorm_grad_add(const ShardingRuleArgs& a, Out* out) {
  return rowwise(a, out, {0, 1, 3, 4}, 1);
}

}  // namespace

void define_fused_ops(OpDef* t) {
  def(t, OpKind::matmul_bias).infer = infer_matmul_bias;
  def(t, OpKind::matmul_bias).flops = flops_epilogue<1>;
  def(t, OpKind::matmul_bias).sharding = bias_epilogue;
  def(t, OpKind::matmul_bias_gelu).infer = infer_matmul_bias_gelu;
  def(t, OpKind::matmul_bias_gelu).flops = flops_epilogue<9>;  // bias, gelu's 8
  def(t, OpKind::matmul_bias_gelu).sharding = bias_epilogue;
  def(t, OpKind::matmul_dgelu_bgrad).infer = infer_matmul_dgelu_bgrad;
  def(t, OpKind::matmul_dgelu_bgrad).flops = flops_epilogue<13>;  // gelu_grad's 12, the sum
  def(t, OpKind::matmul_dgelu_bgrad).sharding = dgelu_bgrad;
  def(t, OpKind::matmul_bgrad).infer = infer_matmul_bgrad;
  def(t, OpKind::matmul_bgrad).flops = flops_bgrad;
  def(t, OpKind::matmul_bgrad).sharding = bgrad;
  def(t, OpKind::add_layernorm).infer = infer_add_layernorm;
  def(t, OpKind::add_layernorm).flops = flops_in0<9>;  // the add, layernorm's 8
  def(t, OpKind::add_layernorm).sharding = add_layernorm;
  def(t, OpKind::layernorm_grad_add).infer = infer_layernorm_grad_add;
  def(t, OpKind::layernorm_grad_add).flops = flops_in0<13>;  // layernorm_grad's 12, the add
  def(t, OpKind::layernorm_grad_add).sharding = layernorm_grad_add;
  def(t, OpKind::add_rmsnorm).infer = infer_add_rmsnorm;
  def(t, OpKind::add_rmsnorm).flops = flops_in0<6>;  // the add, rmsnorm's 5
  def(t, OpKind::add_rmsnorm).sharding = add_rmsnorm;
  def(t, OpKind::rmsnorm_grad_add).infer = infer_rmsnorm_grad_add;
  def(t, OpKind::rmsnorm_grad_add).flops = flops_in0<10>;  // rmsnorm_grad's 9, the add
  def(t, OpKind::rmsnorm_grad_add).sharding = rmsnorm_grad_add;
}

}  // namespace tessera::ops_detail

namespace tessera {

bool is_gemm(OpKind k) {
  return k == OpKind::matmul || k == OpKind::matmul_bias || k == OpKind::matmul_bias_gelu ||
         k == OpKind::matmul_dgelu_bgrad || k == OpKind::matmul_bgrad;
}

}  // namespace tessera
