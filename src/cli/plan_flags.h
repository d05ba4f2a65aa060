// The parallelism flags `train`, `plan` and `simulate` share, and the one place that turns
// them into a Plan, so the three commands cannot disagree about what a flag means.
//
//   PlanFlags f;  f.tp = 2;  f.zero = 1;                    // --tp 2 --zero 1
//   TS_ASSIGN_OR_RETURN(Plan plan, plan_from_flags(f, world_size));
//   ModelGraph m = build_model(cfg, batch, seq, ModelMode::train);
//   TS_ASSIGN_OR_RETURN(std::string placed,
//                       place_parameters(f, cfg, batch, seq, m.graph, SearchCost{}, &plan));
//
// With --tp N and no plan file, the parameters' placements on the tensor axis come from the
// sharding search (parallel/sharding_search.h), run on a one-block copy of the model and
// spread over every block of the full graph.
#pragma once

#include <string>

#include "models/model.h"
#include "parallel/sharding_search.h"

namespace CLI {
class App;
}

namespace tessera {

struct PlanFlags {
  std::string file;       // --plan: a plan JSON; the mesh flags below are then ignored
  int dp = 0;             // data-parallel ranks; 0: ranks / tp
  int tp = 1;             // tensor-parallel ranks (the innermost mesh axis)
  int zero = 0;           // ZeRO stage 0-3
  int hsdp = 0;           // > 0: HSDP with this many replica groups (ZeRO-3 inside each)
  int micro = 0;          // micro-batches per step; 0: the plan file's (1 without one)
  std::string recompute;  // "none" | "full" | "selective"; "": the plan file's (none without one)
  bool sequence_parallel = false;  // --sequence-parallel (or the plan file's)
  int recompute_layers = -1;       // --recompute-layers N: the first N blocks; -1: the plan's
  int pp = 1;                      // pipeline stages (the outermost mesh axis)
  std::string schedule;            // --schedule; "": the plan file's (1f1b without one)
  int virtual_stages = -1;         // --virtual-stages; -1: not given (the plan file's, or 1)
  std::string stage_layers;        // --stage-layers "a,b,...": blocks per chunk
  std::string offload;             // --offload none|optimizer; "": the plan file's (none)
  int cp = 1;                      // context-parallel ranks (inside dp and pp, outside tp)
  std::string cp_order;            // --cp-order contiguous|zigzag; "": the plan's (contiguous)
  std::string cp_attention;        // --cp-attention gather|ring; "": the plan's (gather)
  int ep = 1;                      // expert-parallel ranks (a data axis inside dp, outside tp)
};

// The help text of --cp (the same on train, plan and simulate).
extern const char* const kContextParallelHelp;
extern const char* const kContextOrderHelp;
extern const char* const kContextAttentionHelp;
// The help text of --ep (the same on train, plan and simulate).
extern const char* const kExpertParallelHelp;

// The help text of --recompute-layers (the same on train, plan and simulate).
extern const char* const kRecomputeLayersHelp;
// The help text of --offload (the same on train, plan and simulate).
extern const char* const kOffloadHelp;

// Registers the plan flags `plan` and `simulate` share — --tp, --zero, --hsdp, --grad-accum,
// --plan, --recompute, --recompute-layers, --sequence-parallel, --pp, --schedule,
// --virtual-stages, --stage-layers, --offload, --cp, --cp-order, --ep — into *f (which must outlive
// the parse); the defaults shown are f's values. (`train` keeps its own, with longer help.)
void add_plan_flags(CLI::App* cmd, PlanFlags* f);

// The mesh and the plan's settings, checked against `ranks` devices (0: whatever the plan
// needs); a framework's plan file is read as resolve_plan_file reads it. Errors name the flag and
// the values that would work. `heads`: the model's attention heads, when known (0: not): the hint
// for a --tp that does not divide the ranks lists only the degrees that split the heads too.
Result<Plan> plan_from_flags(const PlanFlags& f, int ranks, int64_t heads = 0);

// A --plan file in a framework's words (sim/framework_plan.h lists its keys; a Tessera plan
// file has a "mesh"): the flags it means, its parallel degrees, sharding, recomputation,
// micro-batches and offload over the command's own, with no file (so placements come from the
// sharding search, as for flags). `f` as it is for a Tessera plan file or none. `ranks`: the
// devices, where the file leaves the data-parallel degree to them (0: not known).
Result<PlanFlags> resolve_plan_file(const PlanFlags& f, int ranks);
// plan_from_flags of flags resolve_plan_file already read from `file` (the command's --plan):
// for a framework's file, errors name the file and the flags it was read as.
Result<Plan> plan_from_resolved(const PlanFlags& resolved, const std::string& file, int ranks,
                                int64_t heads = 0);
// Whether a --plan file reads, as a Tessera plan or a framework's (before any rank is known).
Status check_plan_file(const std::string& file);
// The precision such a file gives ("bf16", "f16", "f32", "fp8"; "" when it gives none, or the
// file is a Tessera plan).
Result<std::string> plan_file_precision(const std::string& file);

// Once the global micro-batch and the training graph are known: checks that `batch` splits
// over the data axes, reads --stage-layers against the model's blocks and, for --tp without a plan
// file, places the parameters with the sharding search weighing FLOPs against tensor-axis bytes at
// `cost`. Returns one line per block-0 parameter with its placement and the search's figures (""
// when it did not run).
Result<std::string> place_parameters(const PlanFlags& f, const ModelConfig& cfg, int64_t batch,
                                     int64_t seq, const Graph& full, const SearchCost& cost,
                                     Plan* plan);

}  // namespace tessera
