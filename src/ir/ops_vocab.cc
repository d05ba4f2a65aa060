// Vocab-parallel ops: embedding and cross-entropy on one rank's block of the vocabulary, the
// rows [shard * Vl, (shard + 1) * Vl) of the embedding table and the same columns of the
// logits. The partition pass emits them when a tensor axis splits the vocabulary (shard comes
// from axis_index); model code never does.
//
// ([N, Vl] below: the logits' rows N may be several leading dims, [..., Vl], as cross_entropy's.)
//   logsumexp(x [..., V])                         -> [...]: log sum exp over the last dim
//   vocab_logsumexp(logits [N,Vl], shard)         -> [N]: logsumexp of the block's class
//                                                    columns (-inf when it has none)
//   vocab_embedding(table [Vl,C], ids [...], shard) -> [..., C]: the rows of the ids in the
//                                                    block, zeros for the others (the sum
//                                                    over the blocks is embedding())
//   vocab_embedding_grad(dy [..., C], ids, shard) -> [Vl, C] (EmbeddingGradAttrs::rows = Vl):
//                                                    scatter-add of the rows whose id is in
//                                                    the block
//   vocab_pick(logits [N,Vl], targets [N], shard) -> [N]: each row's target logit where the
//                                                    target is in the block, 0 elsewhere
//   vocab_cross_entropy_grad(logits [N,Vl], targets [N], lse [N], dloss [], shard)
//                                                 -> [N,Vl]: cross_entropy_grad on the block,
//                                                    lse over the whole vocabulary;
//                                                    CrossEntropyAttrs as cross_entropy's
//
// CrossEntropyAttrs::classes on vocab_logsumexp and vocab_cross_entropy_grad (as on
// cross_entropy): the first columns of the whole vocabulary that are classes (0: all); columns
// past them are padding (ModelConfig::padded_vocab_size) and take no probability.
#include "ir/ops_common.h"

namespace tessera::ops_detail {

namespace {

Status need_shard(const TensorType& t, const char* op) {
  if (t.dtype != DType::i32 || t.shape.numel() != 1)
    return error(std::string(op) + " needs an i32 scalar shard index, got " + t.to_string());
  return Status();
}

Status infer_logsumexp(const Attrs&, std::span<const TensorType> in, std::vector<TensorType>* out) {
  TS_RETURN_IF_ERROR(need_float(in[0], "logsumexp operand"));
  if (in[0].shape.rank() < 1) return error("logsumexp needs a tensor of rank >= 1");
  std::vector<int64_t> d = in[0].shape.dims();
  d.pop_back();
  out->push_back({Shape(d), DType::f32});
  return Status();
}

// A vocab op is its whole-vocabulary op on the block, plus the shard index as its last input.
// The block's inputs are checked by the whole-vocabulary op's inference; the classes count
// the classes of the whole vocabulary, wider than the block, so the cross-entropy checks run
// without it.
Status on_block(InferFn whole, const Attrs& a, std::span<const TensorType> in,
                std::vector<TensorType>* out, const char* op) {
  TS_RETURN_IF_ERROR(need_shard(in.back(), op));
  return whole(a, in.first(in.size() - 1), out);
}

Attrs without_classes(const Attrs& a) {
  CrossEntropyAttrs c = attrs_as<CrossEntropyAttrs>(a);
  c.classes = 0;
  return c;
}

Status infer_vocab_logsumexp(const Attrs&, std::span<const TensorType> in,
                             std::vector<TensorType>* out) {
  if (in[0].shape.rank() < 2) return error("vocab_logsumexp needs logits [..., Vl]");
  return on_block(infer_logsumexp, {}, in, out, "vocab_logsumexp");
}

Status infer_vocab_embedding(const Attrs& a, std::span<const TensorType> in,
                             std::vector<TensorType>* out) {
  return on_block(infer_embedding, a, in, out, "vocab_embedding");
}

Status infer_vocab_embedding_grad(const Attrs& a, std::span<const TensorType> in,
                                  std::vector<TensorType>* out) {
  return on_block(infer_embedding_grad, a, in, out, "vocab_embedding_grad");
}

// One target logit per row: cross_entropy's lse-shaped output.
Status infer_vocab_pick(const Attrs&, std::span<const TensorType> in,
                        std::vector<TensorType>* out) {
  std::vector<TensorType> ce;
  TS_RETURN_IF_ERROR(on_block(infer_cross_entropy, CrossEntropyAttrs{}, in, &ce, "vocab_pick"));
  out->push_back(ce[1]);
  return Status();
}

Status infer_vocab_cross_entropy_grad(const Attrs& a, std::span<const TensorType> in,
                                      std::vector<TensorType>* out) {
  return on_block(infer_cross_entropy_grad, without_classes(a), in, out,
                  "vocab_cross_entropy_grad");
}

}  // namespace

void define_vocab_ops(OpDef* t) {
  def(t, OpKind::logsumexp).infer = infer_logsumexp;
  def(t, OpKind::logsumexp).flops = flops_in0<3>;
  def(t, OpKind::vocab_logsumexp).infer = infer_vocab_logsumexp;
  def(t, OpKind::vocab_logsumexp).flops = flops_in0<3>;
  def(t, OpKind::vocab_embedding).infer = infer_vocab_embedding;
  def(t, OpKind::vocab_embedding_grad).infer = infer_vocab_embedding_grad;
  def(t, OpKind::vocab_embedding_grad).flops = flops_in0<1>;
  def(t, OpKind::vocab_pick).infer = infer_vocab_pick;
  def(t, OpKind::vocab_cross_entropy_grad).infer = infer_vocab_cross_entropy_grad;
  def(t, OpKind::vocab_cross_entropy_grad).flops = flops_in0<4>;
}

}  // namespace tessera::ops_detail
