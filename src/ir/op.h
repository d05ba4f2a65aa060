// The op registry: each op is defined in exactly one place (src/ir/ops_*.cc) by an OpDef that
// holds its shape/dtype inference, FLOP and byte counts, its VJP (in terms of other ops) and
// its sharding rule along one mesh axis (composed from ir/sharding_rules.h). Kernels live in
// backend/.
//
//   const OpDef& d = op_def(OpKind::matmul);
//   d.name == "matmul";  d.num_inputs == 2;
//   for (OpKind k : all_ops()) std::puts(op_def(k).name);
//
// Adding an op touches: one line in TESSERA_OPS below, naming its attribute struct (a new
// struct below when none of them fits), and its OpDef (sharding rule included) in an ops_*.cc
// file (the definition); its CPU kernel, registered in a backend/cpu/kernels_*.cc; its CUDA
// kernel, registered in a backend/cuda/kernels_*.cu; its entry in
// tests/ir/op_consistency_test.cc. Model code builds it with Builder::op<OpKind::k>(inputs,
// attrs) (a Builder method of its own is a convenience, not a requirement).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "base/status.h"
#include "ir/shape.h"

namespace tessera {

// X(name, inputs (-1: variadic), outputs (-1: as many as its shape inference gives), attributes)
#define TESSERA_OPS(X)                                 \
  X(parameter, 0, 1, SourceAttrs)                      \
  X(input, 0, 1, SourceAttrs)                          \
  X(fill, 0, 1, FillAttrs)                             \
  X(add, 2, 1, NoAttrs)                                \
  X(sub, 2, 1, NoAttrs)                                \
  X(mul, 2, 1, NoAttrs)                                \
  X(div, 2, 1, NoAttrs)                                \
  X(scale, 1, 1, ScalarAttrs)                          \
  X(add_scalar, 1, 1, ScalarAttrs)                     \
  X(exp, 1, 1, NoAttrs)                                \
  X(log, 1, 1, NoAttrs)                                \
  X(sqrt, 1, 1, NoAttrs)                               \
  X(rsqrt, 1, 1, NoAttrs)                              \
  X(tanh, 1, 1, NoAttrs)                               \
  X(gelu, 1, 1, NoAttrs)                               \
  X(gelu_grad, 2, 1, NoAttrs)                          \
  X(silu, 1, 1, NoAttrs)                               \
  X(relu, 1, 1, NoAttrs)                               \
  X(relu_grad, 2, 1, NoAttrs)                          \
  X(silu_grad, 2, 1, NoAttrs)                          \
  X(swiglu, 2, 1, NoAttrs)                             \
  X(swiglu_grad, 3, 2, NoAttrs)                        \
  X(reduce_sum, 1, 1, ReduceAttrs)                     \
  X(sum_to, 1, 1, ShapeAttrs)                          \
  X(broadcast_to, 1, 1, ShapeAttrs)                    \
  X(reshape, 1, 1, ShapeAttrs)                         \
  X(transpose, 1, 1, TransposeAttrs)                   \
  X(slice, 1, 1, SliceAttrs)                           \
  X(concat, -1, 1, ConcatAttrs)                        \
  X(matmul, 2, 1, MatmulAttrs)                         \
  X(matmul_bias, 3, 1, MatmulAttrs)                    \
  X(matmul_bias_gelu, 3, 2, MatmulAttrs)               \
  X(matmul_dgelu_bgrad, 3, 2, MatmulAttrs)             \
  X(matmul_bgrad, 2, 2, MatmulAttrs)                   \
  X(add_layernorm, 4, 4, NormAttrs)                    \
  X(layernorm_grad_add, 6, 3, NoAttrs)                 \
  X(add_rmsnorm, 3, 3, NormAttrs)                      \
  X(rmsnorm_grad_add, 5, 2, NoAttrs)                   \
  X(embedding, 2, 1, NoAttrs)                          \
  X(embedding_grad, 2, 1, EmbeddingGradAttrs)          \
  X(layernorm, 3, 3, NormAttrs)                        \
  X(layernorm_grad, 5, 3, NoAttrs)                     \
  X(rmsnorm, 2, 2, NormAttrs)                          \
  X(rmsnorm_grad, 4, 2, NoAttrs)                       \
  X(rope, -1, 1, RopeAttrs)                            \
  X(softmax, 1, 1, NoAttrs)                            \
  X(softmax_grad, 2, 1, NoAttrs)                       \
  X(causal_mask, 1, 1, ScalarAttrs)                    \
  X(position_buckets, 0, 1, PositionBucketsAttrs)      \
  X(attention, -1, 2, AttentionAttrs)                  \
  X(attention_grad, -1, -1, AttentionAttrs)            \
  X(attention_merge, 4, 2, NoAttrs)                    \
  X(cross_entropy, 2, 2, CrossEntropyAttrs)            \
  X(cross_entropy_grad, 4, 1, CrossEntropyAttrs)       \
  X(logsumexp, 1, 1, NoAttrs)                          \
  X(vocab_logsumexp, 2, 1, CrossEntropyAttrs)          \
  X(vocab_embedding, 3, 1, NoAttrs)                    \
  X(vocab_embedding_grad, 3, 1, EmbeddingGradAttrs)    \
  X(vocab_pick, 3, 1, NoAttrs)                         \
  X(vocab_cross_entropy_grad, 5, 1, CrossEntropyAttrs) \
  X(top_k, 1, 2, TopKAttrs)                            \
  X(top_k_grad, 2, 1, TopKAttrs)                       \
  X(moe_slots, 1, 1, MoeAttrs)                         \
  X(moe_dispatch, -1, 1, MoeAttrs)                     \
  X(moe_combine, -1, 1, MoeAttrs)                      \
  X(moe_combine_grad, 3, 1, MoeAttrs)                  \
  X(axis_index, 0, 1, GroupAttrs)                      \
  X(shard_slice, 2, 1, ShardSliceAttrs)                \
  X(cast, 1, 1, CastAttrs)                             \
  X(all_reduce, 1, 1, GroupAttrs)                      \
  X(reduce_scatter, 1, 1, GroupAttrs)                  \
  X(all_gather, 1, 1, GroupAttrs)                      \
  X(all_to_all, 1, 1, GroupAttrs)                      \
  X(ring_shift, 1, 1, GroupAttrs)

enum class OpKind : uint16_t {
#define TS_OP_ENUM(name, in, out, attrs) name,
  TESSERA_OPS(TS_OP_ENUM)
#undef TS_OP_ENUM
};

inline constexpr int kNumOps = 0
#define TS_OP_COUNT(name, in, out, attrs) +1
    TESSERA_OPS(TS_OP_COUNT)
#undef TS_OP_COUNT
    ;

// How a parameter is initialized (recorded in the graph so any backend can do it).
enum class Init : uint8_t { zeros, ones, normal };

// Typed attributes: each op takes one of these structs (the last column of TESSERA_OPS), and
// reads it with attrs_as<T>() or Node::attr<T>(). Graph::add_node refuses a node whose attributes
// are of another type; Builder::op<OpKind::k>(inputs, attrs) takes the op's own type.

struct NoAttrs {};

// parameter, input: a named source of the given shape.
struct SourceAttrs {
  std::string name{};
  std::vector<int64_t> shape{};
  DType dtype = DType::f32;
  Init init = Init::zeros;  // parameter
  double init_std = 0.0;    // parameter, Init::normal
  // parameter: dim 0 indexes the experts of a mixture-of-experts layer (expert parallelism
  // splits it: each rank of the expert axis holds its experts' rows).
  bool experts = false;
  // parameter: held in host memory (Plan::offload params): the device has no storage for it;
  // its only readers are ZeRO-3 all-gathers, each fed by a copy of it over the host link.
  bool host = false;
};

struct FillAttrs {
  std::vector<int64_t> shape{};
  double value = 0.0;
  DType dtype = DType::f32;
};

// scale: the factor; add_scalar: the addend; causal_mask: the masked entries' value.
struct ScalarAttrs {
  double value = 0.0;
};

// reshape, broadcast_to, sum_to: the target shape.
struct ShapeAttrs {
  std::vector<int64_t> shape{};
};

struct ReduceAttrs {
  std::vector<int64_t> axes{};
  bool keepdim = false;
};

struct TransposeAttrs {
  std::vector<int64_t> perm{};  // output dim i is input dim perm[i]
};

struct SliceAttrs {
  int64_t axis = 0;
  int64_t start = 0, end = 0;  // [start, end)
};

struct ConcatAttrs {
  int64_t axis = 0;
};

// fold_batch (with transpose_a): a [..., R, M] and b [..., R, N] of equal leading dims give
// out [M, N], the sum over every leading dim and R of a's rows times b's (one GEMM over the
// rows of both, flattened). A shared weight's gradient takes this form: unlike a reshape to
// [rows, M], it needs no contiguous rows, so operands split on the sequence stay split.
struct MatmulAttrs {
  bool transpose_a = false, transpose_b = false;  // swap the operand's last two dims
  bool fold_batch = false;
};

// embedding_grad, vocab_embedding_grad: the rows of the table the gradient is for.
struct EmbeddingGradAttrs {
  int64_t rows = 0;
};

// layernorm, rmsnorm.
struct NormAttrs {
  double eps = 1e-5;
};

// rope(x [B,T,H,D][, block]): the rotation of position t (of dim 1). With `block`, an i32
// scalar that the partition pass adds where context parallelism splits the sequence, x holds
// the block-th of equal chunks of it: position block * T + t; with zigzag = N as well, the
// halves block and 2N-1-block of 2N (sequence_position below).
struct RopeAttrs {
  double theta = 1e4;    // the base of the rotation frequencies
  bool inverse = false;  // rotate by -angle (the VJP)
  int64_t zigzag = 0;    // with a block: the chunks' count N of a zigzag order (0: contiguous)
};

// T5's relative position buckets (ir/position_buckets.h), i32 [tq, tk].
struct PositionBucketsAttrs {
  int64_t tq = 0, tk = 0;
  int64_t num_buckets = 32, max_distance = 128;
  bool bidirectional = false;
};

// attention(q, k, v[, bias][, block]), attention_grad(q, k, v, out, lse, dout[, bias][, block]).
// With `block`, an i32 scalar that the partition pass adds where context parallelism splits the
// sequence, the Tq queries are the block-th of equal chunks of the Tk keys' sequence (query i
// at position block * Tq + i, for the causal mask; with zigzag = N, sequence_position below).
struct AttentionAttrs {
  double scale = 0.0;  // softmax scale
  bool causal = true;  // query i attends to keys <= i (else to all)
  int64_t zigzag = 0;  // with a block: the chunks' count N of a zigzag order (0: contiguous)
};

// The position in the whole sequence of row t of sequence chunk `block`, `len` rows long: the
// block-th of equal chunks (zigzag 0), or of a zigzag order over N = zigzag ranks the halves
// `block` and 2N-1-block of 2N (rows [0, len/2) and [len/2, len)). Increasing in t either way.
constexpr int64_t sequence_position(int64_t t, int64_t block, int64_t len, int64_t zigzag) {
  if (zigzag <= 0) return block * len + t;
  const int64_t h = len / 2;
  return t < h ? block * h + t : (2 * zigzag - 1 - block) * h + (t - h);
}

// How many rows of that chunk sit at positions below p: a prefix of its rows, as their
// positions increase (the causal mask's bound; the CPU and CUDA attention kernels use it).
constexpr int64_t rows_before(int64_t p, int64_t block, int64_t len, int64_t zigzag) {
  if (zigzag <= 0) return std::clamp<int64_t>(p - block * len, 0, len);
  const int64_t h = len / 2;
  return std::clamp<int64_t>(p - block * h, 0, h) +
         std::clamp<int64_t>(p - (2 * zigzag - 1 - block) * h, 0, h);
}

// cross_entropy(_grad), vocab_logsumexp, vocab_cross_entropy_grad.
struct CrossEntropyAttrs {
  int64_t classes = 0;  // the logits' first columns that are classes (0: all), the rest padding
  int64_t rows = 0;     // the rows the mean divides by (0: the input's rows)
};

// The rows of logits [..., V] (every dim but the classes): what cross_entropy averages over.
inline int64_t logit_rows(const Shape& logits) {
  return logits.rank() > 0 && logits[-1] > 0 ? logits.numel() / logits[-1] : 0;
}

// top_k(x [..., n]) -> values [..., k], indices i32 [..., k]: each row's k largest entries in
// decreasing order (ties: the lower index first). top_k_grad(dvalues, indices) -> [..., n]: the
// values' gradient put back at their indices, zeros elsewhere (n, the rows' width).
struct TopKAttrs {
  int64_t k = 1;
  int64_t n = 0;  // top_k_grad
};

// Mixture-of-experts routing (ops_moe.cc): `experts` experts of `capacity` token slots each.
// A slot index is expert * capacity + position; -1 is a token dropped by a full expert.
struct MoeAttrs {
  int64_t experts = 0;
  int64_t capacity = 0;
};

struct CastAttrs {
  DType dtype = DType::f32;
};

// Collectives and axis_index: a rank group named by its mesh axes ("dp" or "dp_rep,dp_shard").
struct GroupAttrs {
  std::string axes{};
  int64_t size = 0;              // collectives: ranks in the group
  std::vector<int64_t> shape{};  // all_gather: the gathered tensor's shape (padding dropped)
  int64_t back = 0;              // axis_index: the index of the rank `back` places before
  // all_gather / reduce_scatter: that many collectives, one per equal consecutive piece of the
  // operand (ops_comm.cc), so a split dim with others before it needs no transpose.
  int64_t segments = 1;
};

// shard_slice: block in(1) of `blocks` equal blocks along `axis`.
struct ShardSliceAttrs {
  int64_t axis = 0;
  int64_t blocks = 0;
};

// Every attribute type but NoAttrs (Attrs' first alternative, a default-constructed Attrs).
// clang-format off
#define TESSERA_ATTRS(X)   \
  X(SourceAttrs)           \
  X(FillAttrs)             \
  X(ScalarAttrs)           \
  X(ShapeAttrs)            \
  X(ReduceAttrs)           \
  X(TransposeAttrs)        \
  X(SliceAttrs)            \
  X(ConcatAttrs)           \
  X(MatmulAttrs)           \
  X(EmbeddingGradAttrs)    \
  X(NormAttrs)             \
  X(RopeAttrs)             \
  X(PositionBucketsAttrs)  \
  X(AttentionAttrs)        \
  X(CrossEntropyAttrs)     \
  X(TopKAttrs)             \
  X(MoeAttrs)              \
  X(CastAttrs)             \
  X(GroupAttrs)            \
  X(ShardSliceAttrs)
// clang-format on

#define TS_ATTRS_TYPE(T) , T
using Attrs = std::variant<NoAttrs TESSERA_ATTRS(TS_ATTRS_TYPE)>;
#undef TS_ATTRS_TYPE

// The index of T among Attrs' alternatives.
template <class T, class V = Attrs>
struct AttrsIndex;
template <class T, class... Ts>
struct AttrsIndex<T, std::variant<Ts...>> {
  static constexpr size_t value = [] {
    size_t i = 0;
    ((std::is_same_v<T, Ts> ? false : (++i, true)) && ...);
    return i;
  }();
};

// The name of Attrs alternative i ("RopeAttrs").
const char* attrs_type_name(size_t index);

namespace detail {
[[noreturn]] void wrong_attrs(size_t want, size_t have);
}

// The attributes as T; a bug (abort) when they are of another type.
template <class T>
const T& attrs_as(const Attrs& a) {
  const T* p = std::get_if<T>(&a);
  if (p == nullptr) detail::wrong_attrs(AttrsIndex<T>::value, a.index());
  return *p;
}
template <class T>
T& attrs_as(Attrs& a) {
  T* p = std::get_if<T>(&a);
  if (p == nullptr) detail::wrong_attrs(AttrsIndex<T>::value, a.index());
  return *p;
}

// OpAttrsOf<OpKind::rope>::type is RopeAttrs.
template <OpKind K>
struct OpAttrsOf;
#define TS_OP_ATTRS(name, in, out, attrs) \
  template <>                             \
  struct OpAttrsOf<OpKind::name> {        \
    using type = attrs;                   \
  };
TESSERA_OPS(TS_OP_ATTRS)
#undef TS_OP_ATTRS

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
  size_t attrs_index = 0;  // the Attrs alternative the op takes
};

const OpDef& op_def(OpKind kind);
const char* op_name(OpKind kind);
std::span<const OpKind> all_ops();
bool op_from_name(std::string_view name, OpKind* out);

// all_reduce, reduce_scatter, all_gather, all_to_all, ring_shift: run on a Communicator, not
// a Backend (ops_comm.cc).
bool is_collective(OpKind kind);

// matmul and the fused GEMM epilogues (ops_fused.cc): one matrix product each, which the cost
// model times as a GEMM.
bool is_gemm(OpKind kind);

// Where rope's and attention's optional inputs are among `in` (-1: absent): the score bias
// ([H,Tq,Tk], f32), the sequence block index of the queries (an i32 scalar) and, after it,
// attention's key block index (an i32 scalar: the keys are that chunk of the sequence, not all
// of it; ring attention). `forward_inputs`: the inputs before the optional ones (rope 1,
// attention 3, attention_grad 6).
struct OptionalInputs {
  int bias = -1, block = -1, key_block = -1;
};
OptionalInputs optional_inputs(std::span<const TensorType> in, size_t forward_inputs);

double op_flops(OpKind kind, const Attrs& a, std::span<const TensorType> in,
                std::span<const TensorType> out);
double op_bytes(OpKind kind, const Attrs& a, std::span<const TensorType> in,
                std::span<const TensorType> out);

// Filled by ops_*.cc; called once by the registry.
namespace ops_detail {
void define_elementwise_ops(OpDef* table);
void define_shape_ops(OpDef* table);
void define_nn_ops(OpDef* table);
void define_fused_ops(OpDef* table);
void define_comm_ops(OpDef* table);
void define_vocab_ops(OpDef* table);
void define_moe_ops(OpDef* table);
}  // namespace ops_detail

}  // namespace tessera
