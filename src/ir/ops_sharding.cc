// Placement's text and the sharding-rule building blocks (ir/sharding_rules.h) the op
// definitions compose; each op's own rule sits with its definition in ops_*.cc. Ops without a
// rule run only on replicated inputs.
#include <algorithm>

#include "ir/sharding_rules.h"

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

using P = Placement;
using Out = std::vector<Placement>;

bool all_outputs(const ShardingRuleArgs& a, Out* out, P p) {
  out->assign(a.out.size(), p);
  return true;
}

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

}  // namespace ops_detail
}  // namespace tessera
