#include "cli/tensor_plan.h"

#include "base/format.h"

namespace tessera {

Result<BlockLayout> place_tensor_parallel(const ModelConfig& cfg, int64_t batch, int64_t seq,
                                          const Graph& full, const SearchCost& cost, Plan* plan) {
  ModelConfig one = cfg;
  one.n_layer = 1;
  ModelGraph m = build_model(one, batch, seq, ModelMode::train);
  TS_ASSIGN_OR_RETURN(BlockLayout b, search_block_layout(m.graph, *plan, cost));
  TS_ASSIGN_OR_RETURN(plan->params, expand_block_layout(b, full, *plan));
  return b;
}

std::string describe_block_layout(const BlockLayout& b, const Plan& plan) {
  const size_t tp = static_cast<size_t>(plan.mesh.axis_index(plan.tensor_axes.at(0)));
  std::string s;
  for (size_t i = 0; i < b.names.size(); ++i)
    s += "placement       " + b.names[i] + " " + b.placements[i][tp].to_string() + " on " +
         plan.tensor_axes[0] + "\n";
  s += "tp search       " + std::to_string(b.candidates) +
       " candidates; block 0 per rank: " + format_bytes(b.tensor_bytes) + " sent over " +
       plan.tensor_axes[0] + " per micro-batch (every block alike)\n";
  return s;
}

}  // namespace tessera
