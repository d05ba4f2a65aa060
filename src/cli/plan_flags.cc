#include "cli/plan_flags.h"

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/format.h"
#include "parallel/pipeline_stages.h"
#include "sim/framework_plan.h"

namespace tessera {

namespace {

// "1, 2, 4" : the divisors of n.
// The divisors of n that also divide `heads` (0: any), as a list for a hint.
std::string divisors(int n, int64_t heads = 0) {
  std::string s;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0 && (heads <= 0 || heads % d == 0))
      s += (s.empty() ? "" : ", ") + std::to_string(d);
  return s;
}

// One line per searched block parameter (block 0, and the first block of any other kind) with
// its placement on the tensor axis, then the search's
// cost figures.
std::string describe_block_layout(const BlockLayout& b, const Plan& plan) {
  const size_t tp = static_cast<size_t>(plan.mesh.axis_index(plan.tensor_axes.at(0)));
  std::string s;
  for (size_t i = 0; i < b.names.size(); ++i)
    s += "placement       " + b.names[i] + " " + b.placements[i][tp].to_string() + " on " +
         plan.tensor_axes[0] + "\n";
  for (size_t i = 0; i < b.outer_names.size(); ++i)
    if (!b.outer_placements[i][tp].is_replicate())
      s += "placement       " + b.outer_names[i] + " " + b.outer_placements[i][tp].to_string() +
           " on " + plan.tensor_axes[0] + "\n";
  for (const std::string& n : b.notes) s += "tp search       note: " + n + "\n";
  s += "tp search       " + std::to_string(b.candidates) + " candidates; " +
       (b.kind_sizes.size() > 1
            ? "a block of each of " + std::to_string(b.kind_sizes.size()) + " kinds"
            : std::string("block 0")) +
       " per rank: " + format_bytes(b.tensor_bytes) + " sent over " + plan.tensor_axes[0] +
       " per micro-batch (every block of a kind alike)\n";
  bool sharded = false;
  for (const std::vector<Placement>& p : b.placements) sharded = sharded || !p[tp].is_replicate();
  if (!sharded)
    s += "tp search       warning: no sharding pays for its bytes at this FLOP/byte ratio; "
         "every block parameter is replicated and the " +
         std::to_string(plan.tensor_group()) +
         " tp ranks repeat the same work (a larger model, or a plan file with placements)\n";
  return s;
}

// A --plan file in a framework's words (sim/framework_plan.h; a Tessera plan has a "mesh"):
// nullopt for a Tessera plan, or a file that cannot be read (load_plan says why).
Result<std::optional<FrameworkPlan>> read_framework_plan_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return std::optional<FrameworkPlan>();
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!in.is_open() || j.is_discarded() || !is_framework_plan(j))
    return std::optional<FrameworkPlan>();
  Result<FrameworkPlan> p = read_framework_plan(j);
  if (!p.ok()) return p.status().with_context(path);
  return std::optional<FrameworkPlan>(*p);
}

// The flags a framework's plan means, over the command's own (which must not give the same
// knobs: the file does).
// The command's flag `name` at `*flag` takes the file's `value` (0: the file gives none); a
// flag the command set (not `unset`) to another value is an error. `droppable`: the flag can
// be left out (not --grad-accum, which train always has).
Status take(int value, int* flag, int unset, const char* name, bool droppable = true) {
  if (value == 0) return Status();
  if (*flag != unset && *flag != value)
    return error(std::string(name) + " " + std::to_string(*flag) + ", but the plan file gives " +
                     std::to_string(value),
                 std::string(name) + " " + std::to_string(value) +
                     (droppable ? " (or drop the flag: the file gives the plan)" : ""));
  *flag = value;
  return Status();
}

Result<PlanFlags> flags_of(const FrameworkPlan& p, const PlanFlags& cmd, int ranks) {
  PlanFlags f = cmd;
  f.file.clear();
  TS_RETURN_IF_ERROR(take(p.tp, &f.tp, 1, "--tp"));
  TS_RETURN_IF_ERROR(take(p.pp, &f.pp, 1, "--pp"));
  TS_RETURN_IF_ERROR(take(p.cp, &f.cp, 1, "--cp"));
  TS_RETURN_IF_ERROR(take(p.ep, &f.ep, 1, "--ep"));
  // Megatron, DeepSpeed and torchtitan count the expert-parallel ranks among the data-parallel
  // ones (MaxText gives them an axis of their own); Tessera's expert axis is beside its data
  // axes.
  int file_dp = p.dp;
  if (file_dp > 0 && f.ep > 1 && !p.ep_beside_dp) {
    if (file_dp % f.ep != 0)
      return error("plan: " + std::to_string(file_dp) + " data-parallel ranks do not split into " +
                       std::to_string(f.ep) + " expert-parallel groups",
                   "a data degree that is a multiple of the expert degree");
    file_dp /= f.ep;
  }
  TS_RETURN_IF_ERROR(take(file_dp, &f.dp, 0, "--dp"));
  TS_RETURN_IF_ERROR(take(p.micro_batches, &f.micro, 0, "--grad-accum", false));
  const int inner = f.tp * f.pp * f.cp * f.ep;
  if (f.dp == 0 && ranks == 0)
    return error("plan: the file gives no data-parallel degree, and the command no device count",
                 "give a data degree in the file (\"dp\": N) or on the command line (--dp N; "
                 "simulate: --gpus N)");
  const int dp = f.dp > 0 ? f.dp : ranks % inner == 0 ? ranks / inner : 0;
  if (p.sharding_given) {
    if ((f.zero != 0 && f.zero != p.sharding.zero) || (f.hsdp > 0 && !p.sharding.hsdp))
      return error("--zero/--hsdp and a plan file that gives the sharding",
                   "drop the flags: the file gives the plan");
    f.zero = p.sharding.zero;
    if (p.sharding.hsdp) {
      int replicas = p.replicas;
      if (replicas == 0 && p.sharding.shard > 0 && dp > 0) {
        if (dp % p.sharding.shard != 0)
          return error("plan: a shard degree of " + std::to_string(p.sharding.shard) +
                           " does not divide the " + std::to_string(dp) + " data-parallel ranks",
                       "a shard degree that divides them");
        replicas = dp / p.sharding.shard;
      }
      if (replicas == 0)
        return error(p.sharding.shard > 0
                         ? "plan: HSDP with a shard degree of " + std::to_string(p.sharding.shard) +
                               " needs the data-parallel ranks"
                         : std::string("plan: HSDP without a shard degree"),
                     p.sharding.shard > 0
                         ? "a data degree in the file, or the device count (--dp; simulate: "
                           "--gpus) that tp x pp x cp x ep divides"
                         : "give the ranks of a shard group: \"dp_shard=8\" in the sharding, "
                           "or data_parallel_shard_degree");
      if (f.hsdp > 0 && f.hsdp != replicas)
        return error("--hsdp " + std::to_string(f.hsdp) + ", but the plan file gives " +
                         std::to_string(replicas) + " replica groups",
                     "drop --hsdp: the file gives the plan");
      f.hsdp = replicas;
      if (f.zero == 2)
        return error("plan: HSDP with ZeRO-2 inside the shard groups is not implemented",
                     "HYBRID_SHARD (ZeRO-3 inside them)");
    }
  }
  if (!p.recompute.empty()) {
    if (!f.recompute.empty() && f.recompute != p.recompute)
      return error("--recompute " + f.recompute + ", but the plan file gives " + p.recompute,
                   "drop --recompute: the file gives the plan");
    f.recompute = p.recompute;
  }
  if (p.sequence_parallel) f.sequence_parallel = true;
  if (p.offload_params && !p.offload_optimizer)
    return error(
        "plan: the file offloads the parameters but not the optimizer; Tessera offloads "
        "parameters only with their optimizer state",
        "add \"offload_optimizer\": {\"device\": \"cpu\"} beside \"offload_param\"");
  if (p.offload_optimizer) {
    const std::string off = p.offload_params ? "params" : "optimizer";
    if (!f.offload.empty() && f.offload != off)
      return error("--offload " + f.offload + ", but the plan file offloads the " +
                       (p.offload_params ? "parameters and the optimizer" : "optimizer"),
                   "drop --offload: the file gives the plan");
    f.offload = off;
  }
  return f;
}

}  // namespace

Status check_plan_file(const std::string& file) {
  TS_ASSIGN_OR_RETURN(std::optional<FrameworkPlan> framework, read_framework_plan_file(file));
  return framework ? Status() : load_plan(file).status();
}

Result<std::string> plan_file_precision(const std::string& file) {
  if (file.empty()) return std::string();
  TS_ASSIGN_OR_RETURN(std::optional<FrameworkPlan> p, read_framework_plan_file(file));
  return p ? p->precision : std::string();
}

Result<PlanFlags> resolve_plan_file(const PlanFlags& f, int ranks) {
  if (f.file.empty()) return f;
  TS_ASSIGN_OR_RETURN(std::optional<FrameworkPlan> framework, read_framework_plan_file(f.file));
  if (!framework) return f;
  Result<PlanFlags> flags = flags_of(*framework, f, ranks);
  if (!flags.ok()) return flags.status().with_context(f.file);
  return flags;
}

namespace {

// The flags a framework's plan file was read as: "--tp 8 --pp 4 --zero 1 --grad-accum 8".
std::string describe_flags(const PlanFlags& f) {
  std::string s;
  auto add = [&](const char* name, const std::string& v) {
    s += std::string(" ") + name + " " + v;
  };
  if (f.dp > 0) add("--dp", std::to_string(f.dp));
  for (auto [name, v] : {std::pair{"--tp", f.tp}, std::pair{"--pp", f.pp}, std::pair{"--cp", f.cp},
                         std::pair{"--ep", f.ep}})
    if (v > 1) add(name, std::to_string(v));
  add("--zero", std::to_string(f.zero));
  if (f.hsdp > 0) add("--hsdp", std::to_string(f.hsdp));
  if (f.micro > 0) add("--grad-accum", std::to_string(f.micro));
  if (!f.recompute.empty()) add("--recompute", f.recompute);
  if (f.sequence_parallel) s += " --sequence-parallel";
  if (!f.offload.empty()) add("--offload", f.offload);
  return s.empty() ? s : s.substr(1);
}

Result<Plan> plan_of_flags(const PlanFlags& f, int ranks, int64_t heads);

}  // namespace

Result<Plan> plan_from_flags(const PlanFlags& given, int ranks, int64_t heads) {
  TS_ASSIGN_OR_RETURN(const PlanFlags f, resolve_plan_file(given, ranks));
  return plan_from_resolved(f, given.file, ranks, heads);
}

Result<Plan> plan_from_resolved(const PlanFlags& f, const std::string& file, int ranks,
                                int64_t heads) {
  Result<Plan> plan = plan_of_flags(f, ranks, heads);
  // A framework's file: its errors name the flags it was read as.
  if (!plan.ok() && !file.empty() && f.file.empty())
    return plan.status().with_context("the plan file " + file + " (read as " + describe_flags(f) +
                                      ")");
  return plan;
}

namespace {

Result<Plan> plan_of_flags(const PlanFlags& f, int ranks, int64_t heads) {
  Plan plan;
  if (!f.file.empty() && f.ep > 1)
    return error("--ep with --plan: the plan file gives the mesh",
                 "add an axis {\"name\": \"ep\", \"size\": " + std::to_string(f.ep) +
                     "} to the plan's mesh instead");
  if (!f.file.empty() && f.cp > 1)
    return error("--cp with --plan: the plan file gives the mesh",
                 "add an axis {\"name\": \"cp\", \"size\": " + std::to_string(f.cp) +
                     "} to the plan's mesh instead");
  if (!f.file.empty()) {
    TS_ASSIGN_OR_RETURN(plan, load_plan(f.file));
  } else {
    if (f.tp < 1) return error("--tp must be at least 1, got " + std::to_string(f.tp));
    if (f.dp < 0) return error("--dp must be at least 1, got " + std::to_string(f.dp));
    if (f.dp == 0 && ranks % f.tp != 0)
      return error("--tp " + std::to_string(f.tp) + " does not divide the " +
                       std::to_string(ranks) + " ranks",
                   "use a --tp that divides " + std::to_string(ranks) +
                       (heads > 0 ? " and the model's " + std::to_string(heads) + " heads" : "") +
                       ": " + divisors(ranks, heads));
    if (f.pp < 1) return error("--pp must be at least 1, got " + std::to_string(f.pp));
    if (f.cp < 1) return error("--cp must be at least 1, got " + std::to_string(f.cp));
    if (f.ep < 1) return error("--ep must be at least 1, got " + std::to_string(f.ep));
    const int inner = f.tp * f.pp * f.cp * f.ep;  // ranks of one data-parallel replica
    if (f.dp == 0 && ranks % inner != 0)
      return error("--pp " + std::to_string(f.pp) + " x --tp " + std::to_string(f.tp) +
                       (f.cp > 1 ? " x --cp " + std::to_string(f.cp) : std::string()) +
                       (f.ep > 1 ? " x --ep " + std::to_string(f.ep) : std::string()) + " = " +
                       std::to_string(inner) + " does not divide the " + std::to_string(ranks) +
                       " ranks",
                   "use --pp, --tp, --cp and --ep whose product divides " + std::to_string(ranks) +
                       ": " + divisors(ranks));
    const int dp = f.dp > 0 ? f.dp : ranks / inner;
    if (ranks > 0 && dp * inner != ranks)
      return error("--dp " + std::to_string(dp) + " x --tp " + std::to_string(f.tp) +
                       (f.pp > 1 ? " x --pp " + std::to_string(f.pp) : std::string()) +
                       (f.cp > 1 ? " x --cp " + std::to_string(f.cp) : std::string()) +
                       (f.ep > 1 ? " x --ep " + std::to_string(f.ep) : std::string()) + " is " +
                       std::to_string(dp * inner) + " ranks, but the job has " +
                       std::to_string(ranks),
                   "drop --dp (it defaults to ranks / (tp x pp x cp x ep)) or launch " +
                       std::to_string(dp * inner) + " ranks");
    if (f.pp > 1) {
      if (f.hsdp > 0)
        return error("--hsdp with --pp is not implemented",
                     "use --zero 1 with --pp (ZeRO-2/3 reduce per micro-batch, a pipeline once "
                     "per step)");
      plan = Plan::pipeline_parallel(f.pp, dp, f.tp, f.zero);
    } else if (f.hsdp > 0) {
      if (dp % f.hsdp != 0)
        return error("--hsdp " + std::to_string(f.hsdp) + " does not divide the " +
                         std::to_string(dp) + " data-parallel ranks",
                     "use one of " + divisors(dp));
      plan = Plan::hybrid_sharded(f.hsdp, dp / f.hsdp, f.tp);
    } else if (f.tp > 1) {
      plan = Plan::tensor_parallel(dp, f.tp, f.zero);
    } else {
      plan = Plan::data_parallel(dp, f.zero);
    }
    TS_RETURN_IF_ERROR(add_context_axis(&plan, f.cp));
    TS_RETURN_IF_ERROR(add_expert_axis(&plan, f.ep));
  }
  if (f.micro > 0) plan.micro_batches = f.micro;
  if (f.sequence_parallel) plan.sequence_parallel = true;
  if (!f.recompute.empty()) {
    Result<RecomputePolicy> r = parse_recompute(f.recompute);
    if (!r.ok()) return error("--recompute: " + r.status().message(), r.status().hint());
    plan.recompute = r.value();
  }
  if (f.recompute_layers != -1) {
    if (f.recompute_layers < 0)
      return error("--recompute-layers must be a number of blocks, got " +
                   std::to_string(f.recompute_layers));
    if (plan.recompute == RecomputePolicy::none)
      return error("--recompute-layers " + std::to_string(f.recompute_layers) +
                       " without a recompute policy",
                   "add --recompute full or --recompute selective");
    plan.recompute_layers = f.recompute_layers;
  }
  if (!f.offload.empty()) {
    Result<OffloadPolicy> r = parse_offload(f.offload);
    if (!r.ok()) return error("--offload: " + r.status().message(), r.status().hint());
    plan.offload = r.value();
  }
  if (!f.cp_order.empty()) {
    Result<ContextOrder> r = parse_context_order(f.cp_order);
    if (!r.ok()) return error("--cp-order: " + r.status().message(), r.status().hint());
    if (plan.context_group() == 1)
      return error("--cp-order " + f.cp_order + " without context parallelism",
                   "add --cp N (N >= 2)");
    plan.context_order = r.value();
  }
  if (!f.cp_attention.empty()) {
    Result<ContextAttention> r = parse_context_attention(f.cp_attention);
    if (!r.ok()) return error("--cp-attention: " + r.status().message(), r.status().hint());
    if (plan.context_group() == 1)
      return error("--cp-attention " + f.cp_attention + " without context parallelism",
                   "add --cp N (N >= 2)");
    plan.context_attention = r.value();
  }
  if (!f.schedule.empty()) {
    Result<ScheduleKind> r = parse_schedule(f.schedule);
    if (!r.ok()) return error("--schedule: " + r.status().message(), r.status().hint());
    plan.schedule = r.value();
  }
  if (f.virtual_stages != -1) {
    if (f.virtual_stages < 1)
      return error("--virtual-stages must be at least 1, got " + std::to_string(f.virtual_stages));
    plan.virtual_stages = f.virtual_stages;
  }
  if (plan.stages() == 1 &&
      (!f.schedule.empty() || f.virtual_stages > 1 || !f.stage_layers.empty()))
    return error("--schedule, --virtual-stages and --stage-layers need pipeline stages",
                 "add --pp N (N >= 2)");
  TS_RETURN_IF_ERROR(validate(plan, ranks));
  return plan;
}

}  // namespace

const char* const kRecomputeLayersHelp =
    "Recompute only the first N transformer blocks (with --recompute; default: the plan's, or "
    "every block): just enough recomputation to fit costs less than all of it";

const char* const kOffloadHelp =
    "Where the optimizer state lives: none (the device) | optimizer (host memory: the f32 "
    "master weights and AdamW moments, AdamW on the host's cores; ZeRO-Offload) | params (with "
    "--zero 3: the parameter blocks too, copied to the device for each gather). Default: the "
    "plan's, or none";

const char* const kContextParallelHelp =
    "Context-parallel ranks: each holds a contiguous chunk of every sequence; attention "
    "gathers the keys and values of the whole sequence (language models; the sequence must "
    "split evenly)";

const char* const kContextOrderHelp =
    "How --cp cuts each sequence: contiguous (rank r the r-th chunk; the last rank's causal "
    "attention does the most) | zigzag (2 x cp halves, rank r halves r and 2cp-1-r: equal "
    "work; not for learned position tables, GPT). Default: the plan's, or contiguous";

const char* const kContextAttentionHelp =
    "How attention meets the other --cp ranks' keys and values: gather (all-gathered whole "
    "before it) | ring (passed round the ranks a chunk at a time beside the attention of the "
    "chunk in hand, the transfers overlapping it). Default: the plan's, or gather";

const char* const kExpertParallelHelp =
    "Expert-parallel ranks (mixture-of-experts models): each holds n_experts / ep of every "
    "block's experts and its own share of the batch; tokens reach their experts and come "
    "back by all-to-all";

void add_plan_flags(CLI::App* cmd, PlanFlags* f) {
  cmd->add_option("--tp", f->tp,
                  "Tensor-parallel ranks, innermost (placements found by the sharding search)")
      ->capture_default_str();
  cmd->add_option("--zero", f->zero, "ZeRO stage 0-3")->capture_default_str();
  cmd->add_option("--hsdp", f->hsdp, "HSDP replica groups (ZeRO-3 within each)");
  cmd->add_option("--grad-accum", f->micro, "Micro-batches per step (default: the plan's, or 1)");
  cmd->add_option("--plan", f->file, "Plan JSON file (overrides the plan flags)");
  cmd->add_option("--recompute", f->recompute,
                  "Activation recomputation: none|full|selective (default: the plan's, or none)");
  cmd->add_option("--recompute-layers", f->recompute_layers, kRecomputeLayersHelp);
  cmd->add_option("--pp", f->pp,
                  "Pipeline stages (outermost mesh axis; each holds a contiguous run of blocks)")
      ->capture_default_str();
  cmd->add_option("--schedule", f->schedule,
                  "Pipeline schedule: gpipe|1f1b|interleaved|zb-h1 (default: the plan's, or 1f1b)");
  cmd->add_option("--virtual-stages", f->virtual_stages,
                  "Model chunks per stage for --schedule interleaved");
  cmd->add_option("--stage-layers", f->stage_layers,
                  "Blocks per model chunk, in order, e.g. 5,6,6,5 (default: balanced by cost)");
  cmd->add_option("--offload", f->offload, kOffloadHelp);
  cmd->add_option("--cp", f->cp, kContextParallelHelp)->capture_default_str();
  cmd->add_option("--cp-order", f->cp_order, kContextOrderHelp);
  cmd->add_option("--cp-attention", f->cp_attention, kContextAttentionHelp);
  cmd->add_option("--ep", f->ep, kExpertParallelHelp)->capture_default_str();
  cmd->add_flag("--sequence-parallel", f->sequence_parallel,
                "Sequence parallelism with --tp: norms and residual adds split on the sequence "
                "over the tensor-parallel ranks (reduce-scatter + all-gather instead of "
                "all-reduce; less activation memory)");
}

Result<std::string> place_parameters(const PlanFlags& f, const ModelConfig& cfg, int64_t batch,
                                     int64_t seq, const Graph& full, const SearchCost& cost,
                                     Plan* plan) {
  if (batch % plan->data_group() != 0)
    return error("--batch " + std::to_string(batch) +
                     " (the global micro-batch) does not split over " +
                     std::to_string(plan->data_group()) + " data-parallel ranks",
                 "use a multiple of " + std::to_string(plan->data_group()));
  const int64_t blocks = num_blocks(cfg);
  if (!f.stage_layers.empty()) {
    Result<std::vector<int>> per_chunk =
        parse_stage_layers(f.stage_layers, static_cast<int>(blocks), plan->chunks());
    if (!per_chunk.ok()) return per_chunk.status();
    plan->stage_layers = per_chunk.value();
  } else if (plan->chunks() > blocks) {
    return error("--pp " + std::to_string(plan->stages()) +
                     (plan->virtual_stages > 1
                          ? " x --virtual-stages " + std::to_string(plan->virtual_stages)
                          : std::string()) +
                     " is " + std::to_string(plan->chunks()) + " model chunks, but " + cfg.name +
                     " has " + std::to_string(blocks) + " blocks",
                 "use at most " + std::to_string(blocks) +
                     " chunks (a chunk holds whole "
                     "blocks)");
  }
  if (!f.file.empty() || plan->tensor_group() == 1) return std::string();
  TS_ASSIGN_OR_RETURN(BlockLayout b, place_tensor_parallel(cfg, batch, seq, full, cost, plan));
  return describe_block_layout(b, *plan);
}

}  // namespace tessera
