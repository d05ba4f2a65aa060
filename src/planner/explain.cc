#include "planner/explain.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "base/format.h"
#include "parallel/pipeline_schedule.h"

namespace tessera {

namespace {

struct Knob {
  const char* name;
  std::function<std::string(const PlanCandidate&)> value;  // "" where the knob does not apply
  bool same_mesh = false;  // alternatives keep the best plan's tp and pp
  bool moe_only = false;   // a knob of mixtures of experts only
};

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> k = {
      {"tensor parallel",
       [](const PlanCandidate& c) { return "tp " + std::to_string(c.plan.tensor_group()); }},
      {"sequence parallel",
       [](const PlanCandidate& c) -> std::string {
         if (c.plan.tensor_group() == 1) return "";
         return c.plan.sequence_parallel ? "on" : "off";
       }},
      {"pipeline stages",
       [](const PlanCandidate& c) {
         return c.plan.stages() == 1 ? std::string("none")
                                     : "pp " + std::to_string(c.plan.stages());
       }},
      {"schedule",
       [](const PlanCandidate& c) -> std::string {
         if (c.plan.stages() == 1) return "";
         std::string s = schedule_name(c.plan.schedule);
         if (c.plan.virtual_stages > 1) s += " v=" + std::to_string(c.plan.virtual_stages);
         return s;
       }},
      {"context parallel",
       [](const PlanCandidate& c) {
         return c.plan.context_group() == 1 ? std::string("none")
                                            : "cp " + std::to_string(c.plan.context_group());
       }},
      {"context attention",  // how a context-parallel attention meets the other chunks
       [](const PlanCandidate& c) -> std::string {
         if (c.plan.context_group() == 1) return "";
         return context_attention_name(c.plan.context_attention);
       }},
      {"expert parallel",  // whether a mixture of experts splits its experts
       [](const PlanCandidate& c) {
         return c.plan.expert_group() == 1 ? std::string("none")
                                           : "ep " + std::to_string(c.plan.expert_group());
       },
       false, true},
      {"ZeRO stage",
       [](const PlanCandidate& c) {
         // (The expert axis replicates the other parameters too, but is not HSDP's.)
         if (c.plan.hsdp())
           return "HSDP (ZeRO-3 in groups of " + std::to_string(c.plan.zero_group()) + ")";
         return "ZeRO-" + std::to_string(c.plan.zero);
       }},
      {"micro-batch",
       [](const PlanCandidate& c) {
         return std::to_string(c.micro_batch) + " sequences x " +
                std::to_string(c.plan.micro_batches);
       },
       true},
      {"recompute",
       [](const PlanCandidate& c) { return std::string(recompute_name(c.plan.recompute)); }},
      {"offload", [](const PlanCandidate& c) { return std::string(offload_name(c.plan.offload)); }},
  };
  return k;
}

std::string signed_seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%+.3g s", s);
  return b;
}

// "exposed communication +1.2 s, compute -0.3 s; memory 61.0 GiB vs 45.2 GiB": the parts of
// the step that move by more than 1% of the best step, largest first.
std::string what_moves(const SimResult& best, const SimResult& alt) {
  struct Part {
    const char* name;
    double delta;
  };
  std::vector<Part> parts = {
      {"compute", (alt.compute_seconds - alt.optimizer_seconds) -
                      (best.compute_seconds - best.optimizer_seconds)},
      {"optimizer", alt.optimizer_seconds - best.optimizer_seconds},
      {"exposed communication", alt.exposed_comm_seconds - best.exposed_comm_seconds},
      {"offloaded optimizer", alt.offload_seconds - best.offload_seconds},
      {"pipeline bubble", alt.bubble_seconds - best.bubble_seconds},
  };
  std::sort(parts.begin(), parts.end(),
            [](const Part& a, const Part& b) { return std::abs(a.delta) > std::abs(b.delta); });
  std::string out;
  for (const Part& p : parts) {
    if (std::abs(p.delta) < 0.01 * best.step_seconds) continue;
    out += (out.empty() ? "" : ", ") + std::string(p.name) + " " + signed_seconds(p.delta);
  }
  if (out.empty()) out = "every part of the step moves by under 1% of it";
  return out + "; memory " + format_bytes(alt.peak_memory_bytes) + " vs " +
         format_bytes(best.peak_memory_bytes);
}

ClusterSpec scaled_bandwidth(ClusterSpec c, double f, bool between_nodes) {
  if (between_nodes)
    c.network.nic_bandwidth *= f;
  else
    c.node.intra_bandwidth *= f;
  return c;
}

ClusterSpec scaled_memory(ClusterSpec c, double f) {
  c.device.memory_bytes *= f;
  return c;
}

}  // namespace

Result<Explanation> explain_best(PlanSpace& space, bool what_ifs) {
  const std::vector<const PlanCandidate*> top = space.fastest(1);
  if (top.empty()) return error("no plan of " + space.model().name + " fits: nothing to explain");
  Explanation e;
  e.best = *top[0];
  const double capacity = space.cluster().device.memory_bytes;
  for (const Knob& k : knobs()) {
    if (k.moe_only && !space.model().is_moe()) continue;
    const std::string chosen = k.value(e.best);
    if (chosen.empty()) continue;
    KnobAlternative a;
    a.knob = k.name;
    a.chosen = chosen;
    auto differs = [&](const PlanCandidate& c) {
      const std::string v = k.value(c);
      if (k.same_mesh && (c.plan.tensor_group() != e.best.plan.tensor_group() ||
                          c.plan.stages() != e.best.plan.stages()))
        return false;
      return !v.empty() && v != chosen;
    };
    const std::vector<const PlanCandidate*> alt = space.fastest(1, differs);
    if (!alt.empty()) {
      a.alternative = *alt[0];
      a.alternative_value = k.value(*alt[0]);
      a.slowdown = alt[0]->sim.step_seconds / e.best.sim.step_seconds - 1;
      a.why = what_moves(e.best.sim, alt[0]->sim);
    } else {
      const auto& all = space.candidates();
      const bool any = std::any_of(all.begin(), all.end(), differs);
      a.why = any ? "every other value is beyond the device's memory"
                  : "the only value this model, batch and cluster allow within memory";
    }
    e.knobs.push_back(std::move(a));
  }
  for (const PlanCandidate& c : space.candidates())
    if (c.simulated && !c.fits(capacity) && c.sim.step_seconds < e.best.sim.step_seconds &&
        (!e.faster_beyond_memory || c.sim.step_seconds < e.faster_beyond_memory->sim.step_seconds))
      e.faster_beyond_memory = c;

  if (!what_ifs) return e;
  const ClusterSpec& base = space.cluster();
  const bool multi_node = base.nodes_for(space.options().gpus) > 1;
  const std::string link = multi_node ? "inter-node" : "intra-node";
  const std::vector<std::pair<std::string, ClusterSpec>> changes = {
      {"half the " + link + " bandwidth", scaled_bandwidth(base, 0.5, multi_node)},
      {"twice the " + link + " bandwidth", scaled_bandwidth(base, 2.0, multi_node)},
      {"half the device memory", scaled_memory(base, 0.5)},
      {"twice the device memory", scaled_memory(base, 2.0)},
  };
  PlannerOptions o = space.options();
  o.top_k = 1;
  for (const auto& [change, cluster] : changes) {
    WhatIf w;
    w.change = change;
    TS_ASSIGN_OR_RETURN(std::unique_ptr<PlanSpace> s, PlanSpace::create(space.model(), cluster, o));
    const std::vector<const PlanCandidate*> b = s->fastest(1);
    if (!b.empty()) {
      w.best = *b[0];
      w.same_plan = b[0]->describe() == e.best.describe();
    }
    e.what_ifs.push_back(std::move(w));
  }
  return e;
}

std::string format_explanation(const Explanation& e, double device_bytes) {
  std::string out = "why " + e.best.describe() + " wins (" +
                    format_fixed(e.best.sim.step_seconds, 3) + " s per step, " +
                    format_bytes(e.best.sim.peak_memory_bytes) + " of " +
                    format_bytes(device_bytes) + "):\n";
  for (const KnobAlternative& a : e.knobs) {
    out += "  " + a.knob + ": " + a.chosen;
    if (a.alternative)
      out += "; instead " + a.alternative_value + " (" + a.alternative->describe() + ") is " +
             format_fixed(100 * a.slowdown, 1) + "% slower: " + a.why + "\n";
    else
      out += "; " + a.why + "\n";
  }
  if (e.faster_beyond_memory) {
    const PlanCandidate& f = *e.faster_beyond_memory;
    out += "  memory decides: " + f.describe() + " would be " +
           format_fixed(100 * (1 - f.sim.step_seconds / e.best.sim.step_seconds), 1) +
           "% faster but needs " + format_bytes(f.sim.peak_memory_bytes) + " per device\n";
  }
  if (e.what_ifs.empty()) return out;
  out += "if the cluster changes:\n";
  for (const WhatIf& w : e.what_ifs) {
    out += "  " + w.change + ": ";
    if (!w.best) {
      out += "no plan fits\n";
      continue;
    }
    const double d = w.best->sim.step_seconds / e.best.sim.step_seconds - 1;
    out += (w.same_plan ? std::string("the same plan") : w.best->describe()) + ", " +
           format_fixed(w.best->sim.step_seconds, 3) + " s per step (" + (d >= 0 ? "+" : "") +
           format_fixed(100 * d, 1) + "%)\n";
  }
  return out;
}

}  // namespace tessera
