// `tessera plan MODEL --auto --cluster C --gpus N --batch B --seq T [--top K] [--json]`: the
// planner (planner/planner.h) searches the parallel configurations and prints the fastest that
// fit, as a table or as JSON.
#include "cli/plan_auto.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/format.h"
#include "io/model_config.h"
#include "planner/planner.h"

namespace tessera {

Status run_plan_auto(const PlanAutoOptions& o) {
  TS_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(o.model));
  TS_ASSIGN_OR_RETURN(ClusterSpec cluster, load_cluster(o.cluster));
  if (o.seq < 0)
    return error("--seq must be positive (or 0: max_seq_len), got " + std::to_string(o.seq));
  if (o.gpus < 1 || o.gpus > (1 << 20))
    return error("--gpus must be between 1 and 1048576, got " + std::to_string(o.gpus));
  std::optional<DType> prec = parse_dtype(o.precision);
  if (!prec || *prec == DType::i32)
    return error("--precision '" + o.precision + "' is not one of f32, bf16, f16");
  PlannerOptions po;
  po.gpus = o.gpus;
  po.global_batch = o.batch;
  po.seq = o.seq;
  po.precision = *prec;
  po.top_k = o.top;
  po.threads = o.threads;
  TS_ASSIGN_OR_RETURN(PlanSearch s, search_plans(cfg, cluster, po));
  const int64_t batch = o.batch > 0 ? o.batch : o.gpus;
  const int64_t seq = o.seq > 0 ? o.seq : cfg.max_seq_len;
  if (o.json) {
    nlohmann::json cands = nlohmann::json::array();
    for (const PlanCandidate& c : s.best)
      cands.push_back({{"plan", plan_to_json(c.plan)},
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
                       {"fits", true}});
    nlohmann::json j = {{"model", cfg.name},
                        {"cluster", cluster.name},
                        {"devices", o.gpus},
                        {"batch", batch},
                        {"seq", seq},
                        {"enumerated", s.enumerated},
                        {"pruned_by_memory", s.pruned_by_memory},
                        {"simulated", s.simulated},
                        {"search_s", s.seconds},
                        {"candidates", cands}};
    std::printf("%s\n", j.dump(2).c_str());
    return Status();
  }
  std::printf(
      "searched %d plans of %s for %d x %s, %lld sequences x %lld tokens per step: %d beyond "
      "memory by the bound, %d simulated, in %.1f s\n",
      s.enumerated, cfg.name.c_str(), o.gpus, cluster.device.name.c_str(), (long long)batch,
      (long long)seq, s.pruned_by_memory, s.simulated, s.seconds);
  std::printf("%-3s %-46s %9s %10s %6s %10s %9s %7s\n", "#", "plan", "step s", "tokens/s", "MFU",
              "memory", "comm s", "bubble");
  for (size_t i = 0; i < s.best.size(); ++i) {
    const PlanCandidate& c = s.best[i];
    std::printf("%-3zu %-46s %9.3f %10s %5.1f%% %10s %9.3f %6.1f%%\n", i + 1, c.describe().c_str(),
                c.sim.step_seconds, format_si(c.sim.tokens_per_second).c_str(), 100 * c.sim.mfu,
                format_bytes(c.sim.peak_memory_bytes).c_str(), c.sim.exposed_comm_seconds,
                100 * c.sim.bubble_fraction);
  }
  std::printf(
      "best plan (`tessera simulate --plan FILE --batch %lld` and `tessera train --plan FILE "
      "--batch %lld` take it):\n%s\n",
      (long long)(s.best[0].micro_batch * s.best[0].plan.data_group()),
      (long long)(s.best[0].micro_batch * s.best[0].plan.data_group()),
      plan_to_json(s.best[0].plan).dump(2).c_str());
  return Status();
}

}  // namespace tessera
