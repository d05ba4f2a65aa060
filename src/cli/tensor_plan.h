// `--tp N` for `plan` and `simulate`: the placements of a model's parameters on the tensor
// axis, found by the sharding search (parallel/sharding_search.h) on a one-block copy of the
// model and spread over every block of the full graph.
//
//   Plan plan = Plan::tensor_parallel(dp, tp, zero);
//   TS_ASSIGN_OR_RETURN(BlockLayout b, place_tensor_parallel(cfg, batch, seq, full, cost, &plan));
//   std::fputs(describe_block_layout(b, plan).c_str(), stdout);
#pragma once

#include <string>

#include "models/model.h"
#include "parallel/sharding_search.h"

namespace tessera {

// Searches with `batch` x `seq` (the global micro-batch; the plan's data axes split it) and
// writes the placements into plan->params.
Result<BlockLayout> place_tensor_parallel(const ModelConfig& cfg, int64_t batch, int64_t seq,
                                          const Graph& full, const SearchCost& cost, Plan* plan);

// One line per block-0 parameter with its placement on the tensor axis, then the search's
// cost figures.
std::string describe_block_layout(const BlockLayout& b, const Plan& plan);

}  // namespace tessera
