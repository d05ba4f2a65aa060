#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"

namespace tessera {

Result<std::vector<int32_t>> sample_tokens(Executor& ex, const ModelGraph& m,
                                           std::vector<int32_t> prompt, int count,
                                           const SampleOptions& opt, std::mt19937_64& rng) {
  TS_CHECK(!prompt.empty());
  TS_CHECK_EQ(m.batch, 1);
  const int64_t T = m.seq;
  const int64_t stride = ex.graph().type(m.logits).shape[-1];  // padding columns included
  const int64_t V = m.classes > 0 ? m.classes : stride;
  std::vector<int32_t> context = std::move(prompt), out, window(static_cast<size_t>(T), 0);
  std::vector<std::pair<float, int32_t>> ranked(static_cast<size_t>(V));
  std::vector<float> row(static_cast<size_t>(stride));
  for (int i = 0; i < count; ++i) {
    int64_t len = std::min<int64_t>(static_cast<int64_t>(context.size()), T);
    std::fill(window.begin(), window.end(), 0);
    std::copy(context.end() - len, context.end(), window.begin());
    ex.set_input("tokens", window.data());
    ex.run();
    // The last position's row of logits, copied out of the backend's memory.
    ex.backend().to_host(row.data(),
                         static_cast<const float*>(ex.raw(m.logits)) + (len - 1) * stride,
                         stride * static_cast<int64_t>(sizeof(float)));
    const float* logits = row.data();
    for (int64_t v = 0; v < V; ++v)
      if (!std::isfinite(logits[v]))
        return error("the model's logits for new token " + std::to_string(i + 1) +
                         " are not finite (NaN or infinity): the weights are damaged",
                     "check the checkpoint's tensors (an import of NaN weights, or a run that "
                     "diverged); sample from an earlier checkpoint");
    int32_t next = 0;
    if (opt.temperature <= 0) {
      next = static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
    } else {
      for (int64_t v = 0; v < V; ++v)
        ranked[static_cast<size_t>(v)] = {logits[v], static_cast<int32_t>(v)};
      int64_t k = opt.top_k > 0 ? std::min<int64_t>(opt.top_k, V) : V;
      std::partial_sort(ranked.begin(), ranked.begin() + k, ranked.end(),
                        [](auto& a, auto& b) { return a.first > b.first; });
      std::vector<double> w(static_cast<size_t>(k));
      for (int64_t j = 0; j < k; ++j)
        w[static_cast<size_t>(j)] =
            std::exp((ranked[static_cast<size_t>(j)].first - ranked[0].first) / opt.temperature);
      std::discrete_distribution<int64_t> dist(w.begin(), w.end());
      next = ranked[static_cast<size_t>(dist(rng))].second;
    }
    context.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace tessera
