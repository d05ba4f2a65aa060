// Autoregressive text sampling with temperature and top-k from a model graph built in
// ModelMode::logits with batch 1. The window slides when the context is full.
//
//   ModelGraph m = build_model(cfg, 1, cfg.max_seq_len, ModelMode::logits);
//   Executor ex(m.graph, cpu);  ...load parameters...
//   TS_ASSIGN_OR_RETURN(std::vector<int32_t> out, sample_tokens(ex, m, prompt, 100, {0.8, 40},
//   rng));
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "models/model.h"
#include "runtime/executor.h"

namespace tessera {

struct SampleOptions {
  double temperature = 0.8;  // <= 0: greedy
  int top_k = 40;            // <= 0: the whole vocabulary
};

// Returns only the new tokens. The prompt must not be empty. Logits that are not finite (the
// weights hold a NaN or an infinity) are an error naming the position, not tokens drawn from
// them.
Result<std::vector<int32_t>> sample_tokens(Executor& ex, const ModelGraph& m,
                                           std::vector<int32_t> prompt, int count,
                                           const SampleOptions& opt, std::mt19937_64& rng);

}  // namespace tessera
