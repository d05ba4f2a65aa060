// Helpers shared by the op definitions in ops_*.cc (not a public header).
#pragma once

#include <string>

#include "ir/builder.h"
#include "ir/op.h"
#include "ir/placement.h"

namespace tessera::ops_detail {

inline OpDef& def(OpDef* table, OpKind k) { return table[static_cast<size_t>(k)]; }

inline Status need_float(const TensorType& t, const char* what) {
  if (!dtype_is_float(t.dtype))
    return error(std::string(what) + " must be a floating-point tensor, got " + t.to_string());
  return Status();
}

inline Status same_dtype(const TensorType& a, const TensorType& b) {
  if (a.dtype != b.dtype)
    return error("dtypes differ: " + a.to_string() + " vs " + b.to_string(),
                 "insert a cast so both operands have one dtype");
  return Status();
}

inline double out_numel(std::span<const TensorType> out, int i = 0) {
  return static_cast<double>(out[static_cast<size_t>(i)].shape.numel());
}

// FLOPs: kPerElement per element of input 0.
template <int kPerElement>
double flops_in0(const Attrs&, std::span<const TensorType> in, std::span<const TensorType>) {
  return kPerElement * static_cast<double>(in[0].shape.numel());
}

// Defined in ops_nn.cc; the vocab-parallel ops (ops_vocab.cc) check their block with them,
// the fused ops (ops_fused.cc) their product or norm.
Status infer_matmul(const Attrs& a, std::span<const TensorType> in, std::vector<TensorType>* out);
double flops_matmul(const Attrs& a, std::span<const TensorType> in,
                    std::span<const TensorType> out);
bool matmul_sharding(const ShardingRuleArgs& a, std::vector<Placement>* out);
Status infer_layernorm(const Attrs& a, std::span<const TensorType> in,
                       std::vector<TensorType>* out);
Status infer_layernorm_grad(const Attrs& a, std::span<const TensorType> in,
                            std::vector<TensorType>* out);
Status infer_rmsnorm(const Attrs& a, std::span<const TensorType> in, std::vector<TensorType>* out);
Status infer_rmsnorm_grad(const Attrs& a, std::span<const TensorType> in,
                          std::vector<TensorType>* out);
Status infer_embedding(const Attrs& a, std::span<const TensorType> in,
                       std::vector<TensorType>* out);
Status infer_embedding_grad(const Attrs& a, std::span<const TensorType> in,
                            std::vector<TensorType>* out);
Status infer_cross_entropy(const Attrs& a, std::span<const TensorType> in,
                           std::vector<TensorType>* out);
Status infer_cross_entropy_grad(const Attrs& a, std::span<const TensorType> in,
                                std::vector<TensorType>* out);

inline Var in_var(Builder& b, const Node& n, int i) {
  return b.var(n.inputs[static_cast<size_t>(i)]);
}
inline Var out_var(Builder& b, const Node& n, int i) {
  return b.var(n.outputs[static_cast<size_t>(i)]);
}

}  // namespace tessera::ops_detail
