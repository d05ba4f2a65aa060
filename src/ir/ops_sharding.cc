// Sharding rules of every op along one mesh axis (see ir/placement.h). Each rule returns the
// output placements for the inputs' placements, or false when the op cannot run on local
// pieces laid out that way. Ops without a rule run only on replicated inputs.
#include <algorithm>

#include "ir/ops_common.h"
#include "ir/placement.h"

namespace tessera {

std::string Placement::to_string() const {
  switch (kind) {
    case kReplicate:
      return "R";
    case kShard:
      return "S(" + std::to_string(dim) + ")";
    case kPartial:
      return "P";
  }
  return "?";
}

namespace ops_detail {

namespace {

using P = Placement;
using Out = std::vector<Placement>;

bool all_outputs(const ShardingRuleArgs& a, Out* out, P p) {
  out->assign(a.out.size(), p);
  return true;
}

// Every input either shares one sharded dim (same index in every input: same-shape ops), or
// all are Partial when the op is linear in each of them.
bool same_shape_rule(const ShardingRuleArgs& a, Out* out, bool linear, int forbidden_from) {
  const P& first = a.p(0);
  for (const P& p : a.placements)
    if (!(p == first)) return false;
  if (first.is_partial()) return linear && all_outputs(a, out, first);
  if (first.dim >= forbidden_from) return false;
  return all_outputs(a, out, first);
}

bool elementwise_unary(const ShardingRuleArgs& a, Out* out) {
  return same_shape_rule(a, out, /*linear=*/false, a.in[0].shape.rank());
}
bool linear_unary(const ShardingRuleArgs& a, Out* out) {
  return same_shape_rule(a, out, /*linear=*/true, a.in[0].shape.rank());
}
bool same_shape(const ShardingRuleArgs& a, Out* out) {
  return same_shape_rule(a, out, false, a.in[0].shape.rank());
}

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

bool reduce_sum(const ShardingRuleArgs& a, Out* out) {
  const P& x = a.p(0);
  if (x.is_partial()) return all_outputs(a, out, x);
  const std::vector<int64_t>& axes = a.attrs.ints;
  const int rank = a.in[0].shape.rank();
  int removed_before = 0;
  for (int64_t ax : axes) {
    int d = static_cast<int>(ax < 0 ? ax + rank : ax);
    if (d == x.dim) return all_outputs(a, out, P::partial());
    if (d < x.dim) ++removed_before;
  }
  return all_outputs(a, out, P::shard(a.attrs.keepdim ? x.dim : x.dim - removed_before));
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
  const std::vector<int64_t>& perm = a.attrs.ints;
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] == x.dim) return all_outputs(a, out, P::shard(static_cast<int>(i)));
  return false;
}

bool slice_or_concat(const ShardingRuleArgs& a, Out* out) {
  const P& first = a.p(0);
  for (const P& p : a.placements)
    if (!(p == first)) return false;
  if (first.is_partial()) return all_outputs(a, out, first);
  int ax = a.in[0].shape.axis(static_cast<int>(a.attrs.axis));
  return first.dim != ax && all_outputs(a, out, first);
}

// [.., M, K] x [.., K, N] (transpose flags; a rank-2 right operand may be shared by a batch).
bool matmul(const ShardingRuleArgs& a, Out* out) {
  const P &x = a.p(0), &y = a.p(1);
  const int ra = a.in[0].shape.rank(), rb = a.in[1].shape.rank(), ro = a.out[0].shape.rank();
  if (x.is_partial() || y.is_partial())
    return ((x.is_partial() && y.is_replicate()) || (x.is_replicate() && y.is_partial())) &&
           all_outputs(a, out, P::partial());
  const int a_m = a.attrs.transpose_a ? ra - 1 : ra - 2,
            a_k = a.attrs.transpose_a ? ra - 2 : ra - 1;
  const int b_k = a.attrs.transpose_b ? rb - 1 : rb - 2,
            b_n = a.attrs.transpose_b ? rb - 2 : rb - 1;
  if (x.is_shard() && y.is_shard()) {
    if (x.dim == a_k && y.dim == b_k) return all_outputs(a, out, P::partial());
    if (ra == rb && x.dim == y.dim && x.dim < ra - 2) return all_outputs(a, out, x);
    return false;
  }
  if (x.is_shard()) {  // y replicated
    if (x.dim == a_m) return all_outputs(a, out, P::shard(ro - 2));
    if (x.dim < ra - 2 && rb == 2) return all_outputs(a, out, x);
    return false;
  }
  if (y.dim == b_n) return all_outputs(a, out, P::shard(ro - 1));
  return false;
}

// embedding(table [V,C], ids [...]) -> [..., C]. A table split on the vocabulary gives each
// rank the rows of its block (the partition pass lowers it to vocab_embedding): Partial.
bool embedding(const ShardingRuleArgs& a, Out* out) {
  const P &t = a.p(0), &ids = a.p(1);
  if (t.is_replicate() && ids.is_shard()) return all_outputs(a, out, ids);
  if (t.is_shard(1) && ids.is_replicate())
    return all_outputs(a, out, P::shard(a.out[0].shape.rank() - 1));
  if (t.is_shard(0) && ids.is_replicate()) return all_outputs(a, out, P::partial());
  return false;
}

// embedding_grad(dy [..., C], ids [...]) -> [V, C]
bool embedding_grad(const ShardingRuleArgs& a, Out* out) {
  const P &dy = a.p(0), &ids = a.p(1);
  if (dy.is_shard() && ids == dy) return all_outputs(a, out, P::partial());
  if (dy.is_partial() && ids.is_replicate()) return all_outputs(a, out, P::partial());
  if (dy.is_shard(a.in[0].shape.rank() - 1) && ids.is_replicate())
    return all_outputs(a, out, P::shard(1));
  return false;
}

// Row-wise ops over the last dim (norms and their grads). `acts` lists the inputs shaped like
// x or like its rows (x without the last dim), which must share x's sharded dim; the others
// are weights [C] and must be replicated. The first `n_row_out` outputs are row-shaped and
// sharded like x; the rest are weight gradients, Partial.
bool rowwise(const ShardingRuleArgs& a, Out* out, std::initializer_list<int> acts, int n_row_out) {
  const P& x = a.p(0);
  if (!x.is_shard() || x.dim >= a.in[0].shape.rank() - 1) return false;
  for (int i = 0; i < static_cast<int>(a.placements.size()); ++i) {
    bool act = std::find(acts.begin(), acts.end(), i) != acts.end();
    if (act ? !(a.p(i) == x) : !a.p(i).is_replicate()) return false;
  }
  out->assign(a.out.size(), P::partial());
  for (int i = 0; i < n_row_out; ++i) (*out)[static_cast<size_t>(i)] = x;
  return true;
}

// rope [B,T,H,D]: position-dependent along T (dim 1) and pairwise along D.
bool rope(const ShardingRuleArgs& a, Out* out) {
  const P& x = a.p(0);
  if (x.is_partial()) return all_outputs(a, out, x);  // a rotation is linear
  return (x.dim == 0 || x.dim == 2) && all_outputs(a, out, x);
}

// attention(q [B,H,Tq,D], k, v [B,Hkv,Tk,D][, bias [H,Tq,Tk]]) -> out [B,H,Tq,D], lse [B,H,Tq];
// its grad takes (q, k, v, out, lse, dout[, bias]) -> (dq, dk, dv[, dbias]). Batch sharding
// (the bias replicated: its gradient is a Partial sum over the examples) or head sharding
// (the bias split on its heads too).
bool attention(const ShardingRuleArgs& a, Out* out) {
  const P& q = a.p(0);
  if (!q.is_shard() || q.dim > 1) return false;
  const size_t bias_at = a.in.size() == 4 || a.in.size() == 7 ? a.in.size() - 1 : a.in.size();
  const P bias = q.dim == 0 ? P::replicate() : P::shard(0);
  for (size_t i = 0; i < a.placements.size(); ++i)
    if (!(a.placements[i] == (i == bias_at ? bias : q))) return false;
  all_outputs(a, out, q);
  if (a.out.size() == 4) (*out)[3] = q.dim == 0 ? P::partial() : P::shard(0);
  return true;
}

// cross_entropy(logits [N,V], targets [N]) -> loss [], lse [N]: rows sharded -> the local mean
// divides by the global row count (attrs.count) and the losses add up (Partial).
// Logits split on the vocabulary (columns) with whole rows of targets: the partition pass
// lowers it to the vocab-parallel pieces (logsumexp of each block, gathered; the target logit
// picked where it lies, summed), which leave the loss and lse Replicate.
bool cross_entropy(const ShardingRuleArgs& a, Out* out) {
  if (a.p(0).is_shard(1) && a.p(1).is_replicate()) {
    *out = {P::replicate(), P::replicate()};
    return true;
  }
  if (!a.p(0).is_shard(0) || !a.p(1).is_shard(0)) return false;
  *out = {P::partial(), P::shard(0)};
  return true;
}

// cross_entropy_grad(logits, targets, lse, dloss) -> dlogits (vocab-split: lowered to
// vocab_cross_entropy_grad)
bool cross_entropy_grad(const ShardingRuleArgs& a, Out* out) {
  if (a.p(0).is_shard(1) && a.p(1).is_replicate() && a.p(2).is_replicate() && a.p(3).is_replicate())
    return all_outputs(a, out, P::shard(1));
  if (!a.p(0).is_shard(0) || !a.p(1).is_shard(0) || !a.p(2).is_shard(0) || !a.p(3).is_replicate())
    return false;
  return all_outputs(a, out, P::shard(0));
}

bool softmax_like(const ShardingRuleArgs& a, Out* out) {
  return same_shape_rule(a, out, false, a.in[0].shape.rank() - 1);
}
bool causal_mask(const ShardingRuleArgs& a, Out* out) {
  return same_shape_rule(a, out, false, a.in[0].shape.rank() - 2);
}

template <OpKind K>
bool binary_rule(const ShardingRuleArgs& a, Out* out) {
  return binary(K, a, out);
}
// layernorm(x, w, b) -> (y, mean, rstd); layernorm_grad(dy, x, w, mean, rstd) -> (dx, dw, db)
bool layernorm(const ShardingRuleArgs& a, Out* out) { return rowwise(a, out, {0}, 3); }
bool layernorm_grad(const ShardingRuleArgs& a, Out* out) {
  return rowwise(a, out, {0, 1, 3, 4}, 1);
}
// rmsnorm(x, w) -> (y, rstd); rmsnorm_grad(dy, x, w, rstd) -> (dx, dw)
bool rmsnorm(const ShardingRuleArgs& a, Out* out) { return rowwise(a, out, {0}, 2); }
bool rmsnorm_grad(const ShardingRuleArgs& a, Out* out) { return rowwise(a, out, {0, 1, 3}, 1); }

}  // namespace

void define_sharding_rules(OpDef* t) {
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
  def(t, OpKind::reduce_sum).sharding = reduce_sum;
  def(t, OpKind::sum_to).sharding = sum_to;
  def(t, OpKind::broadcast_to).sharding = broadcast_to;
  def(t, OpKind::reshape).sharding = reshape;
  def(t, OpKind::transpose).sharding = transpose;
  def(t, OpKind::slice).sharding = slice_or_concat;
  def(t, OpKind::concat).sharding = slice_or_concat;
  def(t, OpKind::matmul).sharding = matmul;
  def(t, OpKind::embedding).sharding = embedding;
  def(t, OpKind::embedding_grad).sharding = embedding_grad;
  def(t, OpKind::layernorm).sharding = layernorm;
  def(t, OpKind::layernorm_grad).sharding = layernorm_grad;
  def(t, OpKind::rmsnorm).sharding = rmsnorm;
  def(t, OpKind::rmsnorm_grad).sharding = rmsnorm_grad;
  def(t, OpKind::rope).sharding = rope;
  def(t, OpKind::softmax).sharding = softmax_like;
  def(t, OpKind::softmax_grad).sharding = softmax_like;
  def(t, OpKind::causal_mask).sharding = causal_mask;
  def(t, OpKind::attention).sharding = attention;
  def(t, OpKind::attention_grad).sharding = attention;
  def(t, OpKind::cross_entropy).sharding = cross_entropy;
  def(t, OpKind::cross_entropy_grad).sharding = cross_entropy_grad;
}

}  // namespace ops_detail
}  // namespace tessera
