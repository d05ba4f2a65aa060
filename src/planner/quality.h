// The planner against the published configurations: for each published run the simulator
// models (sim/validation.h), the planner searches the same model, cluster, device count,
// global batch, sequence length and precision, and its best plan's predicted throughput is
// compared with the published configuration's (both from the same simulator, so the ratio
// says how good the search is, not how accurate the simulator is).
//
//   ValidationReport rep = validate_runs(runs, threads);
//   PlannerQuality q = planner_quality(rep, threads);
//   std::fputs(format_planner_quality(q, /*per_row=*/true).c_str(), stdout);
//
// ratio = auto plan's tokens/s / published plan's tokens/s: >= 1 when the search finds the
// published plan or a faster one. It can be below 1 where the published plan is outside the
// search space (HSDP, ZeRO-2, ZeRO-3 with tp, tp across nodes, a micro-batch above the
// search's cap) or does not fit in the simulator's memory model (the planner only returns
// plans that fit).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "planner/planner.h"
#include "sim/validation.h"

namespace tessera {

struct PlannerRow {
  std::string row_id, source, model;
  int gpus = 0;
  std::string published_plan, auto_plan;  // PlanCandidate::describe()
  double published_tokens_per_s = 0, auto_tokens_per_s = 0;
  bool published_fits = true;  // the published plan within the device by the simulator
  double ratio = 0;            // auto / published tokens/s (0 when the search failed)
  double search_seconds = 0;
  std::string error;  // the search's error, when it found no plan
};

struct PlannerQuality {
  std::vector<PlannerRow> rows;
  int searched = 0, failed = 0;
  int at_least_published = 0;  // ratio >= 1 - 1e-9
  int materially_better = 0;   // ratio >= 1.05
  double min_ratio = 0, median_ratio = 0, max_ratio = 0;
  double seconds = 0;
};

// One search per simulated row of `rep`, each on `threads` threads; `on_row` (when given) sees
// each row as its search ends (a long run's progress).
PlannerQuality planner_quality(const ValidationReport& rep, int threads,
                               const std::function<void(const PlannerRow&)>& on_row = nullptr);

// Whether a row is worth showing: no plan, or a ratio below 1 or at least 1.05.
bool planner_row_differs(const PlannerRow& r);
// The table header, one row's line, and the whole report (rows that differ, or every row).
std::string planner_quality_header();
std::string format_planner_row(const PlannerRow& r);
std::string format_planner_quality(const PlannerQuality& q, bool per_row);

}  // namespace tessera
