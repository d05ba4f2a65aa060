// The planner's search space: every plan for o.gpus devices and `batch` sequences a step
// (PlanSpace::create bounds, prunes and simulates them). Internal to the planner.
#pragma once

#include <cstdint>
#include <vector>

#include "planner/planner.h"

namespace tessera {

// Each degree of tensor, pipeline, context and expert parallelism the model and cluster allow
// (the data-parallel ranks are the rest of the devices), each ZeRO stage or HSDP grouping,
// schedule, micro-batch and recomputation; and, where the cluster gives its host side, each plan
// without a pipeline again with its optimizer offloaded, a ZeRO-3 one with its parameters too.
// Bounds are not yet computed.
std::vector<PlanCandidate> enumerate_plans(const ModelConfig& cfg, const ClusterSpec& cluster,
                                           const PlannerOptions& o, int64_t batch);

}  // namespace tessera
