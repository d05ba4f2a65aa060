// Collective ops, inserted by the partition pass (parallel/partition.h), never by model code.
// They run on a Communicator (comm/), not on a Backend; GroupAttrs::axes names the mesh axes of
// the rank group ("dp", or "dp_rep,dp_shard" for a group spanning both) and ::size its size.
//
//   all_reduce(x)       sums x over the group; same shape.
//   reduce_scatter(x)   sums x over the group and keeps this rank's block of the flattened,
//                       zero-padded sum: [ceil(numel / size)].
//   all_gather(x)       x is one rank's block [c] of a flattened tensor; returns the whole
//                       tensor, of GroupAttrs::shape (the first numel of size * c elements).
//                       With GroupAttrs::segments = k > 1, x is k pieces [k, c / k] gathered
//                       one by one, without padding: the output holds [k, size, c / k], piece
//                       j of rank i at [j, i] (a dim split over the group with dims of k
//                       elements before it, gathered in place).
//   reduce_scatter(x)   with GroupAttrs::segments = k > 1: x [k, size, m], each piece [size, m]
//                       reduce-scattered on its own, without padding: the output [k * m] holds
//                       this rank's block of each piece.
//   all_to_all(x)       x [size * b, ...]: block j of dim 0 goes to rank j; the output, of the
//                       same shape, holds in block i what rank i sent (the partition pass
//                       moves a split from one dim to another with it: parallel/redistribute.h)
//   ring_shift(x)       sends x to the next rank of the group (index + 1 mod size) and returns
//                       what the previous one sent: same shape (ring attention's keys, values
//                       and their gradients, parallel/partition_context.cc).
//   axis_index()        this rank's index in the group, an i32 scalar (what rank-dependent
//                       ops such as vocab_embedding take as their shard); with GroupAttrs::back
//                       = b, the index of the rank b places before it ((index - b) mod size:
//                       whose chunk a ring has brought after b shifts). Not a collective
//                       (nothing is sent); like them it runs on the runtime, which knows the
//                       rank, not on a Backend.
#include "ir/ops_common.h"

namespace tessera {

bool is_collective(OpKind k) {
  return k == OpKind::all_reduce || k == OpKind::reduce_scatter || k == OpKind::all_gather ||
         k == OpKind::all_to_all || k == OpKind::ring_shift;
}

namespace ops_detail {

namespace {

Status need_group(const Attrs& attrs) {
  const GroupAttrs& a = attrs_as<GroupAttrs>(attrs);
  if (a.size < 1 || a.axes.empty())
    return error("collective needs a rank group: its mesh axes and a size >= 1");
  return Status();
}

Status infer_all_reduce(const Attrs& a, std::span<const TensorType> in,
                        std::vector<TensorType>* out) {
  TS_RETURN_IF_ERROR(need_group(a));
  TS_RETURN_IF_ERROR(need_float(in[0], "all_reduce operand"));
  out->push_back(in[0]);
  return Status();
}

Status infer_reduce_scatter(const Attrs& attrs, std::span<const TensorType> in,
                            std::vector<TensorType>* out) {
  const GroupAttrs& a = attrs_as<GroupAttrs>(attrs);
  TS_RETURN_IF_ERROR(need_group(attrs));
  TS_RETURN_IF_ERROR(need_float(in[0], "reduce_scatter operand"));
  int64_t n = in[0].shape.numel();
  if (a.segments < 1 || (a.segments > 1 && n % (a.segments * a.size) != 0))
    return error("reduce_scatter of " + in[0].to_string() + " in " + std::to_string(a.segments) +
                 " pieces over " + std::to_string(a.size) + " ranks: the pieces must split evenly");
  out->push_back({Shape{(n + a.size - 1) / a.size}, in[0].dtype});
  return Status();
}

Status infer_all_gather(const Attrs& attrs, std::span<const TensorType> in,
                        std::vector<TensorType>* out) {
  const GroupAttrs& a = attrs_as<GroupAttrs>(attrs);
  TS_RETURN_IF_ERROR(need_group(attrs));
  TS_RETURN_IF_ERROR(need_float(in[0], "all_gather operand"));
  Shape s(a.shape);
  if (in[0].shape.rank() != 1 || in[0].shape[0] * a.size < s.numel())
    return error("all_gather of " + in[0].to_string() + " over " + std::to_string(a.size) +
                 " ranks cannot hold " + s.to_string());
  if (a.segments < 1 || (a.segments > 1 && (in[0].shape[0] % a.segments != 0 ||
                                            in[0].shape[0] * a.size != s.numel())))
    return error("all_gather of " + in[0].to_string() + " in " + std::to_string(a.segments) +
                 " pieces over " + std::to_string(a.size) + " ranks: the pieces must split " +
                 s.to_string() + " evenly");
  out->push_back({s, in[0].dtype});
  return Status();
}

Status infer_all_to_all(const Attrs& attrs, std::span<const TensorType> in,
                        std::vector<TensorType>* out) {
  const GroupAttrs& a = attrs_as<GroupAttrs>(attrs);
  TS_RETURN_IF_ERROR(need_group(attrs));
  TS_RETURN_IF_ERROR(need_float(in[0], "all_to_all operand"));
  if (in[0].shape.rank() < 1 || in[0].shape[0] % a.size != 0)
    return error("all_to_all of " + in[0].to_string() + ": dim 0 does not split into " +
                 std::to_string(a.size) + " blocks");
  out->push_back(in[0]);
  return Status();
}

// Bytes moved over the network by one rank (ring algorithms).
double bytes_all_reduce(const Attrs& attrs, std::span<const TensorType> in,
                        std::span<const TensorType>) {
  const GroupAttrs& a = attrs_as<GroupAttrs>(attrs);
  return 2.0 * static_cast<double>(a.size - 1) / static_cast<double>(a.size) *
         static_cast<double>(in[0].bytes());
}
double bytes_reduce_scatter(const Attrs& attrs, std::span<const TensorType>,
                            std::span<const TensorType> out) {
  const GroupAttrs& a = attrs_as<GroupAttrs>(attrs);
  return static_cast<double>(a.size - 1) * static_cast<double>(out[0].bytes());
}
double bytes_all_to_all(const Attrs& attrs, std::span<const TensorType> in,
                        std::span<const TensorType>) {
  const GroupAttrs& a = attrs_as<GroupAttrs>(attrs);
  return static_cast<double>(a.size - 1) / static_cast<double>(a.size) *
         static_cast<double>(in[0].bytes());
}
Status infer_ring_shift(const Attrs& a, std::span<const TensorType> in,
                        std::vector<TensorType>* out) {
  TS_RETURN_IF_ERROR(need_group(a));
  TS_RETURN_IF_ERROR(need_float(in[0], "ring_shift operand"));
  out->push_back(in[0]);
  return Status();
}
// Each rank sends its whole operand once.
double bytes_ring_shift(const Attrs&, std::span<const TensorType> in, std::span<const TensorType>) {
  return static_cast<double>(in[0].bytes());
}
Status infer_axis_index(const Attrs& a, std::span<const TensorType>, std::vector<TensorType>* out) {
  TS_RETURN_IF_ERROR(need_group(a));
  out->push_back({Shape{}, DType::i32});
  return Status();
}

double bytes_all_gather(const Attrs& attrs, std::span<const TensorType> in,
                        std::span<const TensorType>) {
  const GroupAttrs& a = attrs_as<GroupAttrs>(attrs);
  return static_cast<double>(a.size - 1) * static_cast<double>(in[0].bytes());
}

}  // namespace

void define_comm_ops(OpDef* t) {
  def(t, OpKind::all_reduce).infer = infer_all_reduce;
  def(t, OpKind::all_reduce).bytes = bytes_all_reduce;
  def(t, OpKind::reduce_scatter).infer = infer_reduce_scatter;
  def(t, OpKind::reduce_scatter).bytes = bytes_reduce_scatter;
  def(t, OpKind::all_gather).infer = infer_all_gather;
  def(t, OpKind::all_gather).bytes = bytes_all_gather;
  def(t, OpKind::all_to_all).infer = infer_all_to_all;
  def(t, OpKind::all_to_all).bytes = bytes_all_to_all;
  def(t, OpKind::ring_shift).infer = infer_ring_shift;
  def(t, OpKind::ring_shift).bytes = bytes_ring_shift;
  def(t, OpKind::axis_index).infer = infer_axis_index;
}

}  // namespace ops_detail
}  // namespace tessera
