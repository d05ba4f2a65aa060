#include "parallel/pipeline_stages.h"

#include <algorithm>
#include <limits>
#include <string>

namespace tessera {

LayerCosts layer_costs(const Graph& g, const std::function<double(const Node&)>& cost) {
  LayerCosts c;
  int blocks = 0;
  // The first forward node of a block and the last backward one: the bounds of "before".
  size_t first_forward = g.nodes().size(), last_backward = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.layer < 0) continue;
    blocks = std::max(blocks, n.layer + 1);
    if (!n.backward) first_forward = std::min(first_forward, i);
    if (n.backward) last_backward = i;
  }
  c.block.assign(static_cast<size_t>(blocks), 0.0);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const double x = cost(n);
    if (n.layer >= 0)
      c.block[static_cast<size_t>(n.layer)] += x;
    else if (n.backward ? i > last_backward : i < first_forward)
      c.before += x;
    else
      c.after += x;
  }
  return c;
}

std::vector<double> chunk_costs(const LayerCosts& c, const std::vector<int>& per_chunk) {
  std::vector<double> out;
  size_t at = 0;
  for (size_t k = 0; k < per_chunk.size(); ++k) {
    double x = k == 0 ? c.before : 0.0;
    for (int i = 0; i < per_chunk[k]; ++i) x += c.block.at(at++);
    if (k + 1 == per_chunk.size()) x += c.after;
    out.push_back(x);
  }
  return out;
}

Result<std::vector<int>> balance_stages(const LayerCosts& c, int chunks) {
  const int n = static_cast<int>(c.block.size());
  if (chunks < 1) return error("pipeline chunks must be >= 1, got " + std::to_string(chunks));
  if (chunks > n)
    return error("the pipeline has " + std::to_string(chunks) + " model chunks (stages x virtual " +
                     "stages) but the model has " + std::to_string(n) + " transformer blocks",
                 "every chunk needs at least one block: use at most " + std::to_string(n) +
                     " stages x virtual stages");
  // prefix[i]: cost of blocks [0, i).
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + c.block[static_cast<size_t>(i)];
  auto span = [&](int k, int lo, int hi) {  // chunk k holding blocks [lo, hi)
    return prefix[hi] - prefix[lo] + (k == 0 ? c.before : 0.0) + (k == chunks - 1 ? c.after : 0.0);
  };
  // Two passes of the same dynamic programme over "blocks [0, i) in chunks 0..k". The first
  // finds the smallest largest-chunk cost; the second, among cuts within it, the one with the
  // smallest sum of squared chunk costs (the most even: 2,2,3,3 rather than 1,3,3,3). Ties
  // keep the earlier cut, so later chunks take the extra blocks: under 1F1B the first stages
  // stash the most micro-batches.
  const double inf = std::numeric_limits<double>::infinity();
  const size_t rows = static_cast<size_t>(chunks), cols = static_cast<size_t>(n) + 1;
  std::vector<std::vector<double>> best(rows, std::vector<double>(cols, inf));
  std::vector<std::vector<int>> cut(rows, std::vector<int>(cols, 0));
  auto solve = [&](double limit) {
    // limit = inf: best = the largest chunk's cost; else best = sum of squares, chunks <= limit.
    const bool squares = limit < inf;
    auto score = [&](double x) { return squares ? (x <= limit ? x * x : inf) : x; };
    auto join = [&](double prev, double x) { return squares ? prev + x : std::max(prev, x); };
    for (auto& r : best) std::fill(r.begin(), r.end(), inf);
    for (int i = 1; i <= n; ++i) best[0][static_cast<size_t>(i)] = score(span(0, 0, i));
    for (int k = 1; k < chunks; ++k)
      for (int i = k + 1; i <= n; ++i)
        for (int j = k; j < i; ++j) {  // chunk k holds blocks [j, i)
          const double v = join(best[k - 1][static_cast<size_t>(j)], score(span(k, j, i)));
          if (v < best[k][static_cast<size_t>(i)]) {
            best[k][static_cast<size_t>(i)] = v;
            cut[k][static_cast<size_t>(i)] = j;
          }
        }
  };
  solve(inf);
  const double worst = best[rows - 1][static_cast<size_t>(n)];
  solve(worst * (1 + 1e-12));
  std::vector<int> per_chunk(static_cast<size_t>(chunks));
  int hi = n;
  for (int k = chunks - 1; k >= 0; --k) {
    const int lo = k == 0 ? 0 : cut[static_cast<size_t>(k)][static_cast<size_t>(hi)];
    per_chunk[static_cast<size_t>(k)] = hi - lo;
    hi = lo;
  }
  return per_chunk;
}

Result<std::vector<int>> parse_stage_layers(std::string_view text, int blocks, int chunks) {
  std::vector<int> out;
  const std::string hint = "give " + std::to_string(chunks) +
                           " positive block counts separated by commas, summing to " +
                           std::to_string(blocks);
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item(text.substr(at, comma - at));
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 1)
      return error("--stage-layers '" + std::string(text) + "': '" + item +
                       "' is not a positive number of blocks",
                   hint);
    out.push_back(v);
    at = comma + 1;
  }
  int sum = 0;
  for (int v : out) sum += v;
  if (static_cast<int>(out.size()) != chunks || sum != blocks)
    return error("--stage-layers '" + std::string(text) + "' gives " + std::to_string(out.size()) +
                     " chunks of " + std::to_string(sum) + " blocks in all; the pipeline has " +
                     std::to_string(chunks) + " chunks (stages x virtual stages) and the model " +
                     std::to_string(blocks) + " blocks",
                 hint);
  return out;
}

}  // namespace tessera
