// `tessera simulate MODEL --cluster C --gpus N ...`: lowers the training step for a plan (the
// same Program `tessera train` executes) and times it on a ClusterSpec: step time and its
// breakdown, tokens/s, MFU/HFU and per-device memory; --trace writes a Chrome/Perfetto trace;
// --json prints the figures as one JSON object instead (for scripts and plan searches).
#include <chrono>
#include <cstdio>

#include "base/format.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/plan_flags.h"
#include "cost/flops.h"
#include "io/fs.h"
#include "io/model_config.h"
#include "io/toml_config.h"
#include "sim/simulator.h"

namespace tessera {

namespace {

// simulate's default is ZeRO-3 (FSDP), what large runs use.
PlanFlags zero_three() {
  PlanFlags f;
  f.zero = 3;
  return f;
}

struct SimulateOptions {
  std::string model, cluster = "dgx-a100", trace, precision = "bf16", algo = "auto";
  int64_t batch = 0, seq = 0;
  int gpus = 8;
  PlanFlags flags = zero_three();  // the data axis comes from --gpus / --tp / --pp
  bool zero_given = false;         // --zero on the command line
  bool gpus_given = false, precision_given = false;
  bool json = false;
};

// The prediction as one JSON object: what a script (or a search over plans) compares.
nlohmann::json sim_json(const ModelConfig& cfg, const ClusterSpec& cluster, const Plan& plan,
                        int64_t batch, int64_t seq, const SimOptions& so, const SimResult& r) {
  return {{"model", cfg.name},
          {"parameters", count_params(cfg)},
          {"cluster", cluster.name},
          {"device", cluster.device.name},
          {"devices", r.devices},
          {"batch", batch},
          {"seq", seq},
          {"precision", sim_precision_name(so)},
          {"plan", plan_to_json(plan)},
          {"step_s", r.step_seconds},
          {"compute_s", r.compute_seconds},
          {"exposed_comm_s", r.exposed_comm_seconds},
          {"bubble_s", r.bubble_seconds},
          {"offload_s", r.offload_seconds},
          {"host_bytes_per_device", r.host_bytes},
          {"bubble_fraction", r.bubble_fraction},
          {"peak_bytes_per_stage", r.stage_peak_bytes},
          {"tokens_per_step", r.tokens_per_step},
          {"tokens_per_s", r.tokens_per_second},
          {"examples_per_step", r.examples_per_step},
          {"examples_per_s", r.examples_per_second},
          {"model_tflops_per_device", r.model_tflops_per_device},
          {"mfu", r.mfu},
          {"hfu", r.hfu},
          {"peak_bytes_per_device", r.peak_memory_bytes},
          {"persistent_bytes_per_device", r.persistent_bytes},
          {"arena_bytes_per_device", r.arena_bytes},
          {"device_memory_bytes", cluster.device.memory_bytes},
          {"fits", r.peak_memory_bytes <= cluster.device.memory_bytes}};
}

Status run_simulate(const SimulateOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  TS_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(o.model));
  TS_ASSIGN_OR_RETURN(ClusterSpec cluster, load_cluster(o.cluster));
  if (o.seq < 0)
    return error("--seq must be positive (or 0: max_seq_len), got " + std::to_string(o.seq));
  if (o.batch < 0)
    return error("--batch must be positive (or 0: one sequence per data-parallel rank), got " +
                 std::to_string(o.batch));
  const int64_t seq = o.seq > 0 ? o.seq : cfg.max_seq_len;
  if (seq > cfg.max_seq_len)
    return error("--seq " + std::to_string(seq) + " exceeds the model's max_seq_len " +
                 std::to_string(cfg.max_seq_len));
  if (o.flags.file.empty() && (o.gpus < 1 || o.gpus > (1 << 20)))
    return error("--gpus must be between 1 and 1048576, got " + std::to_string(o.gpus));
  PlanFlags f = o.flags;
  // A plan file gives the mesh: --gpus, when given too, must agree with it. A framework's plan
  // file is read as the flags it means, ZeRO-0 where it names no sharding (as the frameworks
  // read it) rather than simulate's ZeRO-3.
  const int ranks = f.file.empty() || o.gpus_given ? o.gpus : 0;
  TS_ASSIGN_OR_RETURN(std::string file_precision, plan_file_precision(f.file));
  if (!f.file.empty() && !o.zero_given) f.zero = 0;
  TS_ASSIGN_OR_RETURN(f, resolve_plan_file(f, ranks));
  // ZeRO-3, simulate's default, does not combine with a pipeline: ZeRO-1 there.
  if (o.flags.file.empty() && f.pp > 1 && !o.zero_given) f.zero = 1;
  TS_ASSIGN_OR_RETURN(Plan plan, plan_from_resolved(f, o.flags.file, ranks, cfg.n_head));
  const int64_t batch = o.batch > 0 ? o.batch : plan.data_group();
  // A framework's plan file may give the precision.
  std::string precision = o.precision;
  if (!file_precision.empty()) {
    SimOptions given;
    TS_RETURN_IF_ERROR(parse_sim_precision(o.precision, &given));
    if (o.precision_given && sim_precision_name(given) != file_precision)
      return error("--precision " + o.precision + ", but the plan file says " + file_precision,
                   "drop one of them");
    precision = file_precision;
  }
  SimOptions so;
  TS_RETURN_IF_ERROR(parse_sim_precision(precision, &so));
  if (!parse_coll_algo(o.algo, &so.algo))
    return error("--algo '" + o.algo + "' is not one of auto, ring, tree, hierarchical");
  so.trace = !o.trace.empty();

  ModelGraph m = build_model(cfg, batch, seq, ModelMode::train);
  TS_RETURN_IF_ERROR(
      place_parameters(f, cfg, batch, seq, m.graph,
                       cluster_search_cost(cluster, so.precision, plan, num_blocks(cfg)), &plan)
          .status());
  TS_ASSIGN_OR_RETURN(SimResult r, simulate_plan(m.graph, plan, cluster, so));
  plan.stage_layers = r.stage_layers;
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string title = cfg.name + " on " + std::to_string(plan.mesh.size()) + " x " +
                            cluster.device.name + " (" + plan.describe() + ")";
  if (so.trace) TS_RETURN_IF_ERROR(write_file_atomic(o.trace, chrome_trace(r, title)));
  if (o.json) {
    std::printf("%s\n", sim_json(cfg, cluster, plan, batch, seq, so, r).dump(2).c_str());
    return Status();
  }

  std::printf("model            %s (%s parameters), global micro-batch %lld x %lld tokens\n",
              cfg.name.c_str(), format_count(m.graph.param_count()).c_str(), (long long)batch,
              (long long)seq);
  std::printf("cluster          %s: %d x %s, %d per node (%d nodes)\n", cluster.name.c_str(),
              plan.mesh.size(), cluster.device.name.c_str(), cluster.node.devices,
              cluster.nodes_for(plan.mesh.size()));
  if (cluster.network.topology != "fat-tree" && plan.mesh.size() > cluster.node.devices)
    std::printf(
        "note             the %s network is timed as a fat tree (per-node bandwidth, "
        "oversubscription %g); its own topology is not modelled yet\n",
        cluster.network.topology.c_str(), cluster.network.oversubscription);
  if (cluster.node.devices > 0 && plan.mesh.size() > cluster.node.devices &&
      plan.mesh.size() % cluster.node.devices != 0)
    std::printf(
        "note             %d devices do not fill whole nodes of %d: the last node holds "
        "%d; collectives are timed as if spread evenly over nodes of their largest "
        "common divisor\n",
        plan.mesh.size(), cluster.node.devices, plan.mesh.size() % cluster.node.devices);
  std::printf("plan             %s, %d micro-batch(es) per step, %s\n", plan.describe().c_str(),
              plan.micro_batches, sim_precision_name(so));
  std::fputs(format_sim_result(r, cluster).c_str(), stdout);
  // The counts published runs use, for comparing with them (cost/flops.h).
  TransformerShape ts{static_cast<double>(batch * plan.micro_batches), static_cast<double>(seq),
                      static_cast<double>(cfg.n_layer), static_cast<double>(cfg.n_embd),
                      static_cast<double>(cfg.vocab_size)};
  const double per_device_s = r.step_seconds * r.devices;
  const double peak = run_peak_flops(cluster.device, so);
  std::printf(
      "published-style  Megatron eq.(3) %.1f TFLOP/s per device; 6N+12lhs MFU %.1f%%\n",
      megatron_flops_with_recompute(ts) / per_device_s / 1e12,
      100 * palm_model_flops(ts, static_cast<double>(m.graph.param_count())) / per_device_s / peak);
  if (r.peak_memory_bytes > cluster.device.memory_bytes)
    std::printf("DOES NOT FIT     predicted peak exceeds the device's %s\n",
                format_bytes(cluster.device.memory_bytes).c_str());
  if (so.trace) {
    std::printf("trace            %s (%zu events; open in ui.perfetto.dev)\n", o.trace.c_str(),
                r.events.size());
  }
  std::printf("simulated in     %.3f s\n", secs);
  return Status();
}

}  // namespace

void add_simulate_command(CLI::App& app) {
  auto o = std::make_shared<SimulateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "simulate", "Predict step time, throughput, MFU and memory of a plan on a cluster");
  cmd->add_option("model", o->model, "Preset name or config.toml")->required();
  cmd->add_option("--cluster", o->cluster,
                  "Cluster preset (" + join_strings(cluster_presets()) + ") or .toml file")
      ->capture_default_str();
  cmd->add_option("--gpus", o->gpus, "Devices (data-parallel x tensor-parallel x pipeline ranks)")
      ->capture_default_str();
  cmd->add_option("--batch", o->batch,
                  "Global micro-batch in sequences (default, or 0: one per data-parallel rank)");
  cmd->add_option("--seq", o->seq, "Sequence length (default, or 0: the model's max_seq_len)");
  add_plan_flags(cmd, &o->flags);
  cmd->add_option("--precision", o->precision,
                  "f32 | bf16 (mixed) | f16 (mixed) | fp8 (the blocks' GEMMs in FP8 beside bf16, "
                  "as Transformer Engine runs them)")
      ->capture_default_str();
  cmd->add_option("--algo", o->algo, "Collective algorithm: auto|ring|tree|hierarchical")
      ->capture_default_str();
  cmd->add_option("--trace", o->trace, "Write a Chrome/Perfetto trace of one step here");
  cmd->add_flag("--json", o->json,
                "Print the prediction as one JSON object (step_s, tokens_per_s, mfu, hfu, "
                "peak_bytes_per_device, fits, plan, ...)");
  cmd->callback([o, cmd] {
    o->zero_given = cmd->get_option("--zero")->count() > 0;
    o->gpus_given = cmd->get_option("--gpus")->count() > 0;
    o->precision_given = cmd->get_option("--precision")->count() > 0;
    exit_on_error(run_simulate(*o));
  });
}

}  // namespace tessera
