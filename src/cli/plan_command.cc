// `tessera plan MODEL --dp N --zero S`: lowers the training step for a plan and prints, per
// rank, the planned memory, the bytes sent per step and (with --program) the instructions.
// Needs no MPI and no devices: the same Program the runtime executes.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>

#include "base/format.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/plan_auto.h"
#include "cli/plan_flags.h"
#include "cost/cluster_spec.h"
#include "io/model_config.h"
#include "io/toml_config.h"
#include "parallel/pipeline_program.h"
#include "parallel/program.h"

namespace tessera {

namespace {

struct PlanOptions {
  std::string model;
  int64_t batch = 8, seq = 0;
  int dp = 1;
  bool dp_given = false;  // --dp on the command line
  PlanFlags flags;        // the mesh's data axis comes from --dp
  bool program = false;
  bool automatic = false;  // --auto: the planner's search (cli/plan_auto.h)
  PlanAutoOptions search;
};

// A pipeline: the chunks' blocks and each stage's planned memory under the schedule (stages
// balanced by FLOPs; `simulate` balances by the cluster's op times).
Status print_pipeline(const Graph& g, Plan plan, int64_t batch, const std::string& placements) {
  TS_ASSIGN_OR_RETURN(PipelineProgram pp, lower_pipeline(g, plan));
  plan.stage_layers = pp.per_chunk;
  std::printf("%s\n", plan_to_json(plan).dump(2).c_str());
  std::fputs(placements.c_str(), stdout);
  std::printf("plan            %s\n", plan.describe().c_str());
  std::printf("local batch     %lld of %lld sequences per micro-batch\n",
              (long long)(batch / plan.data_group()), (long long)batch);
  for (int s = 0; s < plan.stages(); ++s) {
    std::string blocks;
    for (size_t k = static_cast<size_t>(s); k < pp.chunks.size();
         k += static_cast<size_t>(plan.stages())) {
      const ChunkProgram& c = pp.chunks[k];
      blocks += (blocks.empty() ? "" : ", ") + std::to_string(c.first_block) + "-" +
                std::to_string(c.first_block + c.blocks - 1);
    }
    std::printf(
        "stage %-9d blocks %s; arena %s (%d micro-batches in flight) + send buffers %s + "
        "persistent %s\n",
        s, blocks.c_str(),
        format_bytes(static_cast<double>(pp.stage_arena_bytes[static_cast<size_t>(s)])).c_str(),
        pp.in_flight[static_cast<size_t>(s)],
        format_bytes(static_cast<double>(pp.stage_p2p_bytes[static_cast<size_t>(s)])).c_str(),
        format_bytes(static_cast<double>(pp.stage_persistent_bytes[static_cast<size_t>(s)]))
            .c_str());
  }
  if (pp.shared_param_bytes > 0)
    std::printf("tied            %s of gradients summed between the first and last stage\n",
                format_bytes(static_cast<double>(pp.shared_param_bytes)).c_str());
  return Status();
}

Status run_plan(const PlanOptions& o) {
  TS_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(o.model));
  if (o.batch < 1) return error("--batch must be positive, got " + std::to_string(o.batch));
  if (o.seq < 0)
    return error("--seq must be positive (or 0: max_seq_len), got " + std::to_string(o.seq));
  const int64_t seq = o.seq > 0 ? o.seq : cfg.max_seq_len;
  if (seq > cfg.max_seq_len)
    return error("--seq " + std::to_string(seq) + " exceeds the model's max_seq_len " +
                 std::to_string(cfg.max_seq_len));
  if (o.dp < 1) return error("--dp must be at least 1, got " + std::to_string(o.dp));
  // A framework's plan file is read as the flags it means.
  PlanFlags given = o.flags;
  if (!given.file.empty() && o.dp_given) given.dp = o.dp;  // a framework's file: --dp, if given
  TS_ASSIGN_OR_RETURN(const PlanFlags f, resolve_plan_file(given, 0));
  TS_ASSIGN_OR_RETURN(
      Plan plan,
      plan_from_resolved(f, o.flags.file, o.flags.file.empty() ? o.dp * f.tp * f.pp * f.cp : 0));
  ModelGraph m = build_model(cfg, o.batch, seq, ModelMode::train);
  // The placements the search picks for a device whose FLOP/s are ~2,000 times its link's
  // bytes/s (H100 bf16 over NVLink 4); `simulate --tp` uses the cluster's own ratio.
  TS_ASSIGN_OR_RETURN(std::string placements,
                      place_parameters(f, cfg, o.batch, seq, m.graph, SearchCost{}, &plan));
  if (plan.stages() > 1) return print_pipeline(m.graph, plan, o.batch, placements);
  TS_ASSIGN_OR_RETURN(Program p, lower(m.graph, plan));
  std::printf("%s\n", plan_to_json(plan).dump(2).c_str());
  std::fputs(placements.c_str(), stdout);
  std::printf("plan            %s\n", plan.describe().c_str());
  std::printf("local batch     %lld of %lld sequences per micro-batch\n",
              (long long)(o.batch / plan.data_group()), (long long)o.batch);
  // One micro-batch per step: the optimizer reads the gradients in the arena.
  const std::string grads = plan.micro_batches > 1 ? format_bytes(static_cast<double>(p.grad_bytes))
                                                   : std::string("in the arena");
  std::printf("per rank        arena %s + parameters %s + gradients %s + optimizer %s\n",
              format_bytes(static_cast<double>(p.memory.arena_bytes)).c_str(),
              format_bytes(static_cast<double>(p.param_bytes)).c_str(), grads.c_str(),
              format_bytes(static_cast<double>(p.optim_bytes)).c_str());
  if (plan.offloads_optimizer())
    std::printf(
        "host per rank   %s (offloaded: f32 master weights, AdamW's moments, the "
        "gradients' f32 copies%s)\n",
        format_bytes(static_cast<double>(p.host_bytes)).c_str(),
        plan.offloads_params() ? "; the parameter blocks, copied in for each gather" : "");
  std::printf("communication   %s sent per rank per step\n",
              format_bytes(p.comm_bytes_per_step).c_str());
  std::printf("instructions    %zu per micro-batch, %zu per step (%zu gradient buckets)\n",
              p.micro_step.size(), p.optimizer.size(), p.part.buckets.size());
  // Conversions the ops' rules needed (the tensor-parallel all-reduces among them), counted
  // over blocks: "h.3.mlp add" and "h.4.mlp add" are one line, "h.*.mlp add ... (x2)".
  std::vector<std::pair<std::string, int>> conversions;
  for (const std::string& f : p.part.fallbacks) {
    std::string key = std::regex_replace(f, std::regex("^h\\.[0-9]+\\."), "h.*.");
    auto it = std::find_if(conversions.begin(), conversions.end(),
                           [&](const auto& c) { return c.first == key; });
    if (it == conversions.end())
      conversions.emplace_back(key, 1);
    else
      ++it->second;
  }
  for (const auto& [what, n] : conversions)
    std::printf("conversion      %s (x%d)\n", what.c_str(), n);
  if (o.program) std::fputs(print_program(p, 100000).c_str(), stdout);
  return Status();
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand("plan",
                                     "Lower a training step for a parallel plan and "
                                     "report per-rank memory and communication");
  cmd->add_option("model", o->model, "Preset name or config.toml")->required();
  cmd->add_option("--batch", o->batch, "Global micro-batch")->capture_default_str();
  cmd->add_option("--seq", o->seq, "Sequence length (default, or 0: the model's max_seq_len)");
  cmd->add_option("--dp", o->dp, "Data-parallel ranks")->capture_default_str();
  add_plan_flags(cmd, &o->flags);
  cmd->add_flag("--program", o->program, "Print every instruction");
  cmd->add_flag("--auto", o->automatic,
                "Search the plans (dp/ZeRO x tp/sequence parallel x pp/schedule x micro-batch x "
                "recompute) on --cluster with --gpus devices for --batch sequences per step, and "
                "print the fastest that fit");
  cmd->add_option(
         "--cluster", o->search.cluster,
         "With --auto: cluster preset (" + join_strings(cluster_presets()) + ") or .toml file")
      ->capture_default_str();
  cmd->add_option("--gpus", o->search.gpus, "With --auto: devices")->capture_default_str();
  cmd->add_option("--top", o->search.top, "With --auto: plans to list")->capture_default_str();
  cmd->add_option("--precision", o->search.precision,
                  "With --auto: bf16, f16, f32 or fp8 (the blocks' GEMMs in FP8 beside bf16)")
      ->capture_default_str();
  cmd->add_option("--threads", o->search.threads,
                  "With --auto: candidates simulated at once (default: every core)");
  cmd->add_flag("--json", o->search.json, "With --auto: the candidates as one JSON object");
  cmd->add_flag("--explain", o->search.explain,
                "With --auto: why the best plan wins, knob by knob, and how it moves with the "
                "network bandwidth and the device memory");
  cmd->add_option("--compare", o->search.compare,
                  "With --auto: clusters (comma-separated) to compare instead of --cluster: the "
                  "best plan on each, days to train --tokens and dollars per million tokens");
  cmd->add_option("--tokens", o->search.tokens, "With --compare: tokens to train")
      ->capture_default_str();
  cmd->callback([o, cmd] {
    o->dp_given = cmd->count("--dp") > 0;
    if (!o->automatic) {
      if (cmd->count("--json") || cmd->count("--cluster") || cmd->count("--gpus") ||
          cmd->count("--top") || cmd->count("--explain") || cmd->count("--compare") ||
          cmd->count("--tokens"))
        exit_on_error(
            error("--json, --cluster, --gpus, --top, --explain, --compare and --tokens "
                  "go with --auto",
                  "add --auto to search the plans, or `tessera simulate` to time one"));
      exit_on_error(run_plan(*o));
      return;
    }
    for (const char* flag :
         {"--dp", "--tp", "--pp", "--cp", "--zero", "--hsdp", "--sequence-parallel", "--schedule",
          "--virtual-stages", "--stage-layers", "--recompute", "--recompute-layers", "--plan"})
      if (cmd->count(flag))  // the search chooses these: it would ignore them
        exit_on_error(error(std::string(flag) + " with --auto: the search chooses the plan",
                            "drop the plan flags (or give them without --auto to lower that "
                            "plan)"));
    o->search.model = o->model;
    o->search.seq = o->seq;
    // --batch is then the sequences of a whole step (the planner picks the micro-batches).
    o->search.batch = cmd->count("--batch") ? o->batch : 0;
    exit_on_error(run_plan_auto(o->search));
  });
}

}  // namespace tessera
