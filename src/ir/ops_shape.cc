// Reductions, broadcasting and data-movement ops.
#include <algorithm>

#include "ir/ops_common.h"
#include "ir/sharding_rules.h"

namespace tessera::ops_detail {

namespace {

Status infer_reduce_sum(const Attrs& attrs, std::span<const TensorType> in,
                        std::vector<TensorType>* out) {
  const ReduceAttrs& a = attrs_as<ReduceAttrs>(attrs);
  const Shape& s = in[0].shape;
  std::vector<bool> reduced(static_cast<size_t>(s.rank()), false);
  for (int64_t ax : a.axes) {
    int n = s.axis(static_cast<int>(ax));
    if (n < 0) return error("axis " + std::to_string(ax) + " out of range for " + s.to_string());
    reduced[static_cast<size_t>(n)] = true;
  }
  std::vector<int64_t> d;
  for (int i = 0; i < s.rank(); ++i) {
    if (!reduced[static_cast<size_t>(i)]) {
      d.push_back(s[i]);
    } else if (a.keepdim) {
      d.push_back(1);
    }
  }
  out->push_back({Shape(d), in[0].dtype});
  return Status();
}

Status infer_sum_to(const Attrs& attrs, std::span<const TensorType> in,
                    std::vector<TensorType>* out) {
  const ShapeAttrs& a = attrs_as<ShapeAttrs>(attrs);
  Shape target(a.shape), b;
  if (!broadcast_shapes(target, in[0].shape, &b) || b != in[0].shape)
    return error(in[0].shape.to_string() + " cannot be summed to " + target.to_string());
  out->push_back({target, in[0].dtype});
  return Status();
}

Status infer_broadcast_to(const Attrs& attrs, std::span<const TensorType> in,
                          std::vector<TensorType>* out) {
  const ShapeAttrs& a = attrs_as<ShapeAttrs>(attrs);
  Shape target(a.shape), b;
  if (!broadcast_shapes(target, in[0].shape, &b) || b != target)
    return error(in[0].shape.to_string() + " does not broadcast to " + target.to_string());
  out->push_back({target, in[0].dtype});
  return Status();
}

Status infer_reshape(const Attrs& attrs, std::span<const TensorType> in,
                     std::vector<TensorType>* out) {
  const ShapeAttrs& a = attrs_as<ShapeAttrs>(attrs);
  std::vector<int64_t> d = a.shape;
  int64_t known = 1;
  int infer_at = -1;
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] == -1) {
      if (infer_at >= 0) return error("reshape allows one -1 dimension");
      infer_at = static_cast<int>(i);
    } else {
      known *= d[i];
    }
  }
  if (infer_at >= 0 && known > 0) d[static_cast<size_t>(infer_at)] = in[0].shape.numel() / known;
  Shape s(d);
  if (s.numel() != in[0].shape.numel())
    return error("cannot reshape " + in[0].shape.to_string() + " to " + s.to_string());
  out->push_back({s, in[0].dtype});
  return Status();
}

Status infer_transpose(const Attrs& attrs, std::span<const TensorType> in,
                       std::vector<TensorType>* out) {
  const TransposeAttrs& a = attrs_as<TransposeAttrs>(attrs);
  const Shape& s = in[0].shape;
  if (static_cast<int>(a.perm.size()) != s.rank())
    return error("permutation has " + std::to_string(a.perm.size()) + " axes for rank " +
                 std::to_string(s.rank()));
  std::vector<bool> seen(a.perm.size(), false);
  std::vector<int64_t> d;
  for (int64_t p : a.perm) {
    if (p < 0 || p >= s.rank() || seen[static_cast<size_t>(p)]) return error("invalid permutation");
    seen[static_cast<size_t>(p)] = true;
    d.push_back(s[static_cast<int>(p)]);
  }
  out->push_back({Shape(d), in[0].dtype});
  return Status();
}

Status infer_slice(const Attrs& attrs, std::span<const TensorType> in,
                   std::vector<TensorType>* out) {
  const SliceAttrs& a = attrs_as<SliceAttrs>(attrs);
  const Shape& s = in[0].shape;
  int ax = s.axis(static_cast<int>(a.axis));
  if (ax < 0) return error("slice axis out of range for " + s.to_string());
  if (a.start < 0 || a.end > s[ax] || a.start > a.end)
    return error("slice [" + std::to_string(a.start) + ", " + std::to_string(a.end) +
                 ") out of range for dim of size " + std::to_string(s[ax]));
  out->push_back({s.with_dim(ax, a.end - a.start), in[0].dtype});
  return Status();
}

// shard_slice(x, index): block `index` (an i32 scalar, from axis_index) of ShardSliceAttrs::blocks
// equal blocks of x along its axis: the free Replicate -> Shard(d) conversion of a tensor axis.
// The partition pass emits it in local graphs; it has no VJP.
Status infer_shard_slice(const Attrs& attrs, std::span<const TensorType> in,
                         std::vector<TensorType>* out) {
  const ShardSliceAttrs& a = attrs_as<ShardSliceAttrs>(attrs);
  const Shape& s = in[0].shape;
  const int ax = s.axis(static_cast<int>(a.axis));
  if (ax < 0) return error("shard_slice axis out of range for " + s.to_string());
  if (a.blocks < 1 || s[ax] % a.blocks != 0)
    return error("shard_slice: " + std::to_string(a.blocks) + " blocks do not split dim " +
                 std::to_string(ax) + " of " + s.to_string());
  if (in[1].dtype != DType::i32 || in[1].shape.numel() != 1)
    return error("shard_slice needs an i32 scalar block index, got " + in[1].to_string());
  out->push_back({s.with_dim(ax, s[ax] / a.blocks), in[0].dtype});
  return Status();
}

Status infer_concat(const Attrs& attrs, std::span<const TensorType> in,
                    std::vector<TensorType>* out) {
  const ConcatAttrs& a = attrs_as<ConcatAttrs>(attrs);
  if (in.empty()) return error("concat needs at least one input");
  const Shape& s0 = in[0].shape;
  int ax = s0.axis(static_cast<int>(a.axis));
  if (ax < 0) return error("concat axis out of range for " + s0.to_string());
  int64_t total = 0;
  for (const TensorType& t : in) {
    if (t.dtype != in[0].dtype || t.shape.rank() != s0.rank())
      return error("concat inputs differ: " + in[0].to_string() + " vs " + t.to_string());
    for (int i = 0; i < s0.rank(); ++i)
      if (i != ax && t.shape[i] != s0[i])
        return error("concat inputs differ off the axis: " + s0.to_string() + " vs " +
                     t.shape.to_string());
    total += t.shape[ax];
  }
  out->push_back({s0.with_dim(ax, total), in[0].dtype});
  return Status();
}

double flops_reduce(const Attrs&, std::span<const TensorType> in, std::span<const TensorType>) {
  return static_cast<double>(in[0].shape.numel());
}

void vjp_reduce_sum(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  Var x = in_var(b, n, 0);
  Shape kept = x.shape();
  for (int64_t ax : n.attr<ReduceAttrs>().axes) kept = kept.with_dim(static_cast<int>(ax), 1);
  (*dx)[0] = b.broadcast_to(b.reshape(g[0], kept), x.shape());
}
void vjp_sum_to(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = b.broadcast_to(g[0], in_var(b, n, 0).shape());
}
void vjp_broadcast_to(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = b.sum_to(g[0], in_var(b, n, 0).shape());
}
void vjp_reshape(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = b.reshape(g[0], in_var(b, n, 0).shape());
}
void vjp_transpose(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  const std::vector<int64_t>& perm = n.attr<TransposeAttrs>().perm;
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < inv.size(); ++i)
    inv[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
  (*dx)[0] = b.transpose(g[0], inv);
}
void vjp_slice(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  Var x = in_var(b, n, 0);
  const SliceAttrs& a = n.attr<SliceAttrs>();
  int ax = x.shape().axis(static_cast<int>(a.axis));
  std::vector<Var> parts;
  if (a.start > 0) parts.push_back(b.fill(x.shape().with_dim(ax, a.start), 0, x.dtype()));
  parts.push_back(g[0]);
  int64_t after = x.shape()[ax] - a.end;
  if (after > 0) parts.push_back(b.fill(x.shape().with_dim(ax, after), 0, x.dtype()));
  (*dx)[0] = parts.size() == 1 ? parts[0] : b.concat(parts, ax);
}
void vjp_concat(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  int64_t offset = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    Var x = b.var(n.inputs[i]);
    int ax = x.shape().axis(static_cast<int>(n.attr<ConcatAttrs>().axis));
    (*dx)[i] = b.slice(g[0], ax, offset, offset + x.shape()[ax]);
    offset += x.shape()[ax];
  }
}

using P = Placement;
using Out = std::vector<Placement>;

bool reduce_sum(const ShardingRuleArgs& a, Out* out) {
  const P& x = a.p(0);
  if (x.is_partial()) return all_outputs(a, out, x);
  const ReduceAttrs& r = attrs_as<ReduceAttrs>(a.attrs);
  const std::vector<int64_t>& axes = r.axes;
  const int rank = a.in[0].shape.rank();
  int removed_before = 0;
  for (int64_t ax : axes) {
    int d = static_cast<int>(ax < 0 ? ax + rank : ax);
    if (d == x.dim) return all_outputs(a, out, P::partial());
    if (d < x.dim) ++removed_before;
  }
  return all_outputs(a, out, P::shard(r.keepdim ? x.dim : x.dim - removed_before));
}

// sum_to reduces leading dims and dims where the target has size 1.
bool sum_to(const ShardingRuleArgs& a, Out* out) {
  const P& x = a.p(0);
  if (x.is_partial()) return all_outputs(a, out, x);
  int d = x.dim - (a.in[0].shape.rank() - a.out[0].shape.rank());
  if (d < 0 || a.out[0].shape[d] != a.in[0].shape[x.dim]) return all_outputs(a, out, P::partial());
  return all_outputs(a, out, P::shard(d));
}

bool broadcast_to(const ShardingRuleArgs& a, Out* out) {
  const P& x = a.p(0);
  if (x.is_partial()) return false;  // broadcasting a sum is fine, but keep Partial narrow
  int d = x.dim + (a.out[0].shape.rank() - a.in[0].shape.rank());
  if (a.in[0].shape[x.dim] != a.out[0].shape[d]) return false;
  return all_outputs(a, out, P::shard(d));
}

// A block split of dim d survives a reshape when the dims before it multiply to the same
// outer size in the output: each outer slice is split into n contiguous pieces either way.
bool reshape(const ShardingRuleArgs& a, Out* out) {
  const P& x = a.p(0);
  if (x.is_partial()) return all_outputs(a, out, x);
  const Shape &in = a.in[0].shape, &o = a.out[0].shape;
  int64_t outer = 1;
  for (int i = 0; i < x.dim; ++i) outer *= in[i];
  int64_t po = 1;
  for (int j = 0; j < o.rank(); ++j) {
    if (po == outer && o[j] > 1) return all_outputs(a, out, P::shard(j));
    po *= o[j];
    if (po > outer) break;
  }
  return false;
}

bool transpose(const ShardingRuleArgs& a, Out* out) {
  const P& x = a.p(0);
  if (x.is_partial()) return all_outputs(a, out, x);
  const std::vector<int64_t>& perm = attrs_as<TransposeAttrs>(a.attrs).perm;
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] == x.dim) return all_outputs(a, out, P::shard(static_cast<int>(i)));
  return false;
}

// SliceAttrs or ConcatAttrs: the axis they cut or join along.
template <class T>
bool slice_or_concat(const ShardingRuleArgs& a, Out* out) {
  const P& first = a.p(0);
  for (const P& p : a.placements)
    if (!(p == first)) return false;
  if (first.is_partial()) return all_outputs(a, out, first);
  int ax = a.in[0].shape.axis(static_cast<int>(attrs_as<T>(a.attrs).axis));
  return first.dim != ax && all_outputs(a, out, first);
}

}  // namespace

void define_shape_ops(OpDef* t) {
  def(t, OpKind::reduce_sum).infer = infer_reduce_sum;
  def(t, OpKind::reduce_sum).flops = flops_reduce;
  def(t, OpKind::reduce_sum).vjp = vjp_reduce_sum;
  def(t, OpKind::sum_to).infer = infer_sum_to;
  def(t, OpKind::sum_to).flops = flops_reduce;
  def(t, OpKind::sum_to).vjp = vjp_sum_to;
  def(t, OpKind::broadcast_to).infer = infer_broadcast_to;
  def(t, OpKind::broadcast_to).vjp = vjp_broadcast_to;
  def(t, OpKind::reshape).infer = infer_reshape;
  def(t, OpKind::reshape).vjp = vjp_reshape;
  def(t, OpKind::transpose).infer = infer_transpose;
  def(t, OpKind::transpose).vjp = vjp_transpose;
  def(t, OpKind::slice).infer = infer_slice;
  def(t, OpKind::slice).vjp = vjp_slice;
  def(t, OpKind::shard_slice).infer = infer_shard_slice;
  def(t, OpKind::concat).infer = infer_concat;
  def(t, OpKind::concat).vjp = vjp_concat;

  // Sharding along one mesh axis (ir/sharding_rules.h).
  def(t, OpKind::reduce_sum).sharding = reduce_sum;
  def(t, OpKind::sum_to).sharding = sum_to;
  def(t, OpKind::broadcast_to).sharding = broadcast_to;
  def(t, OpKind::reshape).sharding = reshape;
  def(t, OpKind::transpose).sharding = transpose;
  def(t, OpKind::slice).sharding = slice_or_concat<SliceAttrs>;
  def(t, OpKind::concat).sharding = slice_or_concat<ConcatAttrs>;
}

}  // namespace tessera::ops_detail
