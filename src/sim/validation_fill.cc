// A published row's unpublished knobs, chosen as the planner chooses them (sim/validation.h).
#include <algorithm>
#include <cstdio>
#include <optional>

#include "parallel/pipeline_schedule.h"
#include "parallel/sharding_search.h"
#include "sim/framework_terms.h"
#include "sim/validation.h"

namespace tessera {

namespace {

// The row's training graph at its micro-batch, with a tensor axis placed by the sharding search
// at this cluster's FLOP/byte ratio (into s->plan).
Result<ModelGraph> placed_graph(RunSetup* s) {
  ModelGraph m = build_model(s->model, s->batch, s->seq, ModelMode::train);
  if (s->plan.tensor_group() > 1) {
    const SearchCost cost =
        cluster_search_cost(s->cluster, s->sim.precision, s->plan, num_blocks(s->model));
    TS_RETURN_IF_ERROR(
        place_tensor_parallel(s->model, s->batch, s->seq, m.graph, cost, &s->plan).status());
  }
  return m;
}

bool unpublished(const RunSetup& s, const char* knob) {
  return std::find(s.unpublished.begin(), s.unpublished.end(), knob) != s.unpublished.end();
}

std::string describe_choice(const RunSetup& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "micro-batch %lld x %d, ZeRO-%d, recompute %s%s",
                static_cast<long long>(s.batch / s.plan.data_group()), s.plan.micro_batches,
                s.plan.zero, recompute_name(s.plan.recompute),
                unpublished(s, "sequence_parallel")
                    ? (s.plan.sequence_parallel ? ", sequence parallel" : ", no sequence parallel")
                    : "");
  std::string out = buf;
  if (unpublished(s, "virtual_stages"))
    out += s.plan.virtual_stages > 1
               ? ", interleaved " + std::to_string(s.plan.virtual_stages) + " chunks per stage"
               : ", 1F1B";
  return out;
}

}  // namespace

Result<SimResult> simulate_setup(RunSetup* s) {
  TS_ASSIGN_OR_RETURN(ModelGraph m, placed_graph(s));
  return simulate_plan(m.graph, s->plan, s->cluster, s->sim);
}

Result<SimResult> fill_unpublished(RunSetup* s) {
  const int dp = s->plan.data_group();
  const int64_t rows = s->batch / dp * s->plan.micro_batches;  // sequences per data rank a step
  std::vector<int64_t> micros{s->batch / dp};
  if (unpublished(*s, "micro_batch")) {
    micros.clear();
    for (int64_t mb = 1; mb <= std::min<int64_t>(rows, 16); ++mb)
      if (rows % mb == 0) micros.push_back(mb);
  }
  std::vector<int> zeros{s->plan.zero};
  if (unpublished(*s, "zero"))
    zeros = s->plan.stages() > 1 ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 2, 3};
  std::vector<bool> sequence_parallel{s->plan.sequence_parallel};
  if (unpublished(*s, "sequence_parallel")) sequence_parallel = {false, true};
  std::vector<RecomputePolicy> recomputes{s->plan.recompute};
  if (unpublished(*s, "recompute"))
    recomputes = {RecomputePolicy::none, RecomputePolicy::selective, RecomputePolicy::full};
  // Interleaving (the framework's cut of each chunk count, as setup_run cuts the published one).
  std::vector<int> virtuals{s->plan.virtual_stages};
  if (unpublished(*s, "virtual_stages")) {
    virtuals = {1};
    for (int v : interleavings(s->model.n_layer, s->plan.stages())) virtuals.push_back(v);
  }

  struct Best {
    RunSetup setup;
    SimResult sim;
  };
  std::optional<Best> fastest, smallest;  // fitting; and by memory, when none fits
  Status last = error("no candidate plan");
  const double capacity = s->cluster.device.memory_bytes;
  for (int64_t mb : micros)
    for (bool sp : sequence_parallel)
      for (int zero : zeros) {
        RunSetup c = *s;
        c.batch = mb * dp;
        c.plan.micro_batches = static_cast<int>(rows / mb);
        c.plan.sequence_parallel = sp;
        c.plan.zero = zero;
        // One graph and placement per micro-batch, sequence split and ZeRO stage (the sharding
        // search keeps the parameters' state, which ZeRO divides, within the device's memory);
        // recomputation is a lowering choice.
        Result<ModelGraph> m = placed_graph(&c);
        if (!m.ok()) {  // this one does not place: the others may
          last = m.status();
          continue;
        }
        for (RecomputePolicy rc : recomputes)
          for (int v : virtuals) {
            RunSetup k = c;
            k.plan.recompute = rc;
            if (unpublished(*s, "virtual_stages")) {
              k.plan.schedule = v > 1 ? ScheduleKind::interleaved : ScheduleKind::one_f_one_b;
              k.plan.virtual_stages = v;
              k.plan.stage_layers = framework_pipeline_cut(
                  s->framework, static_cast<int>(s->model.n_layer), k.plan.chunks());
            }
            if (!validate(k.plan).ok()) continue;
            Result<SimResult> r = simulate_plan(m->graph, k.plan, k.cluster, k.sim);
            if (!r.ok()) {
              last = r.status();
              continue;
            }
            if (r->peak_memory_bytes <= capacity &&
                (!fastest || r->step_seconds < fastest->sim.step_seconds))
              fastest = Best{k, *r};
            if (!smallest || r->peak_memory_bytes < smallest->sim.peak_memory_bytes)
              smallest = Best{k, *r};
          }
      }
  if (!fastest && !smallest) return last;
  Best& chosen = fastest ? *fastest : *smallest;
  std::vector<std::string> knobs = s->unpublished;
  *s = std::move(chosen.setup);
  std::string what;
  for (const std::string& k : knobs) what += (what.empty() ? "" : ", ") + k;
  s->filled.push_back(what + " not published: " + describe_choice(*s) +
                      (fastest ? " (the fastest plan that fits, as the planner chooses)"
                               : " (nothing fits: the plan needing the least memory)"));
  return chosen.sim;
}

}  // namespace tessera
