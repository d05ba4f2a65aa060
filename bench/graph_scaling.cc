// How graph building and memory planning grow with depth: gpt-tiny at D and 4D layers, the
// training graph built (forward + autodiff) and planned, median of REPS runs each. Prints one
// line per depth and the ratio of the 4D time to the D time: 4.0 is linear, 16.0 quadratic.
//
//   tessera_graph_scaling [--layers D=250] [--batch B=1] [--reps R=3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "models/model.h"
#include "parallel/memory_plan.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Times {
  double build = 0, plan = 0;
  size_t nodes = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Times measure(int64_t layers, int64_t batch, int reps) {
  tessera::ModelConfig cfg = *tessera::find_preset("gpt-tiny");
  cfg.n_layer = layers;
  std::vector<double> build, plan;
  Times t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    tessera::ModelGraph m =
        tessera::build_model(cfg, batch, cfg.max_seq_len, tessera::ModelMode::train);
    auto t1 = Clock::now();
    tessera::MemoryPlan p = tessera::plan_memory(m.graph);
    auto t2 = Clock::now();
    build.push_back(std::chrono::duration<double>(t1 - t0).count());
    plan.push_back(std::chrono::duration<double>(t2 - t1).count());
    t.nodes = m.graph.nodes().size();
    if (p.arena_bytes <= 0) std::abort();
  }
  t.build = median(build);
  t.plan = median(plan);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t layers = 250, batch = 1;
  int reps = 3;
  if (argc % 2 == 0) {
    std::fprintf(stderr, "error: %s needs a value (--layers D, --batch B, --reps R)\n",
                 argv[argc - 1]);
    return 2;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--layers"))
      layers = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch"))
      batch = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps"))
      reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "error: unknown flag %s (takes --layers, --batch, --reps)\n", argv[i]);
      return 2;
    }
  }
  if (layers < 1 || batch < 1 || reps < 1) {
    std::fprintf(stderr, "error: --layers, --batch and --reps must be positive\n");
    return 2;
  }
  const Times a = measure(layers, batch, reps), b = measure(4 * layers, batch, reps);
  for (auto [d, t] : {std::pair{layers, a}, std::pair{4 * layers, b}})
    std::printf("layers=%lld nodes=%zu build_s=%.3f plan_s=%.3f\n", (long long)d, t.nodes, t.build,
                t.plan);
  std::printf("ratio at 4x depth (4.0 = linear, 16.0 = quadratic): build %.1f, plan %.1f\n",
              b.build / a.build, b.plan / a.plan);
  return 0;
}
