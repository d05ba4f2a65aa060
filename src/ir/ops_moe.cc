// Mixture-of-experts routing ops. A MoE layer (models/moe.cc) routes each of N tokens to k of E
// experts, each expert computing on a buffer of `capacity` token slots:
//
//   top_k(logits [N,E])              -> values [N,k], indices i32 [N,k]: the k largest router
//                                       logits of each token, decreasing
//   top_k_grad(dvalues, indices)     -> [N,E]: dvalues at their indices, zeros elsewhere
//   moe_slots(indices [N,k])         -> slots i32 [N,k]: where each (token, choice) sits in the
//                                       experts' buffer, expert * capacity + position, or -1
//                                       when its expert is full (the token is dropped there).
//                                       Positions go to every token's first choice first (in
//                                       token order), then to the second choices, and so on.
//   moe_dispatch(x [N,D], slots[, w [N,k]])
//                                    -> [E, capacity, D]: row x[n] (times w[n,j]) in slot
//                                       slots[n,j]; empty slots zero
//   moe_combine(y [E,C,D], slots[, w])
//                                    -> [N,D]: sum over j of (w[n,j] *) y[slots[n,j]]
//   moe_combine_grad(a [N,D], y [E,C,D], slots)
//                                    -> [N,k]: dot(a[n], y[slots[n,j]]) (0 for a dropped one)
//
// Split over the tokens (data and expert parallelism: every input's token dim Shard(0)), each
// rank routes its own tokens into a buffer of capacity / n slots per expert: the buffer is
// Shard(1), its slots those of the rank's tokens. The capacity is then per rank, as in GShard's
// and Switch's local dispatch: with no token dropped the result is the whole batch's exactly;
// a rank whose tokens crowd one expert drops more than the whole batch would.
#include "ir/ops_common.h"
#include "ir/sharding_rules.h"

namespace tessera::ops_detail {

namespace {

using P = Placement;
using Out = std::vector<Placement>;

Status need_i32(const TensorType& t, const char* what) {
  if (t.dtype != DType::i32) return error(std::string(what) + " must be i32, got " + t.to_string());
  return Status();
}

Status need_moe(const MoeAttrs& m) {
  if (m.experts <= 0 || m.capacity <= 0)
    return error("moe ops need experts > 0 and capacity > 0, got " + std::to_string(m.experts) +
                 " and " + std::to_string(m.capacity));
  if (m.experts > (int64_t{1} << 31) / m.capacity)  // slots are i32
    return error("moe ops index experts x capacity = " + std::to_string(m.experts) + " x " +
                 std::to_string(m.capacity) + " slots, over 2^31");
  return Status();
}

// slots [N, k] i32 and, when given, weights [N, k] of float.
Status need_routes(const TensorType& slots, const TensorType* w) {
  TS_RETURN_IF_ERROR(need_i32(slots, "moe slots"));
  if (slots.shape.rank() != 2) return error("moe slots must be [N, k], got " + slots.to_string());
  if (w == nullptr) return Status();
  TS_RETURN_IF_ERROR(need_float(*w, "moe weights"));
  if (w->shape != slots.shape)
    return error("moe weights " + w->to_string() + " must be shaped as the slots " +
                 slots.to_string());
  return Status();
}

Status infer_top_k(const Attrs& attrs, std::span<const TensorType> in,
                   std::vector<TensorType>* out) {
  const TopKAttrs& a = attrs_as<TopKAttrs>(attrs);
  TS_RETURN_IF_ERROR(need_float(in[0], "top_k operand"));
  const Shape& s = in[0].shape;
  if (s.rank() < 1 || a.k < 1 || a.k > s[-1])
    return error("top_k needs 1 <= k <= the last dim, got k = " + std::to_string(a.k) + " of " +
                 in[0].to_string());
  const Shape o = s.with_dim(s.rank() - 1, a.k);
  out->push_back({o, in[0].dtype});
  out->push_back({o, DType::i32});
  return Status();
}

void vjp_top_k(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  const int64_t width =
      n.attr<TopKAttrs>().n > 0 ? n.attr<TopKAttrs>().n : b.graph().type(n.inputs[0]).shape[-1];
  (*dx)[0] = b.op<OpKind::top_k_grad>({g[0], out_var(b, n, 1)},
                                      {.k = n.attr<TopKAttrs>().k, .n = width})[0];
}

Status infer_top_k_grad(const Attrs& attrs, std::span<const TensorType> in,
                        std::vector<TensorType>* out) {
  const TopKAttrs& a = attrs_as<TopKAttrs>(attrs);
  TS_RETURN_IF_ERROR(need_float(in[0], "top_k_grad gradient"));
  TS_RETURN_IF_ERROR(need_i32(in[1], "top_k_grad indices"));
  const Shape& s = in[0].shape;
  if (s != in[1].shape || s.rank() < 1 || s[-1] != a.k || a.n < a.k)
    return error("top_k_grad needs values and indices [..., k] and n >= k, got " +
                 in[0].to_string() + ", " + in[1].to_string() + ", n = " + std::to_string(a.n));
  out->push_back({s.with_dim(s.rank() - 1, a.n), in[0].dtype});
  return Status();
}

Status infer_moe_slots(const Attrs& attrs, std::span<const TensorType> in,
                       std::vector<TensorType>* out) {
  TS_RETURN_IF_ERROR(need_moe(attrs_as<MoeAttrs>(attrs)));
  TS_RETURN_IF_ERROR(need_routes(in[0], nullptr));
  out->push_back({in[0].shape, DType::i32});
  return Status();
}

Status infer_moe_dispatch(const Attrs& attrs, std::span<const TensorType> in,
                          std::vector<TensorType>* out) {
  const MoeAttrs& m = attrs_as<MoeAttrs>(attrs);
  TS_RETURN_IF_ERROR(need_moe(m));
  if (in.size() != 2 && in.size() != 3)
    return error("moe_dispatch takes x, slots and optional weights");
  TS_RETURN_IF_ERROR(need_float(in[0], "moe_dispatch input"));
  TS_RETURN_IF_ERROR(need_routes(in[1], in.size() == 3 ? &in[2] : nullptr));
  if (in[0].shape.rank() != 2 || in[0].shape[0] != in[1].shape[0])
    return error("moe_dispatch needs x [N, D] for slots [N, k], got " + in[0].to_string() +
                 " and " + in[1].to_string());
  out->push_back({Shape{m.experts, m.capacity, in[0].shape[1]}, in[0].dtype});
  return Status();
}

// y [E, C, D] with routes [N, k] -> [N, D] (combine), or with a [N, D] -> [N, k] (its grad).
Status check_buffer(const TensorType& y, const TensorType& slots, int64_t rows, int64_t width) {
  TS_RETURN_IF_ERROR(need_float(y, "moe expert outputs"));
  if (y.shape.rank() != 3 || y.shape[2] != width || slots.shape[0] != rows)
    return error("moe ops need expert outputs [E, C, D] for tokens [N, D] and slots [N, k], got " +
                 y.to_string() + " and " + slots.to_string());
  return Status();
}

Status infer_moe_combine(const Attrs&, std::span<const TensorType> in,
                         std::vector<TensorType>* out) {
  if (in.size() != 2 && in.size() != 3)
    return error("moe_combine takes y, slots and optional weights");
  TS_RETURN_IF_ERROR(need_routes(in[1], in.size() == 3 ? &in[2] : nullptr));
  if (in[0].shape.rank() != 3)
    return error("moe_combine needs y [E, C, D], got " + in[0].to_string());
  TS_RETURN_IF_ERROR(check_buffer(in[0], in[1], in[1].shape[0], in[0].shape[2]));
  out->push_back({Shape{in[1].shape[0], in[0].shape[2]}, in[0].dtype});
  return Status();
}

Status infer_moe_combine_grad(const Attrs&, std::span<const TensorType> in,
                              std::vector<TensorType>* out) {
  TS_RETURN_IF_ERROR(need_float(in[0], "moe_combine_grad gradient"));
  TS_RETURN_IF_ERROR(need_routes(in[2], nullptr));
  if (in[0].shape.rank() != 2)
    return error("moe_combine_grad needs a [N, D], got " + in[0].to_string());
  TS_RETURN_IF_ERROR(check_buffer(in[1], in[2], in[0].shape[0], in[0].shape[1]));
  out->push_back({in[2].shape, in[0].dtype});
  return Status();
}

// FLOPs: a multiply-add per element moved (weighted), per dot-product element.
double flops_dispatch(const Attrs&, std::span<const TensorType> in, std::span<const TensorType>) {
  return in.size() == 3 ? static_cast<double>(in[1].shape.numel() * in[0].shape[1]) : 0.0;
}
double flops_combine(const Attrs&, std::span<const TensorType> in, std::span<const TensorType>) {
  return (in.size() == 3 ? 2.0 : 1.0) * static_cast<double>(in[1].shape.numel() * in[0].shape[2]);
}
double flops_combine_grad(const Attrs&, std::span<const TensorType> in,
                          std::span<const TensorType>) {
  return 2.0 * static_cast<double>(in[2].shape.numel() * in[0].shape[1]);
}

// dispatch and combine are each other's transpose: the gradient of one is the other with the
// same weights (or none), and a weight's gradient is moe_combine_grad.
void vjp_moe_dispatch(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  const MoeAttrs& m = n.attr<MoeAttrs>();
  Var x = in_var(b, n, 0), slots = in_var(b, n, 1);
  std::vector<Var> ins = {g[0], slots};
  if (n.inputs.size() == 3) ins.push_back(in_var(b, n, 2));
  (*dx)[0] = b.op<OpKind::moe_combine>(ins, m)[0];
  if (n.inputs.size() == 3) (*dx)[2] = b.op<OpKind::moe_combine_grad>({x, g[0], slots}, m)[0];
}

void vjp_moe_combine(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  MoeAttrs m = n.attr<MoeAttrs>();
  Var y = in_var(b, n, 0), slots = in_var(b, n, 1);
  m.experts = y.shape()[0];
  m.capacity = y.shape()[1];
  std::vector<Var> ins = {g[0], slots};
  if (n.inputs.size() == 3) ins.push_back(in_var(b, n, 2));
  (*dx)[0] = b.op<OpKind::moe_dispatch>(ins, m)[0];
  if (n.inputs.size() == 3) (*dx)[2] = b.op<OpKind::moe_combine_grad>({g[0], y, slots}, m)[0];
}

// ---- sharding rules ---------------------------------------------------------------------

// top_k: rows split (any dim but the last) stay split.
bool top_k(const ShardingRuleArgs& a, Out* out) {
  const P& x = a.p(0);
  return x.is_shard() && x.dim < a.in[0].shape.rank() - 1 && all_outputs(a, out, x);
}

// top_k_grad(dvalues, indices): rows split alike; a Partial gradient scatters to a Partial.
bool top_k_grad(const ShardingRuleArgs& a, Out* out) {
  const P &d = a.p(0), &i = a.p(1);
  if (d.is_partial() && i.is_replicate()) return all_outputs(a, out, d);
  return d.is_shard() && d.dim < a.in[0].shape.rank() - 1 && i == d && all_outputs(a, out, d);
}

// moe_slots: tokens split -> each rank's slots in its own capacity / n (the file comment).
bool moe_slots(const ShardingRuleArgs& a, Out* out) {
  return a.p(0).is_shard(0) && all_outputs(a, out, a.p(0));
}

// Whether inputs [from, size) (routes) are all Shard(0) (the tokens split) or all Replicate.
bool routes_are(const ShardingRuleArgs& a, size_t from, const P& want) {
  for (size_t i = from; i < a.placements.size(); ++i)
    if (!(a.placements[i] == want)) return false;
  return true;
}

// moe_dispatch(x [N,D], slots[, w]): tokens split -> the buffer's slots split (Shard(1)); x split
// on D (routes whole) -> Shard(2); x Partial (routes whole) -> Partial.
bool moe_dispatch(const ShardingRuleArgs& a, Out* out) {
  const P& x = a.p(0);
  if (x.is_shard(0) && routes_are(a, 1, x)) return all_outputs(a, out, P::shard(1));
  if (!routes_are(a, 1, P::replicate())) return false;
  if (x.is_shard(1)) return all_outputs(a, out, P::shard(2));
  return x.is_partial() && all_outputs(a, out, x);
}

// moe_combine(y [E,C,D], slots, w): y's slots split with the tokens -> Shard(0); y split on D or
// Partial (routes whole) -> Shard(1) or Partial.
bool moe_combine(const ShardingRuleArgs& a, Out* out) {
  const P& y = a.p(0);
  if (y.is_shard(1) && routes_are(a, 1, P::shard(0))) return all_outputs(a, out, P::shard(0));
  if (!routes_are(a, 1, P::replicate())) return false;
  if (y.is_shard(2)) return all_outputs(a, out, P::shard(1));
  return y.is_partial() && all_outputs(a, out, y);
}

// moe_combine_grad(a [N,D], y [E,C,D], slots): tokens split -> Shard(0); D split on both
// (slots whole) -> a Partial dot product.
bool moe_combine_grad(const ShardingRuleArgs& a, Out* out) {
  const P &x = a.p(0), &y = a.p(1), &s = a.p(2);
  if (x.is_shard(0) && y.is_shard(1) && s.is_shard(0)) return all_outputs(a, out, x);
  if (x.is_shard(1) && y.is_shard(2) && s.is_replicate()) return all_outputs(a, out, P::partial());
  return false;
}

}  // namespace

void define_moe_ops(OpDef* t) {
  def(t, OpKind::top_k).infer = infer_top_k;
  def(t, OpKind::top_k).vjp = vjp_top_k;
  def(t, OpKind::top_k_grad).infer = infer_top_k_grad;
  def(t, OpKind::top_k_grad).gradient_of = "top_k";
  def(t, OpKind::moe_slots).infer = infer_moe_slots;
  def(t, OpKind::moe_dispatch).infer = infer_moe_dispatch;
  def(t, OpKind::moe_dispatch).flops = flops_dispatch;
  def(t, OpKind::moe_dispatch).vjp = vjp_moe_dispatch;
  def(t, OpKind::moe_combine).infer = infer_moe_combine;
  def(t, OpKind::moe_combine).flops = flops_combine;
  def(t, OpKind::moe_combine).vjp = vjp_moe_combine;
  def(t, OpKind::moe_combine_grad).infer = infer_moe_combine_grad;
  def(t, OpKind::moe_combine_grad).flops = flops_combine_grad;
  def(t, OpKind::moe_combine_grad).gradient_of = "moe_combine";

  def(t, OpKind::top_k).sharding = top_k;
  def(t, OpKind::top_k_grad).sharding = top_k_grad;
  def(t, OpKind::moe_slots).sharding = moe_slots;
  def(t, OpKind::moe_dispatch).sharding = moe_dispatch;
  def(t, OpKind::moe_combine).sharding = moe_combine;
  def(t, OpKind::moe_combine_grad).sharding = moe_combine_grad;
}

}  // namespace tessera::ops_detail
