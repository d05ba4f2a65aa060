// Why the planner's best plan wins: for each knob it set, the fastest fitting plan with another
// value of that knob and what it costs (step time, and which part of the step moves); the
// fastest plan that would win but does not fit; and how the best plan moves when the network
// or the device memory changes. `tessera plan --auto --explain` prints it.
//
//   TS_ASSIGN_OR_RETURN(auto space, PlanSpace::create(cfg, cluster, opt));
//   TS_ASSIGN_OR_RETURN(Explanation e, explain_best(*space));
//   std::printf("%s", format_explanation(e).c_str());
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "planner/planner.h"

namespace tessera {

struct KnobAlternative {
  std::string knob;    // "tensor parallel"
  std::string chosen;  // the best plan's value: "tp 4"
  // The fastest fitting plan whose value of this knob differs, when one exists (for the
  // micro-batch, on the best plan's tp and pp).
  std::optional<PlanCandidate> alternative;
  std::string alternative_value;  // its value: "tp 8"
  double slowdown = 0;            // alternative step time / best - 1
  // What moves, or why there is no alternative: "exposed communication +1.20 s, compute
  // -0.30 s; memory 61.0 GiB vs 45.2 GiB" / "the only value this model and cluster allow".
  std::string why;
};

struct WhatIf {
  std::string change;                 // "half the inter-node bandwidth"
  std::optional<PlanCandidate> best;  // its best plan; none when nothing fits
  bool same_plan = false;             // the same knobs as today's best
};

struct Explanation {
  PlanCandidate best;
  std::vector<KnobAlternative> knobs;
  // The fastest simulated plan, when it is faster than the best and does not fit.
  std::optional<PlanCandidate> faster_beyond_memory;
  std::vector<WhatIf> what_ifs;
};

// Explains the fastest fitting plan of `space` (searching each knob's alternatives on it), and
// searches the space's model on four changed clusters: half and twice the bandwidth between
// nodes (within a node when the run fits in one), half and twice the device memory.
// `what_ifs` false: the knobs only.
Result<Explanation> explain_best(PlanSpace& space, bool what_ifs = true);

// The explanation as text: one line per knob, then the what-ifs.
std::string format_explanation(const Explanation& e, double device_bytes);

}  // namespace tessera
