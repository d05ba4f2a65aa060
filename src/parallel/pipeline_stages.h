// Where a pipeline cuts the model: contiguous runs of transformer blocks per model chunk
// (stages x virtual stages of them), balanced by cost unless the user gives the counts.
// Everything outside the blocks rides with the first chunk (the embedding) or the last (the
// final norm, the LM head and the loss), and counts toward their cost.
//
//   LayerCosts c = layer_costs(graph, [&](const Node& n) { return seconds_of(n); });
//   TS_ASSIGN_OR_RETURN(std::vector<int> per_chunk, balance_stages(c, 8));  // 8 chunks
//   TS_ASSIGN_OR_RETURN(per_chunk, parse_stage_layers("5,6,6,5", 22, 4));   // --stage-layers
#pragma once

#include <functional>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "ir/graph.h"

namespace tessera {

struct LayerCosts {
  std::vector<double> block;  // per transformer block: its forward and backward nodes
  double before = 0;          // outside the blocks, on the first chunk (embedding)
  double after = 0;           // outside the blocks, on the last chunk (final norm, head, loss)
};

// Sums `cost` over g's nodes by Node::layer. A node outside the blocks counts as `before` when
// it is a forward node ahead of the first block's, or a backward node after the last block's
// backward; otherwise as `after`.
LayerCosts layer_costs(const Graph& g, const std::function<double(const Node&)>& cost);

// Blocks per model chunk (chunks of them, each >= 1, summing to the blocks), contiguous and in
// order, minimising the largest chunk's cost (chunk 0 also carries `before`, the last `after`),
// then the spread of the costs; of equal cuts, later chunks take the extra blocks.
// An error when there are more chunks than blocks.
Result<std::vector<int>> balance_stages(const LayerCosts& c, int chunks);

// The total cost of each chunk under `per_chunk`.
std::vector<double> chunk_costs(const LayerCosts& c, const std::vector<int>& per_chunk);

// "a,b,..." (--stage-layers): `chunks` positive counts summing to `blocks`; errors say which.
Result<std::vector<int>> parse_stage_layers(std::string_view text, int blocks, int chunks);

}  // namespace tessera
