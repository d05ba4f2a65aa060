// `tessera plan --auto`: the planner's search from the command line.
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
};

Status run_plan_auto(const PlanAutoOptions& o);

}  // namespace tessera
