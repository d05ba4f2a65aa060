// `tessera plan MODEL --auto --cluster C --gpus N --batch B --seq T [--top K] [--explain]
// [--compare C1,C2,.. --tokens X] [--json]`: the planner (planner/planner.h) searches the
// parallel configurations and prints the fastest that fit, as a table or as JSON.
#include "cli/plan_auto.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/format.h"
#include "io/model_config.h"
#include "planner/explain.h"
#include "planner/planner.h"
#include "train/train_options.h"

namespace tessera {

namespace {

nlohmann::json candidate_json(const PlanCandidate& c) {
  return {{"plan", plan_to_json(c.plan)},
          {"describe", c.describe()},
          {"micro_batch", c.micro_batch},
          // `simulate --plan` and `train --plan` take it as --batch.
          {"global_micro_batch", c.micro_batch * c.plan.data_group()},
          {"step_s", c.sim.step_seconds},
          {"tokens_per_s", c.sim.tokens_per_second},
          {"mfu", c.sim.mfu},
          {"exposed_comm_s", c.sim.exposed_comm_seconds},
          {"bubble_fraction", c.sim.bubble_fraction},
          {"peak_bytes_per_device", c.sim.peak_memory_bytes},
          {"offload_s", c.sim.offload_seconds},
          {"host_bytes_per_device", c.sim.host_bytes},
          {"fits", true}};
}

nlohmann::json explanation_json(const Explanation& e) {
  nlohmann::json knobs = nlohmann::json::array();
  for (const KnobAlternative& a : e.knobs) {
    nlohmann::json k = {{"knob", a.knob}, {"chosen", a.chosen}, {"why", a.why}};
    if (a.alternative) {
      k["alternative"] = a.alternative_value;
      k["alternative_plan"] = a.alternative->describe();
      k["alternative_step_s"] = a.alternative->sim.step_seconds;
      k["slowdown"] = a.slowdown;
    }
    knobs.push_back(k);
  }
  nlohmann::json what_ifs = nlohmann::json::array();
  for (const WhatIf& w : e.what_ifs)
    what_ifs.push_back({{"change", w.change},
                        {"plan", w.best ? nlohmann::json(w.best->describe()) : nullptr},
                        {"step_s", w.best ? nlohmann::json(w.best->sim.step_seconds) : nullptr},
                        {"same_plan", w.same_plan}});
  nlohmann::json j = {{"knobs", knobs}, {"what_ifs", what_ifs}};
  if (e.faster_beyond_memory)
    j["faster_beyond_memory"] = {
        {"plan", e.faster_beyond_memory->describe()},
        {"step_s", e.faster_beyond_memory->sim.step_seconds},
        {"peak_bytes_per_device", e.faster_beyond_memory->sim.peak_memory_bytes}};
  return j;
}

// --compare: the best plan on each cluster, the time to train --tokens and its cost at each
// spec's price per device-hour.
Status run_compare(const PlanAutoOptions& o, const ModelConfig& cfg, const PlannerOptions& po) {
  if (!(o.tokens > 0)) return error("--tokens must be positive, got " + number_text(o.tokens));
  std::vector<std::string> names;
  for (size_t at = 0; at <= o.compare.size();) {
    size_t comma = o.compare.find(',', at);
    if (comma == std::string::npos) comma = o.compare.size();
    if (comma > at) names.push_back(o.compare.substr(at, comma - at));
    at = comma + 1;
  }
  if (names.empty()) return error("--compare needs cluster names, e.g. dgx-a100,dgx-h100");
  std::vector<ClusterSpec> clusters;
  for (const std::string& n : names) {
    TS_ASSIGN_OR_RETURN(ClusterSpec c, load_cluster(n));
    clusters.push_back(std::move(c));
  }
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json)
    std::printf("%s, %d devices, %s tokens to train:\n%-16s %-44s %8s %9s %6s %10s %10s %10s\n",
                cfg.name.c_str(), o.gpus, format_si(o.tokens).c_str(), "cluster", "best plan",
                "step s", "tokens/s", "MFU", "memory", "to train", "$/M tok");
  bool unpriced = false;
  for (const ClusterSpec& c : clusters) {
    Result<PlanSearch> s = search_plans(cfg, c, po);
    nlohmann::json row = {{"cluster", c.name}, {"device", c.device.name}};
    if (!s.ok()) {
      row["error"] = s.status().message();
      rows.push_back(row);
      if (!o.json) std::printf("%-16s no plan: %s\n", c.name.c_str(), s.status().message().c_str());
      continue;
    }
    const PlanCandidate& b = s->best[0];
    const double seconds = o.tokens / b.sim.tokens_per_second;
    const double per_million = c.price_per_device_hour * o.gpus / 3600.0 / b.sim.tokens_per_second *
                               1e6;  // $ per million tokens
    row["best"] = candidate_json(b);
    row["days"] = seconds / 86400.0;
    row["price_per_device_hour"] = c.price_per_device_hour;
    row["usd_per_million_tokens"] =
        c.price_per_device_hour > 0 ? nlohmann::json(per_million) : nullptr;
    row["usd_total"] =
        c.price_per_device_hour > 0 ? nlohmann::json(per_million * o.tokens / 1e6) : nullptr;
    rows.push_back(row);
    unpriced = unpriced || c.price_per_device_hour <= 0;
    if (!o.json)
      std::printf("%-16s %-44s %8.3f %9s %5.1f%% %10s %10s %10s\n", c.name.c_str(),
                  b.describe().c_str(), b.sim.step_seconds,
                  format_si(b.sim.tokens_per_second).c_str(), 100 * b.sim.mfu,
                  format_bytes(b.sim.peak_memory_bytes).c_str(), format_duration(seconds).c_str(),
                  c.price_per_device_hour > 0 ? format_fixed(per_million, 3).c_str() : "-");
  }
  if (o.json) {
    std::printf(
        "%s\n",
        nlohmann::json(
            {{"model", cfg.name}, {"devices", o.gpus}, {"tokens", o.tokens}, {"clusters", rows}})
            .dump(2)
            .c_str());
  } else if (unpriced) {
    std::printf(
        "-: the spec has no price_per_device_hour (give one in a copy of its .toml to compare "
        "cost)\n");
  }
  return Status();
}

}  // namespace

Status run_plan_auto(const PlanAutoOptions& o) {
  TS_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(o.model));
  if (o.seq < 0)
    return error("--seq must be positive (or 0: max_seq_len), got " + std::to_string(o.seq));
  if (o.gpus < 1 || o.gpus > (1 << 20))
    return error("--gpus must be between 1 and 1048576, got " + std::to_string(o.gpus));
  SimOptions precision;
  TS_RETURN_IF_ERROR(parse_sim_precision(o.precision, &precision));
  PlannerOptions po;
  po.gpus = o.gpus;
  po.global_batch = o.batch;
  po.seq = o.seq;
  po.precision = precision.precision;
  po.fp8 = precision.fp8;
  po.top_k = o.top;
  po.threads = o.threads;
  if (!o.compare.empty()) {
    if (o.explain) return error("--explain and --compare are separate searches; pick one");
    po.top_k = 1;
    return run_compare(o, cfg, po);
  }
  TS_ASSIGN_OR_RETURN(ClusterSpec cluster, load_cluster(o.cluster));
  TS_ASSIGN_OR_RETURN(std::unique_ptr<PlanSpace> space, PlanSpace::create(cfg, cluster, po));
  TS_ASSIGN_OR_RETURN(PlanSearch s, search_plans(*space));
  std::optional<Explanation> why;
  if (o.explain) {
    TS_ASSIGN_OR_RETURN(Explanation e, explain_best(*space));
    why = std::move(e);
  }
  const int64_t batch = space->options().global_batch;
  const int64_t seq = space->options().seq;
  if (o.json) {
    nlohmann::json cands = nlohmann::json::array();
    for (const PlanCandidate& c : s.best) cands.push_back(candidate_json(c));
    nlohmann::json j = {{"model", cfg.name},
                        {"cluster", cluster.name},
                        {"devices", o.gpus},
                        {"batch", batch},
                        {"seq", seq},
                        {"precision", sim_precision_name(precision)},
                        {"enumerated", s.enumerated},
                        {"pruned_by_memory", s.pruned_by_memory},
                        {"simulated", s.simulated},
                        {"search_s", s.seconds},
                        {"bound_s", space->create_seconds()},
                        {"candidates", cands}};
    if (why) j["explain"] = explanation_json(*why);
    std::printf("%s\n", j.dump(2).c_str());
    return Status();
  }
  std::printf(
      "searched %d plans of %s for %d x %s, %lld sequences x %lld tokens per step in %s: %d "
      "beyond memory by a bound, %d simulated, in %.1f s (%.1f s bounding, %.1f s "
      "simulating)\n",
      s.enumerated, cfg.name.c_str(), o.gpus, cluster.device.name.c_str(), (long long)batch,
      (long long)seq, sim_precision_name(precision), s.pruned_by_memory, s.simulated, s.seconds,
      space->create_seconds(), s.seconds - space->create_seconds());
  std::printf("%-3s %-46s %9s %10s %6s %10s %9s %7s\n", "#", "plan", "step s", "tokens/s", "MFU",
              "memory", "comm s", "bubble");
  for (size_t i = 0; i < s.best.size(); ++i) {
    const PlanCandidate& c = s.best[i];
    std::printf("%-3zu %-46s %9.3f %10s %5.1f%% %10s %9.3f %6.1f%%\n", i + 1, c.describe().c_str(),
                c.sim.step_seconds, format_si(c.sim.tokens_per_second).c_str(), 100 * c.sim.mfu,
                format_bytes(c.sim.peak_memory_bytes).c_str(), c.sim.exposed_comm_seconds,
                100 * c.sim.bubble_fraction);
  }
  if (why) std::printf("%s", format_explanation(*why, cluster.device.memory_bytes).c_str());
  std::printf(
      "best plan (`tessera simulate --plan FILE --batch %lld` and `tessera train --plan FILE "
      "--batch %lld` take it):\n%s\n",
      (long long)(s.best[0].micro_batch * s.best[0].plan.data_group()),
      (long long)(s.best[0].micro_batch * s.best[0].plan.data_group()),
      plan_to_json(s.best[0].plan).dump(2).c_str());
  return Status();
}

}  // namespace tessera
