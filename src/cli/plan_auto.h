// `tessera plan --auto`: the planner's search from the command line — the top plans, why the
// best wins (--explain), and the best plan on several clusters with its cost (--compare).
#pragma once

#include <string>

#include "base/status.h"

namespace tessera {

struct PlanAutoOptions {
  std::string model, cluster = "dgx-a100", precision = "bf16";
  int gpus = 8;
  int64_t batch = 0;  // sequences per optimizer step (0: one per device)
  int64_t seq = 0;
  int top = 5;
  int threads = 0;
  bool json = false;
  bool explain = false;
  std::string compare;   // "dgx-a100,dgx-h100,...": the best plan on each instead of --cluster
  double tokens = 3e11;  // with --compare: tokens to train, for the time and the cost
};

Status run_plan_auto(const PlanAutoOptions& o);

}  // namespace tessera
