// Matmul and the fused neural-network ops (norms, RoPE, softmax, attention, cross-entropy) with
// their backward ops. Fused ops have reference decompositions in the op-consistency test.
#include "ir/ops_common.h"
#include "ir/sharding_rules.h"

namespace tessera::ops_detail {

// ---- matmul ------------------------------------------------------------------------------

Status infer_matmul(const Attrs& attrs, std::span<const TensorType> in,
                    std::vector<TensorType>* out) {
  const MatmulAttrs& a = attrs_as<MatmulAttrs>(attrs);
  const Shape &sa = in[0].shape, &sb = in[1].shape;
  TS_RETURN_IF_ERROR(same_dtype(in[0], in[1]));
  TS_RETURN_IF_ERROR(need_float(in[0], "matmul operand"));
  if (sa.rank() < 2 || sb.rank() < 2) return error("matmul operands need rank >= 2");
  if (a.fold_batch) {
    std::vector<int64_t> ra = sa.dims(), rb = sb.dims();
    ra.pop_back();
    rb.pop_back();
    if (!a.transpose_a || a.transpose_b || ra != rb)
      return error(
          "a batch-folding matmul takes a [..., R, M] and b [..., R, N] of equal leading "
          "dims with transpose_a, got " +
          sa.to_string() + " x " + sb.to_string());
    out->push_back({Shape{sa[-1], sb[-1]}, in[0].dtype});
    return Status();
  }
  bool shared_b = sb.rank() == 2 && sa.rank() > 2;
  if (!shared_b && sa.rank() != sb.rank())
    return error("matmul batch ranks differ: " + sa.to_string() + " x " + sb.to_string());
  if (shared_b && a.transpose_a)
    return error("transpose_a is not supported with a shared rank-2 right operand");
  if (!shared_b)
    for (int i = 0; i < sa.rank() - 2; ++i)
      if (sa[i] != sb[i])
        return error("matmul batch dims differ: " + sa.to_string() + " x " + sb.to_string());
  int64_t m = a.transpose_a ? sa[-1] : sa[-2], k = a.transpose_a ? sa[-2] : sa[-1];
  int64_t kb = a.transpose_b ? sb[-1] : sb[-2], n = a.transpose_b ? sb[-2] : sb[-1];
  if (k != kb)
    return error("matmul inner dims differ: " + std::to_string(k) + " vs " + std::to_string(kb),
                 "check the transpose flags and the operand layouts");
  std::vector<int64_t> d(sa.dims().begin(), sa.dims().end() - 2);
  d.push_back(m);
  d.push_back(n);
  out->push_back({Shape(d), in[0].dtype});
  return Status();
}

double flops_matmul(const Attrs& attrs, std::span<const TensorType> in,
                    std::span<const TensorType> out) {
  const MatmulAttrs& a = attrs_as<MatmulAttrs>(attrs);
  const Shape& sa = in[0].shape;
  int64_t k =
      a.fold_batch ? (sa[-1] > 0 ? sa.numel() / sa[-1] : 0) : (a.transpose_a ? sa[-2] : sa[-1]);
  return 2.0 * out_numel(out) * static_cast<double>(k);
}

namespace {

void vjp_matmul(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  Var A = in_var(b, n, 0), B = in_var(b, n, 1), dY = g[0];
  const MatmulAttrs& m = n.attr<MatmulAttrs>();
  const bool ta = m.transpose_a, tb = m.transpose_b;
  if (m.fold_batch) {  // out [M, N] = sum of a's rows [.., R, M] times b's [.., R, N]
    (*dx)[0] = b.matmul(B, dY, false, true);
    (*dx)[1] = b.matmul(A, dY, false, false);
    return;
  }
  if (A.rank() > 2 && B.rank() == 2) {  // shared weight: its gradient sums over the batch
    (*dx)[0] = b.matmul(dY, B, false, !tb);
    (*dx)[1] = tb ? b.matmul_folded(dY, A) : b.matmul_folded(A, dY);
    return;
  }
  if (!ta && !tb) {
    (*dx)[0] = b.matmul(dY, B, false, true);
    (*dx)[1] = b.matmul(A, dY, true, false);
  } else if (!ta && tb) {
    (*dx)[0] = b.matmul(dY, B, false, false);
    (*dx)[1] = b.matmul(dY, A, true, false);
  } else if (ta && !tb) {
    (*dx)[0] = b.matmul(B, dY, false, true);
    (*dx)[1] = b.matmul(A, dY, false, false);
  } else {
    (*dx)[0] = b.matmul(B, dY, true, true);
    (*dx)[1] = b.matmul(dY, A, true, true);
  }
}

}  // namespace

// ---- embedding ---------------------------------------------------------------------------

Status infer_embedding(const Attrs&, std::span<const TensorType> in, std::vector<TensorType>* out) {
  if (in[0].shape.rank() != 2) return error("embedding table must be [V, C]");
  if (in[1].dtype != DType::i32) return error("embedding ids must be i32");
  std::vector<int64_t> d = in[1].shape.dims();
  d.push_back(in[0].shape[1]);
  out->push_back({Shape(d), in[0].dtype});
  return Status();
}

Status infer_embedding_grad(const Attrs& attrs, std::span<const TensorType> in,
                            std::vector<TensorType>* out) {
  const EmbeddingGradAttrs& a = attrs_as<EmbeddingGradAttrs>(attrs);
  if (in[1].dtype != DType::i32) return error("embedding ids must be i32");
  if (in[0].shape.rank() != in[1].shape.rank() + 1 || a.rows <= 0)
    return error("embedding_grad needs dy [..., C] for ids [...] and rows > 0");
  out->push_back({Shape{a.rows, in[0].shape[-1]}, in[0].dtype});
  return Status();
}

namespace {

void vjp_embedding(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  Var table = in_var(b, n, 0);
  (*dx)[0] = b.embedding_grad(g[0], in_var(b, n, 1), table.shape()[0]);
}

// ---- norms -------------------------------------------------------------------------------

Shape rows_of(const Shape& s) {
  return Shape(std::vector<int64_t>(s.dims().begin(), s.dims().end() - 1));
}

Status check_norm_weight(const TensorType& x, const TensorType& w) {
  TS_RETURN_IF_ERROR(need_float(x, "norm input"));
  if (x.shape.rank() < 1 || w.shape != Shape{x.shape[-1]})
    return error("norm weight " + w.shape.to_string() + " must match the last dim of " +
                 x.shape.to_string());
  return same_dtype(x, w);
}

}  // namespace

Status infer_layernorm(const Attrs&, std::span<const TensorType> in, std::vector<TensorType>* out) {
  TS_RETURN_IF_ERROR(check_norm_weight(in[0], in[1]));
  TS_RETURN_IF_ERROR(check_norm_weight(in[0], in[2]));
  out->push_back(in[0]);
  out->push_back({rows_of(in[0].shape), DType::f32});
  out->push_back({rows_of(in[0].shape), DType::f32});
  return Status();
}

Status infer_layernorm_grad(const Attrs&, std::span<const TensorType> in,
                            std::vector<TensorType>* out) {
  if (in[0].shape != in[1].shape) return error("layernorm_grad: dy and x differ");
  TS_RETURN_IF_ERROR(check_norm_weight(in[1], in[2]));
  out->push_back(in[1]);
  out->push_back(in[2]);
  out->push_back(in[2]);
  return Status();
}

namespace {}  // namespace

Status infer_rmsnorm(const Attrs&, std::span<const TensorType> in, std::vector<TensorType>* out) {
  TS_RETURN_IF_ERROR(check_norm_weight(in[0], in[1]));
  out->push_back(in[0]);
  out->push_back({rows_of(in[0].shape), DType::f32});
  return Status();
}

Status infer_rmsnorm_grad(const Attrs&, std::span<const TensorType> in,
                          std::vector<TensorType>* out) {
  if (in[0].shape != in[1].shape) return error("rmsnorm_grad: dy and x differ");
  TS_RETURN_IF_ERROR(check_norm_weight(in[1], in[2]));
  out->push_back(in[1]);
  out->push_back(in[2]);
  return Status();
}

namespace {

// The mean/rstd outputs are saved statistics for the backward op, not differentiable.
void vjp_layernorm(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  std::vector<Var> d =
      b.layernorm_grad(g[0], in_var(b, n, 0), in_var(b, n, 1), out_var(b, n, 1), out_var(b, n, 2));
  for (int i = 0; i < 3; ++i) (*dx)[static_cast<size_t>(i)] = d[static_cast<size_t>(i)];
}

void vjp_rmsnorm(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  std::vector<Var> d = b.rmsnorm_grad(g[0], in_var(b, n, 0), in_var(b, n, 1), out_var(b, n, 1));
  (*dx)[0] = d[0];
  (*dx)[1] = d[1];
}

// ---- rope, softmax, mask -----------------------------------------------------------------

Status need_block(const TensorType& t, const char* op) {
  if (t.dtype != DType::i32 || t.shape.rank() != 0)
    return error(std::string(op) + ": the sequence block must be an i32 scalar, got " +
                 t.to_string());
  return Status();
}

Status infer_rope(const Attrs&, std::span<const TensorType> in, std::vector<TensorType>* out) {
  if (in.size() != 1 && in.size() != 2)
    return error("rope takes x and an optional sequence block, not " + std::to_string(in.size()) +
                 " inputs");
  if (in.size() == 2) TS_RETURN_IF_ERROR(need_block(in[1], "rope"));
  TS_RETURN_IF_ERROR(need_float(in[0], "rope input"));
  if (in[0].shape.rank() != 4 || in[0].shape[-1] % 2 != 0)
    return error("rope needs x [B,T,H,D] with even D, got " + in[0].shape.to_string());
  out->push_back(in[0]);
  return Status();
}

void vjp_rope(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  const RopeAttrs& a = n.attr<RopeAttrs>();
  (*dx)[0] = b.rope(g[0], a.theta, !a.inverse);
}

Status infer_softmax(const Attrs&, std::span<const TensorType> in, std::vector<TensorType>* out) {
  TS_RETURN_IF_ERROR(need_float(in[0], "softmax input"));
  if (in[0].shape.rank() < 1) return error("softmax needs rank >= 1");
  for (const TensorType& t : in)
    if (t.shape != in[0].shape) return error("softmax_grad: y and dy differ");
  out->push_back(in[0]);
  return Status();
}

void vjp_softmax(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = b.softmax_grad(out_var(b, n, 0), g[0]);
}

Status infer_causal_mask(const Attrs&, std::span<const TensorType> in,
                         std::vector<TensorType>* out) {
  if (in[0].shape.rank() < 2 || in[0].shape[-1] != in[0].shape[-2])
    return error("causal_mask needs [..., T, T], got " + in[0].shape.to_string());
  out->push_back(in[0]);
  return Status();
}

void vjp_causal_mask(Builder& b, const Node&, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = b.causal_mask(g[0], 0.0);
}

// ---- attention ---------------------------------------------------------------------------

// q [B,H,Tq,D], k and v [B,Hkv,Tk,D] (Hkv dividing H), an optional additive f32 score bias
// [H,Tq,Tk] (T5's relative positions) and an optional sequence block (op.h). Causal needs
// Tq == Tk, or with a block Tk a multiple of Tq.
Status check_qkv(const Attrs& attrs, std::span<const TensorType> in, size_t forward_inputs) {
  const AttentionAttrs& a = attrs_as<AttentionAttrs>(attrs);
  const OptionalInputs opt = optional_inputs(in, forward_inputs);
  const size_t expected =
      forward_inputs + (opt.bias >= 0) + (opt.block >= 0) + (opt.key_block >= 0);
  if (in.size() != expected)
    return error(std::string(forward_inputs == 3 ? "attention" : "attention_grad") + " takes " +
                 (forward_inputs == 3 ? "q, k, v" : "q, k, v, out, lse, dout") +
                 ", an optional bias and optional query and key blocks, not " +
                 std::to_string(in.size()) + " inputs");
  if (opt.block >= 0)
    TS_RETURN_IF_ERROR(need_block(in[static_cast<size_t>(opt.block)], "attention"));
  const size_t bias_at = opt.bias >= 0 ? static_cast<size_t>(opt.bias) : in.size();
  const Shape &q = in[0].shape, &k = in[1].shape, &v = in[2].shape;
  if (q.rank() != 4 || k.rank() != 4 || k != v)
    return error("attention needs q [B,H,Tq,D] and k, v [B,Hkv,Tk,D]");
  // Keys of one chunk (ring attention): as many as the queries' chunk, without a bias.
  if (opt.key_block >= 0 && (q[2] != k[2] || opt.bias >= 0))
    return error("attention over a key block needs as many keys as queries and no bias, not " +
                 k.to_string() + " keys for " + q.to_string());
  if (q[0] != k[0] || q[3] != k[3])
    return error("attention q " + q.to_string() + " and k " + k.to_string() + " disagree");
  const bool blocks = opt.block >= 0 && q[2] > 0 && k[2] % q[2] == 0;
  if (a.causal && q[2] != k[2] && !blocks)
    return error("causal attention needs as many keys as queries, not " + std::to_string(k[2]) +
                     " keys for " + std::to_string(q[2]) + " queries",
                 "cross-attention is bidirectional (causal = false)");
  if (k[1] == 0 || q[1] % k[1] != 0)
    return error("query heads " + std::to_string(q[1]) + " not a multiple of kv heads " +
                 std::to_string(k[1]));
  TS_RETURN_IF_ERROR(same_dtype(in[0], in[1]));
  TS_RETURN_IF_ERROR(same_dtype(in[0], in[2]));
  if (bias_at < in.size() &&
      (in[bias_at].shape != Shape{q[1], q[2], k[2]} || in[bias_at].dtype != DType::f32))
    return error("attention bias must be f32 [H,Tq,Tk] = " + Shape{q[1], q[2], k[2]}.to_string() +
                 ", not " + in[bias_at].shape.to_string());
  return Status();
}

Status infer_attention(const Attrs& a, std::span<const TensorType> in,
                       std::vector<TensorType>* out) {
  if (in.size() < 3) return error("attention takes q, k, v and optional inputs");
  TS_RETURN_IF_ERROR(check_qkv(a, in, 3));
  out->push_back(in[0]);
  out->push_back({Shape{in[0].shape[0], in[0].shape[1], in[0].shape[2]}, DType::f32});
  return Status();
}

// (q, k, v, out, lse, dout[, bias]) -> dq, dk, dv[, dbias]
Status infer_attention_grad(const Attrs& a, std::span<const TensorType> in,
                            std::vector<TensorType>* out) {
  if (in.size() < 6)
    return error("attention_grad takes q, k, v, out, lse, dout and optional inputs");
  TS_RETURN_IF_ERROR(check_qkv(a, in, 6));
  if (in[3].shape != in[0].shape || in[5].shape != in[0].shape)
    return error("attention_grad: out and dout must be shaped like q");
  for (size_t i : {size_t{0}, size_t{1}, size_t{2}}) out->push_back(in[i]);
  const int bias = optional_inputs(in, 6).bias;
  if (bias >= 0) out->push_back(in[static_cast<size_t>(bias)]);
  return Status();
}

// (out_a, lse_a, out_b, lse_b) -> (out, lse): two attentions of the same queries over disjoint
// key sets as one over their union (ring attention's steps): lse = log(e^lse_a + e^lse_b),
// out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b. A row with no key on either side (lse
// -inf) stays 0 and -inf. Added after partitioning, never differentiated.
Status infer_attention_merge(const Attrs&, std::span<const TensorType> in,
                             std::vector<TensorType>* out) {
  const Shape& o = in[0].shape;
  const Shape rows = o.rank() == 4 ? Shape{o[0], o[1], o[2]} : Shape{};
  if (o.rank() != 4 || in[2].shape != o || in[1].shape != rows || in[3].shape != rows ||
      in[1].dtype != DType::f32 || in[3].dtype != DType::f32)
    return error("attention_merge takes out [B,H,T,D] and lse [B,H,T] (f32) twice, not " +
                 in[0].to_string() + ", " + in[1].to_string() + ", " + in[2].to_string() + ", " +
                 in[3].to_string());
  TS_RETURN_IF_ERROR(same_dtype(in[0], in[2]));
  out->push_back(in[0]);
  out->push_back(in[1]);
  return Status();
}

// Counted as full (non-causal) attention, the convention of Megatron-LM and PaLM MFU figures:
// 4 B H Tq Tk D (Q K^T and P V).
double flops_attention(const Attrs&, std::span<const TensorType> in, std::span<const TensorType>) {
  const Shape &q = in[0].shape, &k = in[1].shape;
  return 4.0 * static_cast<double>(q[0] * q[1] * q[2]) * static_cast<double>(k[2] * q[3]);
}
double flops_attention_grad(const Attrs& a, std::span<const TensorType> in,
                            std::span<const TensorType> out) {
  return 2.0 * flops_attention(a, in, out);
}

void vjp_attention(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  const bool biased = n.inputs.size() == 4;  // (the model graph's: no sequence block)
  std::vector<Var> d =
      b.attention_grad(in_var(b, n, 0), in_var(b, n, 1), in_var(b, n, 2), out_var(b, n, 0),
                       out_var(b, n, 1), g[0], n.attr<AttentionAttrs>().scale,
                       n.attr<AttentionAttrs>().causal, biased ? in_var(b, n, 3) : Var{});
  for (size_t i = 0; i < d.size(); ++i) (*dx)[i] = d[i];
}

// ---- position buckets ----------------------------------------------------------------------

// -> i32 [Tq, Tk]; unidirectional (decoders) unless bidirectional
Status infer_position_buckets(const Attrs& attrs, std::span<const TensorType>,
                              std::vector<TensorType>* out) {
  const PositionBucketsAttrs& a = attrs_as<PositionBucketsAttrs>(attrs);
  if (a.tq < 0 || a.tk < 0 || a.num_buckets < 2 || a.max_distance < 1)
    return error("position_buckets needs Tq >= 0, Tk >= 0, num_buckets >= 2, max_distance >= 1");
  out->push_back({Shape{a.tq, a.tk}, DType::i32});
  return Status();
}

}  // namespace

// ---- cross-entropy -----------------------------------------------------------------------

// logits [..., V] (rows: every dim but the last) and i32 targets [...] -> loss [], lse [...].
Status infer_cross_entropy(const Attrs& attrs, std::span<const TensorType> in,
                           std::vector<TensorType>* out) {
  const CrossEntropyAttrs& a = attrs_as<CrossEntropyAttrs>(attrs);
  TS_RETURN_IF_ERROR(need_float(in[0], "logits"));
  const Shape& s = in[0].shape;
  std::vector<int64_t> rows = s.dims();
  if (!rows.empty()) rows.pop_back();
  if (s.rank() < 2 || in[1].shape != Shape(rows) || in[1].dtype != DType::i32)
    return error(
        "cross_entropy needs logits [..., V] and i32 targets of the logits' leading "
        "dims, got " +
        in[0].to_string() + " and " + in[1].to_string());
  if (a.classes < 0 || a.classes > s[-1])
    return error("cross_entropy: classes " + std::to_string(a.classes) + " outside [0, " +
                 std::to_string(s[-1]) + "]");
  out->push_back({Shape{}, DType::f32});
  out->push_back({Shape(rows), DType::f32});
  return Status();
}

Status infer_cross_entropy_grad(const Attrs& a, std::span<const TensorType> in,
                                std::vector<TensorType>* out) {
  std::vector<TensorType> fwd;
  TS_RETURN_IF_ERROR(infer_cross_entropy(a, in.subspan(0, 2), &fwd));
  if (in[2].shape != fwd[1].shape || in[3].shape.numel() != 1)
    return error("cross_entropy_grad needs lse shaped like the targets and a scalar dloss");
  out->push_back(in[0]);
  return Status();
}

namespace {

void vjp_cross_entropy(Builder& b, const Node& n, std::span<const Var> g, std::vector<Var>* dx) {
  (*dx)[0] = b.cross_entropy_grad(in_var(b, n, 0), in_var(b, n, 1), out_var(b, n, 1), g[0],
                                  n.attr<CrossEntropyAttrs>().classes);
}

using P = Placement;
using Out = std::vector<Placement>;

// [.., M, K] x [.., K, N] (transpose flags; a rank-2 right operand may be shared by a batch).
bool matmul(const ShardingRuleArgs& a, Out* out) {
  const P &x = a.p(0), &y = a.p(1);
  const int ra = a.in[0].shape.rank(), rb = a.in[1].shape.rank(), ro = a.out[0].shape.rank();
  if (x.is_partial() || y.is_partial())
    return ((x.is_partial() && y.is_replicate()) || (x.is_replicate() && y.is_partial())) &&
           all_outputs(a, out, P::partial());
  const MatmulAttrs& m = attrs_as<MatmulAttrs>(a.attrs);
  if (m.fold_batch) {  // [.., R, M] x [.., R, N] -> [M, N]: every dim but the last is summed
    if (x.is_shard() && y == x && x.dim < ra - 1) return all_outputs(a, out, P::partial());
    if (x.is_shard(ra - 1) && y.is_replicate()) return all_outputs(a, out, P::shard(0));
    if (x.is_replicate() && y.is_shard(rb - 1)) return all_outputs(a, out, P::shard(1));
    return false;
  }
  const int a_m = m.transpose_a ? ra - 1 : ra - 2, a_k = m.transpose_a ? ra - 2 : ra - 1;
  const int b_k = m.transpose_b ? rb - 1 : rb - 2, b_n = m.transpose_b ? rb - 2 : rb - 1;
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

// rope [B,T,H,D]: pairwise along D. Split on T (dim 1), each rank's chunk takes its positions
// from its block index (the partition pass adds it: op.h).
bool rope(const ShardingRuleArgs& a, Out* out) {
  const P& x = a.p(0);
  if (x.is_partial()) return all_outputs(a, out, x);  // a rotation is linear
  return x.dim != 3 && all_outputs(a, out, x);
}

// attention(q [B,H,Tq,D], k, v [B,Hkv,Tk,D][, bias [H,Tq,Tk]]) -> out [B,H,Tq,D], lse [B,H,Tq];
// its grad takes (q, k, v, out, lse, dout[, bias]) -> (dq, dk, dv[, dbias]). Batch sharding
// (the bias replicated: its gradient is a Partial sum over the examples) or head sharding
// (the bias split on its heads too). Sequence sharding (dim 2 of every input but the bias, which
// it does not take): each rank's queries against the whole sequence's keys and values, which
// the partition pass gathers (and whose gradients it reduce-scatters), with the rank's block
// index for the causal mask.
bool attention(const ShardingRuleArgs& a, Out* out) {
  const P& q = a.p(0);
  const size_t bias_at = a.in.size() == 4 || a.in.size() == 7 ? a.in.size() - 1 : a.in.size();
  if (q.is_shard(2)) {
    if (bias_at < a.in.size()) return false;
    for (const P& p : a.placements)
      if (!(p == q)) return false;
    return all_outputs(a, out, q);
  }
  if (!q.is_shard() || q.dim > 1) return false;
  const P bias = q.dim == 0 ? P::replicate() : P::shard(0);
  for (size_t i = 0; i < a.placements.size(); ++i)
    if (!(a.placements[i] == (i == bias_at ? bias : q))) return false;
  all_outputs(a, out, q);
  if (a.out.size() == 4) (*out)[3] = q.dim == 0 ? P::partial() : P::shard(0);
  return true;
}

// cross_entropy(logits [..., V], targets [...]) -> loss [], lse [...]: rows sharded (any dim
// but the last, the targets split alike) -> the local mean divides by the global row count
// (CrossEntropyAttrs::rows) and the losses add up (Partial). Logits split on the vocabulary
// (the last dim) with whole rows of targets: the partition pass lowers it to the
// vocab-parallel pieces (logsumexp of each block, gathered; the target logit picked where it
// lies, summed), which leave the loss and lse Replicate.
bool cross_entropy(const ShardingRuleArgs& a, Out* out) {
  const int last = a.in[0].shape.rank() - 1;
  if (a.p(0).is_shard(last) && a.p(1).is_replicate()) {
    *out = {P::replicate(), P::replicate()};
    return true;
  }
  if (!a.p(0).is_shard() || a.p(0).dim == last || !(a.p(1) == a.p(0))) return false;
  *out = {P::partial(), a.p(0)};
  return true;
}

// cross_entropy_grad(logits, targets, lse, dloss) -> dlogits (vocab-split: lowered to
// vocab_cross_entropy_grad)
bool cross_entropy_grad(const ShardingRuleArgs& a, Out* out) {
  const int last = a.in[0].shape.rank() - 1;
  if (a.p(0).is_shard(last) && a.p(1).is_replicate() && a.p(2).is_replicate() &&
      a.p(3).is_replicate())
    return all_outputs(a, out, P::shard(last));
  if (!a.p(0).is_shard() || a.p(0).dim == last || !(a.p(1) == a.p(0)) || !(a.p(2) == a.p(0)) ||
      !a.p(3).is_replicate())
    return false;
  return all_outputs(a, out, a.p(0));
}

bool softmax_like(const ShardingRuleArgs& a, Out* out) {
  return same_shape_rule(a, out, false, a.in[0].shape.rank() - 1);
}
bool causal_mask(const ShardingRuleArgs& a, Out* out) {
  return same_shape_rule(a, out, false, a.in[0].shape.rank() - 2);
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

bool matmul_sharding(const ShardingRuleArgs& a, std::vector<Placement>* out) {
  return matmul(a, out);
}

void define_nn_ops(OpDef* t) {
  def(t, OpKind::matmul).infer = infer_matmul;
  def(t, OpKind::matmul).flops = flops_matmul;
  def(t, OpKind::matmul).vjp = vjp_matmul;

  def(t, OpKind::embedding).infer = infer_embedding;
  def(t, OpKind::embedding).vjp = vjp_embedding;
  def(t, OpKind::embedding_grad).infer = infer_embedding_grad;
  def(t, OpKind::embedding_grad).flops = flops_in0<1>;
  def(t, OpKind::embedding_grad).gradient_of = "embedding";

  def(t, OpKind::layernorm).infer = infer_layernorm;
  def(t, OpKind::layernorm).flops = flops_in0<8>;
  def(t, OpKind::layernorm).vjp = vjp_layernorm;
  def(t, OpKind::layernorm_grad).infer = infer_layernorm_grad;
  def(t, OpKind::layernorm_grad).flops = flops_in0<12>;
  def(t, OpKind::layernorm_grad).gradient_of = "layernorm";
  def(t, OpKind::rmsnorm).infer = infer_rmsnorm;
  def(t, OpKind::rmsnorm).flops = flops_in0<5>;
  def(t, OpKind::rmsnorm).vjp = vjp_rmsnorm;
  def(t, OpKind::rmsnorm_grad).infer = infer_rmsnorm_grad;
  def(t, OpKind::rmsnorm_grad).flops = flops_in0<9>;
  def(t, OpKind::rmsnorm_grad).gradient_of = "rmsnorm";

  def(t, OpKind::rope).infer = infer_rope;
  def(t, OpKind::rope).flops = flops_in0<3>;
  def(t, OpKind::rope).vjp = vjp_rope;
  def(t, OpKind::softmax).infer = infer_softmax;
  def(t, OpKind::softmax).flops = flops_in0<5>;
  def(t, OpKind::softmax).vjp = vjp_softmax;
  def(t, OpKind::softmax_grad).infer = infer_softmax;
  def(t, OpKind::softmax_grad).flops = flops_in0<4>;
  def(t, OpKind::softmax_grad).gradient_of = "softmax";
  def(t, OpKind::causal_mask).infer = infer_causal_mask;
  def(t, OpKind::causal_mask).vjp = vjp_causal_mask;

  def(t, OpKind::position_buckets).infer = infer_position_buckets;
  def(t, OpKind::attention).infer = infer_attention;
  def(t, OpKind::attention).flops = flops_attention;
  def(t, OpKind::attention).vjp = vjp_attention;
  def(t, OpKind::attention_grad).infer = infer_attention_grad;
  def(t, OpKind::attention_grad).flops = flops_attention_grad;
  def(t, OpKind::attention_grad).gradient_of = "attention";
  def(t, OpKind::attention_merge).infer = infer_attention_merge;
  def(t, OpKind::attention_merge).flops = flops_in0<4>;

  def(t, OpKind::cross_entropy).infer = infer_cross_entropy;
  def(t, OpKind::cross_entropy).flops = flops_in0<4>;
  def(t, OpKind::cross_entropy).vjp = vjp_cross_entropy;
  def(t, OpKind::cross_entropy_grad).infer = infer_cross_entropy_grad;
  def(t, OpKind::cross_entropy_grad).flops = flops_in0<4>;
  def(t, OpKind::cross_entropy_grad).gradient_of = "cross_entropy";

  // Sharding along one mesh axis (ir/sharding_rules.h).
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

}  // namespace tessera::ops_detail
