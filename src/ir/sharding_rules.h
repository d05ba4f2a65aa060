// The sharding-rule building blocks the op definitions (ops_*.cc) compose. A rule returns the
// output placements along one mesh axis for the inputs' placements, or false when the op cannot
// run on local pieces laid out that way (ir/placement.h); each op's rule is set beside the rest
// of its definition.
#pragma once

#include <initializer_list>
#include <vector>

#include "ir/placement.h"

namespace tessera::ops_detail {

// Every output with placement p; true.
bool all_outputs(const ShardingRuleArgs& a, std::vector<Placement>* out, Placement p);
// Every input either shares one sharded dim below `forbidden_from` (same-shape ops), or all are
// Partial when the op is linear in each of them.
bool same_shape_rule(const ShardingRuleArgs& a, std::vector<Placement>* out, bool linear,
                     int forbidden_from);
bool elementwise_unary(const ShardingRuleArgs& a, std::vector<Placement>* out);  // any dim
bool linear_unary(const ShardingRuleArgs& a, std::vector<Placement>* out);       // Partial passes
bool same_shape(const ShardingRuleArgs& a, std::vector<Placement>* out);         // several inputs
// Row-wise ops over the last dim (norms and their grads). `acts` lists the inputs shaped like
// x or like its rows (x without the last dim), which must share x's sharded dim; the others
// are weights [C] and must be replicated. The first `n_row_out` outputs are row-shaped and
// sharded like x; the rest are weight gradients, Partial.
bool rowwise(const ShardingRuleArgs& a, std::vector<Placement>* out,
             std::initializer_list<int> acts, int n_row_out);

}  // namespace tessera::ops_detail
