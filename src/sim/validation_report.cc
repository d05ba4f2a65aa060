// tessera validate's run over the published rows and its report (sim/validation.h): each row
// set up and simulated on a thread of its own, its error against the published figure, and the
// error tables by source and by kind of plan. Setting a row up is validation.cc's.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <thread>

#include "cost/flops.h"
#include "sim/validation.h"

namespace tessera {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

ValidationReport validate_runs(const std::vector<PublishedRun>& table, int threads,
                               const std::string& only_source, const std::string& cluster_dir) {
  ValidationReport rep;
  const std::vector<PublishedRun> runs = borrow_sibling_heads(table);
  std::vector<const PublishedRun*> todo;
  for (const PublishedRun& r : runs)
    if (only_source.empty() || r.at("source_key") == only_source) todo.push_back(&r);
  std::vector<Result<RunResult>> out(todo.size(), error("not run"));
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next++) < todo.size();) {
      const PublishedRun& r = *todo[i];
      out[i] = [&]() -> Result<RunResult> {
        TS_ASSIGN_OR_RETURN(RunSetup s, setup_run(r, cluster_dir));
        TS_ASSIGN_OR_RETURN(SimResult sim,
                            s.unpublished.empty() ? simulate_setup(&s) : fill_unpublished(&s));
        RunResult rr;
        rr.sim = sim;
        if (s.scale_from_gpus > 0) {
          // The same per-GPU micro-batch and plan on the smallest count (data parallel only).
          if (s.plan.tensor_group() > 1 || s.plan.stages() > 1)
            return error("a scaling range with tensor or pipeline parallelism is not modeled");
          const int64_t per_gpu = s.batch / s.plan.data_group();
          Plan small = Plan::data_parallel(s.scale_from_gpus, s.plan.zero);
          small.recompute = s.plan.recompute;
          small.micro_batches = s.plan.micro_batches;
          small.fuse = s.plan.fuse;
          ModelGraph ms =
              build_model(s.model, per_gpu * s.scale_from_gpus, s.seq, ModelMode::train);
          TS_ASSIGN_OR_RETURN(SimResult base, simulate_plan(ms.graph, small, s.cluster, s.sim));
          rr.predicted = 100 * sim.model_tflops_per_device / base.model_tflops_per_device;
        } else if (s.metric == "tokens/s/GPU") {
          rr.predicted = sim.tokens_per_second / sim.devices;
        } else if (s.metric == "s/iteration") {
          rr.predicted = sim.step_seconds;
        } else {
          TransformerShape t{static_cast<double>(s.batch * s.plan.micro_batches),
                             static_cast<double>(s.seq), static_cast<double>(s.model.n_layer),
                             static_cast<double>(s.model.n_embd),
                             static_cast<double>(s.model.vocab_size)};
          const double flops = s.metric == "TFLOP/s/GPU (model)" ? megatron_model_flops(t)
                                                                 : megatron_flops_with_recompute(t);
          rr.predicted = flops / sim.step_seconds / sim.devices / 1e12;
        }
        rr.error = rr.predicted / s.published - 1;
        // The MFU the published figure implies (the model FLOPs of a step over the published
        // step time at the device's peak): above 100% the row contradicts itself.
        if (s.scale_from_gpus == 0 && rr.predicted > 0) {
          const double ratio =
              s.metric == "s/iteration" ? rr.predicted / s.published : s.published / rr.predicted;
          const double implied = sim.mfu * ratio;
          if (implied > 1.0)
            return error("the published " + s.metric + " implies " +
                         std::to_string(static_cast<int>(std::lround(100 * implied))) +
                         "% MFU (the step's model FLOPs at the device's peak in less time): "
                         "the row is inconsistent");
        }
        rr.setup = std::move(s);
        return rr;
      }();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(1, threads); ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();

  std::map<std::string, std::vector<double>> errors, by_kind;
  for (size_t i = 0; i < todo.size(); ++i) {
    const PublishedRun& r = *todo[i];
    if (!out[i].ok()) {
      rep.excluded.push_back(
          {r.at("row_id"), r.at("source_key"), r.at("model_name"), out[i].status().message()});
      continue;
    }
    RunResult rr = std::move(*out[i]);
    rr.row_id = r.at("row_id"), rr.source = r.at("source_key"), rr.model = r.at("model_name");
    if (rr.setup.filled.empty()) {
      errors[rr.source].push_back(std::fabs(rr.error));
      errors["all"].push_back(std::fabs(rr.error));
      by_kind[plan_kind(rr.setup.plan)].push_back(std::fabs(rr.error));
    } else {
      errors["filled knobs"].push_back(std::fabs(rr.error));
    }
    rep.results.push_back(std::move(rr));
  }
  auto stats = [](const std::string& name, const std::vector<double>& e) {
    return SourceStats{name, static_cast<int>(e.size()), percentile(e, 0.5), percentile(e, 0.9),
                       *std::max_element(e.begin(), e.end())};
  };
  auto add = [&](const std::string& name, const std::vector<double>& e) {
    if (!e.empty()) rep.stats.push_back(stats(name, e));
  };
  for (auto& [source, e] : errors)
    if (source != "all" && source != "filled knobs") add(source, e);
  add("all", errors["all"]);
  add("filled knobs", errors["filled knobs"]);
  for (const char* kind : {"data parallel, ZeRO-0/1/2", "FSDP / ZeRO-3 / HSDP", "tensor parallel",
                           "pipeline", "context or expert parallel"})
    if (!by_kind[kind].empty()) rep.kinds.push_back(stats(kind, by_kind[kind]));
  return rep;
}

const char* plan_kind(const Plan& p) {
  if (p.context_group() > 1 || p.expert_group() > 1) return "context or expert parallel";
  if (p.stages() > 1) return "pipeline";
  if (p.tensor_group() > 1) return "tensor parallel";
  if (p.zero >= 3) return "FSDP / ZeRO-3 / HSDP";
  return "data parallel, ZeRO-0/1/2";
}

std::string format_report(const ValidationReport& rep, bool per_row) {
  std::string s;
  char buf[512];
  if (per_row) {
    std::snprintf(buf, sizeof buf, "%-5s %-24s %-22s %5s %-22s %-18s %10s %10s %7s\n", "row",
                  "source", "model", "gpus", "plan", "metric", "published", "predicted", "error");
    s += buf;
    for (const RunResult& r : rep.results) {
      const Plan& p = r.setup.plan;
      std::string plan =
          (p.tensor_group() > 1 ? "tp=" + std::to_string(p.tensor_group()) + " " : "") +
          (p.stages() > 1 ? "pp=" + std::to_string(p.stages()) +
                                (p.virtual_stages > 1 ? "x" + std::to_string(p.virtual_stages)
                                                      : std::string()) +
                                " "
                          : std::string()) +
          (p.context_group() > 1 ? "cp=" + std::to_string(p.context_group()) + " " : "") +
          (p.expert_group() > 1 ? "ep=" + std::to_string(p.expert_group()) + " " : "") +
          (p.hsdp() ? "hsdp shard=" + std::to_string(p.zero_group())
                    : "zero=" + std::to_string(p.zero)) +
          " mb=" + std::to_string(r.setup.batch / p.data_group()) + "x" +
          std::to_string(p.micro_batches) +
          (p.recompute == RecomputePolicy::full        ? " rc"
           : p.recompute == RecomputePolicy::selective ? " rc-sel"
                                                       : "");
      std::snprintf(
          buf, sizeof buf, "%-5s %-24.24s %-22.22s %5d %-22s %-18s %10.4g %10.4g %+6.1f%%%s\n",
          r.row_id.c_str(), r.source.c_str(), r.model.c_str(), r.sim.devices, plan.c_str(),
          r.setup.metric.c_str(), r.setup.published, r.predicted, 100 * r.error,
          r.sim.peak_memory_bytes > r.setup.cluster.device.memory_bytes ? "  (OOM)" : "");
      s += buf;
      for (const std::string& f : r.setup.filled) s += "      " + f + "\n";
    }
    s += "\n";
  }
  s += "error per source (|predicted / published - 1|; rows with published plans, then the rows "
       "whose unpublished knobs were chosen as the planner would):\n";
  std::snprintf(buf, sizeof buf, "  %-26s %5s %8s %8s %8s\n", "source", "rows", "median", "p90",
                "max");
  s += buf;
  auto table = [&](const std::vector<SourceStats>& rows) {
    for (const SourceStats& st : rows) {
      std::snprintf(buf, sizeof buf, "  %-26s %5d %7.1f%% %7.1f%% %7.1f%%\n", st.source.c_str(),
                    st.rows, 100 * st.median, 100 * st.p90, 100 * st.max);
      s += buf;
    }
  };
  table(rep.stats);
  if (!rep.kinds.empty()) {
    s += "\nby kind of plan (the rows with published plans):\n";
    std::snprintf(buf, sizeof buf, "  %-26s %5s %8s %8s %8s\n", "plan", "rows", "median", "p90",
                  "max");
    s += buf;
    table(rep.kinds);
  }
  return s + "\n" + format_excluded(rep);
}

std::string format_excluded(const ValidationReport& rep) {
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof buf, "rows not modelled (%zu):\n", rep.excluded.size());
  s += buf;
  for (const ExcludedRun& e : rep.excluded) {
    std::snprintf(buf, sizeof buf, "  %-5s %-24.24s %-26.26s %s\n", e.row_id.c_str(),
                  e.source.c_str(), e.model.c_str(), e.reason.c_str());
    s += buf;
  }
  return s;
}

}  // namespace tessera
