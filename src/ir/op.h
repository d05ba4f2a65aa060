// The op registry: each op is defined in exactly one place (src/ir/ops_*.cc) by an OpDef that
// holds its shape/dtype inference, FLOP and byte counts, its VJP (in terms of other ops) and
// its sharding rule along one mesh axis (composed from ir/sharding_rules.h). Kernels live in
// backend/.
//
//   const OpDef& d = op_def(OpKind::matmul);
//   d.name == "matmul";  d.num_inputs == 2;
//   for (OpKind k : all_ops()) std::puts(op_def(k).name);
//
// Adding an op touches: one line in TESSERA_OPS below and its OpDef (sharding rule included)
// in an ops_*.cc file (the definition); its CPU kernel, registered in a backend/cpu/kernels_*.cc;
// its CUDA kernel, registered in a backend/cuda/kernels_*.cu; its entry in
// tests/ir/op_consistency_test.cc. Model code builds it with Builder::apply (a Builder method
// of its own is a convenience, not a requirement).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "ir/shape.h"

namespace tessera {

// X(name, inputs (-1: variadic), outputs (-1: as many as its shape inference gives))
#define TESSERA_OPS(X)              \
  X(parameter, 0, 1)                \
  X(input, 0, 1)                    \
  X(fill, 0, 1)                     \
  X(add, 2, 1)                      \
  X(sub, 2, 1)                      \
  X(mul, 2, 1)                      \
  X(div, 2, 1)                      \
  X(scale, 1, 1)                    \
  X(add_scalar, 1, 1)               \
  X(exp, 1, 1)                      \
  X(log, 1, 1)                      \
  X(sqrt, 1, 1)                     \
  X(rsqrt, 1, 1)                    \
  X(tanh, 1, 1)                     \
  X(gelu, 1, 1)                     \
  X(gelu_grad, 2, 1)                \
  X(silu, 1, 1)                     \
  X(relu, 1, 1)                     \
  X(relu_grad, 2, 1)                \
  X(silu_grad, 2, 1)                \
  X(swiglu, 2, 1)                   \
  X(swiglu_grad, 3, 2)              \
  X(reduce_sum, 1, 1)               \
  X(sum_to, 1, 1)                   \
  X(broadcast_to, 1, 1)             \
  X(reshape, 1, 1)                  \
  X(transpose, 1, 1)                \
  X(slice, 1, 1)                    \
  X(concat, -1, 1)                  \
  X(matmul, 2, 1)                   \
  X(embedding, 2, 1)                \
  X(embedding_grad, 2, 1)           \
  X(layernorm, 3, 3)                \
  X(layernorm_grad, 5, 3)           \
  X(rmsnorm, 2, 2)                  \
  X(rmsnorm_grad, 4, 2)             \
  X(rope, 1, 1)                     \
  X(softmax, 1, 1)                  \
  X(softmax_grad, 2, 1)             \
  X(causal_mask, 1, 1)              \
  X(position_buckets, 0, 1)         \
  X(attention, -1, 2)               \
  X(attention_grad, -1, -1)         \
  X(cross_entropy, 2, 2)            \
  X(cross_entropy_grad, 4, 1)       \
  X(logsumexp, 1, 1)                \
  X(vocab_logsumexp, 2, 1)          \
  X(vocab_embedding, 3, 1)          \
  X(vocab_embedding_grad, 3, 1)     \
  X(vocab_pick, 3, 1)               \
  X(vocab_cross_entropy_grad, 5, 1) \
  X(axis_index, 0, 1)               \
  X(shard_slice, 2, 1)              \
  X(cast, 1, 1)                     \
  X(all_reduce, 1, 1)               \
  X(reduce_scatter, 1, 1)           \
  X(all_gather, 1, 1)

enum class OpKind : uint16_t {
#define TS_OP_ENUM(name, in, out) name,
  TESSERA_OPS(TS_OP_ENUM)
#undef TS_OP_ENUM
};

inline constexpr int kNumOps = 0
#define TS_OP_COUNT(name, in, out) +1
    TESSERA_OPS(TS_OP_COUNT)
#undef TS_OP_COUNT
    ;

// How a parameter is initialized (recorded in the graph so any backend can do it).
enum class Init : uint8_t { zeros, ones, normal };

// Typed attributes; each op reads only the fields its OpDef documents.
struct Attrs {
  std::vector<int64_t> ints;   // reshape/broadcast_to/sum_to/fill: target shape; transpose:
                               // perm; reduce_sum: axes; position_buckets: {Tq, Tk,
                               // num_buckets, max_distance}
  int64_t axis = 0;            // slice, concat, shard_slice
  int64_t start = 0, end = 0;  // slice [start, end)
  bool transpose_a = false, transpose_b = false;  // matmul
  bool keepdim = false;                           // reduce_sum
  bool inverse = false;                           // rope: rotate by -angle (its VJP)
  bool causal = true;   // attention(_grad): query i attends to keys <= i (else to all);
                        // position_buckets: unidirectional (else bidirectional)
  double scalar = 0.0;  // scale: factor; add_scalar: addend; fill/causal_mask: value;
                        // attention: softmax scale
  double eps = 1e-5;    // layernorm, rmsnorm
  double theta = 1e4;   // rope base
  int64_t vocab = 0;    // embedding_grad, vocab_embedding_grad: table rows; cross_entropy(_grad),
                        // vocab_cross_entropy_grad, vocab_logsumexp: the logits' columns that
                        // are classes (0: all), the rest padding
  int64_t count = 0;    // cross_entropy(_grad): rows the mean divides by (0: the input's rows);
                        // collectives: size of the rank group; shard_slice: blocks
  DType dtype = DType::f32;  // cast target; parameter/input/fill dtype
  std::string name;          // parameter/input name; collectives and axis_index: mesh axes
                             // ("dp" or "dp_rep,dp_shard")
  Init init = Init::zeros;   // parameter
  double init_std = 0.0;     // parameter, Init::normal
};

class Builder;
struct Node;
struct Var;

using InferFn = Status (*)(const Attrs&, std::span<const TensorType> in,
                           std::vector<TensorType>* out);
using CostFn = double (*)(const Attrs&, std::span<const TensorType> in,
                          std::span<const TensorType> out);
// Appends the gradient computation of `node` to the builder's graph. out_grads[i] is the
// gradient of the loss w.r.t. output i (invalid when no path to the loss); the function sets
// (*in_grads)[j] for each differentiable input j.
using VjpFn = void (*)(Builder& b, const Node& node, std::span<const Var> out_grads,
                       std::vector<Var>* in_grads);
// The shardings the op accepts along one mesh axis (ir/placement.h).
struct ShardingRuleArgs;
struct Placement;
using ShardingRuleFn = bool (*)(const ShardingRuleArgs& args, std::vector<Placement>* out);

struct OpDef {
  const char* name = nullptr;
  int num_inputs = 0;   // -1: variadic
  int num_outputs = 1;  // -1: as many as infer gives
  InferFn infer = nullptr;
  CostFn flops = nullptr;  // nullptr: no arithmetic (data movement only)
  CostFn bytes = nullptr;  // nullptr: inputs + outputs are read/written once
  VjpFn vjp = nullptr;     // nullptr: not differentiable (backward ops, sources)
  // For backward-only ops: the forward op whose gradient check covers this op.
  const char* gradient_of = nullptr;
  ShardingRuleFn sharding = nullptr;
};

const OpDef& op_def(OpKind kind);
const char* op_name(OpKind kind);
std::span<const OpKind> all_ops();
bool op_from_name(std::string_view name, OpKind* out);

// all_reduce, reduce_scatter, all_gather: run on a Communicator, not a Backend (ops_comm.cc).
bool is_collective(OpKind kind);

double op_flops(OpKind kind, const Attrs& a, std::span<const TensorType> in,
                std::span<const TensorType> out);
double op_bytes(OpKind kind, const Attrs& a, std::span<const TensorType> in,
                std::span<const TensorType> out);

// Filled by ops_*.cc; called once by the registry.
namespace ops_detail {
void define_elementwise_ops(OpDef* table);
void define_shape_ops(OpDef* table);
void define_nn_ops(OpDef* table);
void define_comm_ops(OpDef* table);
void define_vocab_ops(OpDef* table);
}  // namespace ops_detail

}  // namespace tessera
