#include "planner/quality.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "base/format.h"

namespace tessera {

namespace {

PlannerRow search_row(const RunResult& r, int threads) {
  const RunSetup& s = r.setup;
  PlannerRow row;
  row.row_id = r.row_id;
  row.source = r.source;
  row.model = r.model;
  row.gpus = s.plan.mesh.size();
  PlanCandidate published;
  published.plan = s.plan;
  published.micro_batch = s.batch / std::max(1, s.plan.data_group());
  row.published_plan = published.describe();
  row.published_tokens_per_s = r.sim.tokens_per_second;
  row.published_fits = r.sim.peak_memory_bytes <= s.cluster.device.memory_bytes;

  PlannerOptions o;
  o.gpus = row.gpus;
  o.global_batch = s.batch * s.plan.micro_batches;  // sequences per optimizer step
  o.seq = s.seq;
  o.precision = s.sim.precision;
  o.fp8 = s.sim.fp8;
  o.top_k = 1;
  o.threads = threads;
  o.max_micro_batch = std::max<int64_t>(o.max_micro_batch, published.micro_batch);
  const auto t0 = std::chrono::steady_clock::now();
  Result<PlanSearch> found = search_plans(s.model, s.cluster, o);
  row.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!found.ok()) {
    row.error = found.status().message();
    return row;
  }
  const PlanCandidate& best = found->best.front();
  row.auto_plan = best.describe();
  row.auto_tokens_per_s = best.sim.tokens_per_second;
  if (row.published_tokens_per_s > 0)
    row.ratio = row.auto_tokens_per_s / row.published_tokens_per_s;
  return row;
}

}  // namespace

PlannerQuality planner_quality(const ValidationReport& rep, int threads,
                               const std::function<void(const PlannerRow&)>& on_row) {
  const auto t0 = std::chrono::steady_clock::now();
  PlannerQuality q;
  std::vector<double> ratios;
  for (const RunResult& r : rep.results) {
    q.rows.push_back(search_row(r, threads));
    const PlannerRow& row = q.rows.back();
    if (on_row) on_row(row);
    if (!row.error.empty() || row.ratio <= 0) {
      ++q.failed;
      continue;
    }
    ++q.searched;
    ratios.push_back(row.ratio);
    if (row.ratio >= 1 - 1e-9) ++q.at_least_published;
    if (row.ratio >= 1.05) ++q.materially_better;
  }
  if (!ratios.empty()) {
    std::sort(ratios.begin(), ratios.end());
    q.min_ratio = ratios.front();
    q.max_ratio = ratios.back();
    q.median_ratio = ratios[ratios.size() / 2];
  }
  q.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return q;
}

bool planner_row_differs(const PlannerRow& r) {
  return !r.error.empty() || r.ratio < 1 - 1e-9 || r.ratio >= 1.05;
}

std::string planner_quality_header() {
  char line[256];
  std::snprintf(line, sizeof line, "%-5s %-22s %-22s %6s  %-40s %-40s %7s\n", "row", "source",
                "model", "gpus", "published plan", "auto plan", "ratio");
  return line;
}

std::string format_planner_row(const PlannerRow& r) {
  char line[1024];
  const std::string model = r.model.substr(0, 22);
  if (!r.error.empty()) {
    std::snprintf(line, sizeof line, "%-5s %-22s %-22s %6d  no plan: %s\n", r.row_id.c_str(),
                  r.source.c_str(), model.c_str(), r.gpus, r.error.c_str());
  } else {
    std::snprintf(line, sizeof line, "%-5s %-22s %-22s %6d  %-40s %-40s %7.3f%s\n",
                  r.row_id.c_str(), r.source.c_str(), model.c_str(), r.gpus,
                  r.published_plan.c_str(), r.auto_plan.c_str(), r.ratio,
                  r.published_fits ? "" : "  (published plan beyond memory here)");
  }
  return line;
}

std::string format_planner_quality(const PlannerQuality& q, bool per_row) {
  std::string out;
  if (per_row) out += planner_quality_header();
  for (const PlannerRow& r : q.rows) {
    if (!per_row && !planner_row_differs(r)) continue;
    out += format_planner_row(r);
  }
  char line[512];
  if (q.searched == q.failed) {  // no ratio to summarise: no statistics of nothing
    std::snprintf(line, sizeof line,
                  "%sauto plan / published plan, predicted tokens/s, over %d rows: -; %d without "
                  "a plan; %.1f s\n",
                  out.empty() ? "" : "\n", q.searched, q.failed, q.seconds);
    return out + line;
  }
  std::snprintf(line, sizeof line,
                "%sauto plan / published plan, predicted tokens/s, over %d rows: min %.3f, "
                "median %.3f, max %.3f; %d at least the published plan's, %d >= 5%% faster; "
                "%d without a plan; %.1f s\n",
                out.empty() ? "" : "\n", q.searched, q.min_ratio, q.median_ratio, q.max_ratio,
                q.at_least_published, q.materially_better, q.failed, q.seconds);
  out += line;
  return out;
}

}  // namespace tessera
