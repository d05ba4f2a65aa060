#include "ir/op.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "base/check.h"

namespace tessera {

namespace {

struct Registry {
  std::array<OpDef, kNumOps> defs;
  std::array<OpKind, kNumOps> kinds;
  Registry() {
    int i = 0;
#define TS_OP_INIT(op, in, out, attrs)            \
  kinds[i] = OpKind::op;                          \
  defs[i].name = #op;                             \
  defs[i].num_inputs = in;                        \
  defs[i].num_outputs = out;                      \
  defs[i].attrs_index = AttrsIndex<attrs>::value; \
  ++i;
    TESSERA_OPS(TS_OP_INIT)
#undef TS_OP_INIT
    ops_detail::define_elementwise_ops(defs.data());
    ops_detail::define_shape_ops(defs.data());
    ops_detail::define_nn_ops(defs.data());
    ops_detail::define_fused_ops(defs.data());
    ops_detail::define_comm_ops(defs.data());
    ops_detail::define_vocab_ops(defs.data());
    ops_detail::define_moe_ops(defs.data());
    for (const OpDef& d : defs)
      TS_CHECK(d.infer != nullptr) << "op '" << d.name << "' has no definition";
  }
};

const Registry& registry() {
  static const Registry r;
  return r;
}

}  // namespace

const char* attrs_type_name(size_t index) {
#define TS_ATTRS_NAME(T) , #T
  static constexpr const char* kNames[] = {"NoAttrs" TESSERA_ATTRS(TS_ATTRS_NAME)};
#undef TS_ATTRS_NAME
  return index < std::size(kNames) ? kNames[index] : "?";
}

void detail::wrong_attrs(size_t want, size_t have) {
  TS_CHECK(false) << "attributes read as " << attrs_type_name(want) << " but they are "
                  << attrs_type_name(have);
  std::abort();
}

const OpDef& op_def(OpKind kind) { return registry().defs[static_cast<size_t>(kind)]; }
const char* op_name(OpKind kind) { return op_def(kind).name; }
std::span<const OpKind> all_ops() { return registry().kinds; }

bool op_from_name(std::string_view name, OpKind* out) {
  for (OpKind k : all_ops()) {
    if (name == op_name(k)) {
      *out = k;
      return true;
    }
  }
  return false;
}

double op_flops(OpKind kind, const Attrs& a, std::span<const TensorType> in,
                std::span<const TensorType> out) {
  const OpDef& d = op_def(kind);
  return d.flops ? d.flops(a, in, out) : 0.0;
}

double op_bytes(OpKind kind, const Attrs& a, std::span<const TensorType> in,
                std::span<const TensorType> out) {
  const OpDef& d = op_def(kind);
  if (d.bytes) return d.bytes(a, in, out);
  double total = 0;
  for (const TensorType& t : in) total += static_cast<double>(t.bytes());
  for (const TensorType& t : out) total += static_cast<double>(t.bytes());
  return total;
}

OptionalInputs optional_inputs(std::span<const TensorType> in, size_t forward_inputs) {
  OptionalInputs o;
  size_t end = in.size();
  auto index_last = [&] {
    return end > forward_inputs && in[end - 1].dtype == DType::i32 && in[end - 1].shape.rank() == 0;
  };
  if (index_last()) o.block = static_cast<int>(--end);
  if (index_last()) o.key_block = o.block, o.block = static_cast<int>(--end);
  if (end > forward_inputs) o.bias = static_cast<int>(forward_inputs);
  return o;
}

}  // namespace tessera
