// `tessera submit (--flavor NAME | --gpus N) [--dry-run] -- train ...`: plans the training run
// for the flavor's devices (the planner, on the flavor's cluster spec), writes a Slurm batch
// script that runs `srun tessera train ... --plan OUT/plan.json` on them (nodes, tasks per node,
// a GPU per task, a time limit from the predicted step time), and submits it with sbatch.
// --dry-run prints the plan and the script instead.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "base/format.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/slurm_jobs.h"
#include "cost/cluster_spec.h"
#include "cost/flavor.h"
#include "io/fs.h"
#include "io/model_config.h"
#include "planner/planner.h"

namespace tessera {
namespace {

struct SubmitOptions {
  std::string flavor;
  int gpus = 0;
  std::string cluster = "dgx-h100";  // with --gpus
  std::string flavors;               // a user's flavors file
  double margin = 0.2;               // the time limit's share above the prediction
  int max_requeues = 3;              // runs again after a task died
  bool dry_run = false;
  std::string sbatch = "sbatch";
  std::vector<std::string> args;  // `train` and its flags
};

// The train flags of the job, parsed as `tessera train` parses them (nothing runs).
Result<TrainOptions> parse_train_args(const std::vector<std::string>& args) {
  if (args.empty() || args[0] != "train")
    return error("submit runs a training job: give `-- train` and its flags",
                 "tessera submit --flavor xlarge.640gb -- train --model llama3-8b --steps 1000");
  CLI::App app;
  TrainOptions o;
  add_train_command(app, o);
  app.get_subcommand("train")->callback([] {});  // parse only
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return error(std::string("the train flags: ") + e.what(), "`tessera train --help` lists them");
  }
  return o;
}

// Slurm's time format: D-HH:MM:SS.
std::string slurm_time(double seconds) {
  const int64_t s = static_cast<int64_t>(std::ceil(seconds));
  char buf[48];
  std::snprintf(buf, sizeof buf, "%lld-%02lld:%02lld:%02lld", (long long)(s / 86400),
                (long long)(s / 3600 % 24), (long long)(s / 60 % 60), (long long)(s % 60));
  return buf;
}

// The planner's fastest plan for the job on `devices` of `cluster`.
Result<PlanCandidate> plan_for(const ModelConfig& cfg, const TrainOptions& o,
                               const ClusterSpec& cluster, int devices) {
  PlannerOptions po;
  po.gpus = devices;
  po.global_batch = o.batch * o.grad_accum;
  po.seq = o.seq;
  po.precision = *parse_dtype(o.precision);
  po.top_k = 1;
  TS_ASSIGN_OR_RETURN(PlanSearch s, search_plans(cfg, cluster, po));
  return s.best.at(0);
}

Status run_submit(const SubmitOptions& so) {
  if (so.flavor.empty() == (so.gpus <= 0))
    return error("submit needs --flavor NAME or --gpus N (one of them)",
                 "tessera submit --flavor xlarge.640gb -- train ...; `--flavor x` lists them");
  if (!(so.margin >= 0) || !std::isfinite(so.margin))
    return error("--time-margin must be a fraction >= 0, got " + std::to_string(so.margin));
  if (so.max_requeues < 0)
    return error("--max-requeues must be >= 0, got " + std::to_string(so.max_requeues),
                 "0 never runs a job again after a task died");
  TS_ASSIGN_OR_RETURN(TrainOptions o, parse_train_args(so.args));
  for (const char* flag :
       {"--plan", "--dp", "--tp", "--pp", "--cp", "--cp-order", "--ep", "--zero", "--hsdp"})
    if (has_flag(so.args, flag))
      return error(std::string(flag) + ": submit chooses the plan for the flavor's devices",
                   "drop the plan flags; `tessera simulate` times a plan of your own");
  TS_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(o.model));
  TS_RETURN_IF_ERROR(check_train_options(o, cfg));
  cfg.dtype = *parse_dtype(o.precision);

  const std::string out = std::filesystem::absolute(o.out).string();
  // The #SBATCH --output line is not a shell word (this script does not rely on sbatch's own
  // quoting there), and a '%' is one of Slurm's filename patterns unless doubled. Checked
  // before the plan is searched.
  if (out.find_first_of(" \t\n\"'\\") != std::string::npos)
    return error("--out '" + out +
                     "' holds whitespace, a quote or a backslash, which Slurm's "
                     "#SBATCH --output line does not quote",
                 "choose an --out path without them");
  std::string log_pattern;
  for (char ch : out) log_pattern += ch == '%' ? std::string("%%") : std::string(1, ch);

  // The flavor, or --gpus devices of --cluster.
  TS_ASSIGN_OR_RETURN(std::vector<Flavor> flavors, load_flavors(so.flavors));
  Flavor flavor;
  if (!so.flavor.empty()) {
    TS_ASSIGN_OR_RETURN(flavor, find_flavor(flavors, so.flavor));
  } else {
    flavor.name = std::to_string(so.gpus) + " x " + so.cluster;
    flavor.cluster = so.cluster;
    flavor.devices = so.gpus;
  }
  TS_ASSIGN_OR_RETURN(ClusterSpec cluster, load_cluster(flavor.cluster));
  if (flavor.price_per_hour == 0)
    flavor.price_per_hour = cluster.price_per_device_hour * flavor.devices;
  Result<PlanCandidate> best = plan_for(cfg, o, cluster, flavor.devices);
  if (!best.ok()) {
    // Too small: the smallest flavor of the same cluster the planner finds a plan for.
    for (const Flavor& bigger : flavors)
      if (bigger.cluster == flavor.cluster && bigger.devices > flavor.devices &&
          plan_for(cfg, o, cluster, bigger.devices).ok())
        return error(flavor.name + " cannot train " + cfg.name + ": " + best.status().message(),
                     "the smallest flavor that fits is " + bigger.name + " (" +
                         std::to_string(bigger.devices) + " x " + cluster.device.name + ")");
    return best.status().with_context(flavor.name);
  }
  const PlanCandidate& c = *best;

  // The batch script.
  const int per_node = std::min(flavor.devices, cluster.node.devices);
  const int nodes = cluster.nodes_for(flavor.devices);
  // The predicted steps, a margin, and 15 minutes for start-up, evaluations and checkpoints.
  const double limit = c.sim.step_seconds * static_cast<double>(o.steps) * (1 + so.margin) + 900;
  const std::string plan_path = out + "/plan.json";
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  // The user's flags but the step's split, which the plan chose (--batch x --grad-accum
  // sequences per step either way).
  std::string train = shell_quote(self);
  for (const std::string& a :
       without_flag(without_flag(so.args, "--batch", true), "--grad-accum", true))
    train += " " + shell_quote(a);
  train += " --batch " + std::to_string(c.micro_batch * c.plan.data_group()) + " --grad-accum " +
           std::to_string(c.plan.micro_batches) + " --plan " + shell_quote(plan_path);
  std::string device = flag_value(so.args, "--device");
  if (device.empty()) {
    device = "cuda";
    train += " --device cuda";
  }
  char head[512];
  std::snprintf(head, sizeof head,
                "# tessera submit --flavor %s: %s on %d x %s, predicted %.3f s per step (%s "
                "tokens/s), %lld steps; $%.2f per hour\n",
                flavor.name.c_str(), c.describe().c_str(), flavor.devices,
                cluster.device.name.c_str(), c.sim.step_seconds,
                format_si(c.sim.tokens_per_second).c_str(), (long long)o.steps,
                flavor.price_per_hour);
  std::string script = "#!/bin/bash\n" + std::string(head) + "#SBATCH --job-name=tessera-" +
                       cfg.name + "\n" + "#SBATCH --nodes=" + std::to_string(nodes) + "\n" +
                       "#SBATCH --ntasks-per-node=" + std::to_string(per_node) + "\n";
  if (device != "cpu") script += "#SBATCH --gpus-per-task=1\n";
  script += "#SBATCH --time=" + slurm_time(limit) + "\n" + "#SBATCH --output=" + log_pattern +
            "/slurm-%j.out\n" +
            "#SBATCH --open-mode=append\n"
            "#SBATCH --signal=TERM@120\n"
            "#SBATCH --requeue\n"
            "set -uo pipefail\n"
            "# SIGTERM 120 s before the limit: every rank finishes its step and saves.\n"
            "# A requeued job (a rank or a node died) resumes from the last complete checkpoint.\n"
            "resume=\n";
  if (!o.resume)
    script += "[ -e " + shell_quote(out + "/checkpoints/latest") +
              " ] && resume=--resume\n"
              "# Requeued before its first checkpoint: it starts over, the lost run's records "
              "kept aside.\n"
              "if [ -z \"$resume\" ] && [ \"${SLURM_RESTART_COUNT:-0}\" -gt 0 ] && [ -e " +
              shell_quote(out + "/metrics.jsonl") + " ]; then\n  mv " +
              shell_quote(out + "/metrics.jsonl") + " " +
              shell_quote(out + "/metrics.jsonl.lost-run") + "-$SLURM_RESTART_COUNT\nfi\n";
  script += "srun --kill-on-bad-exit=1 " + train + " $resume\n";
  // The requeue: a task that died (exit code 128 + its signal), not a stop the user or the time
  // limit asked for (SIGTERM, SIGINT) nor an error the run printed (exit code 1).
  const std::string most = std::to_string(so.max_requeues);
  script += R"(rc=$?
# A task died (killed, crashed, its node lost): Slurm runs the job again, at most )" +
            most + R"( times.
runs=${SLURM_RESTART_COUNT:-0}
if [ $rc -gt 128 ] && [ $rc -ne 143 ] && [ $rc -ne 130 ] && [ "$runs" -lt )" +
            most + R"( ]; then
  echo "tessera submit: a task of job $SLURM_JOB_ID ended with exit code $rc (a rank died);" \
       "requeued (restart $((runs + 1)) of at most )" +
            most + R"(): it resumes from the last checkpoint"
  scontrol requeue "$SLURM_JOB_ID" && exit 0
  echo "tessera submit: scontrol requeue failed; the job ends here"
fi
exit $rc
)";
  const std::string plan_json = plan_to_json(c.plan).dump(2) + "\n";
  if (so.dry_run) {
    std::printf("plan (%s):\n%s\nbatch script:\n%s", plan_path.c_str(), plan_json.c_str(),
                script.c_str());
    return Status();
  }
  // Submitting: Slurm must be there.
  std::string found;
  if (run_captured("command -v " + shell_quote(so.sbatch), &found) != 0)
    return error("no Slurm on this machine: `" + so.sbatch + "` is not on PATH",
                 "submit from a Slurm login node (or install Debian's slurm-wlm); --dry-run "
                 "prints the batch script without submitting");
  TS_RETURN_IF_ERROR(make_dirs(out));
  TS_RETURN_IF_ERROR(write_file_atomic(plan_path, plan_json));
  const std::string script_path = out + "/job.sbatch";
  TS_RETURN_IF_ERROR(write_file_atomic(script_path, script));
  std::string said;
  const int rc = run_captured(shell_quote(so.sbatch) + " " + shell_quote(script_path), &said);
  std::smatch m;
  if (rc != 0 || !std::regex_search(said, m, std::regex("Submitted batch job ([0-9]+)")))
    return error("sbatch refused the job (exit code " + std::to_string(rc) + "): " + said,
                 "the script is " + script_path +
                     "; fix what sbatch says (partition, account, "
                     "limits) and submit it again with sbatch, or with tessera submit");
  TS_RETURN_IF_ERROR(record_job({m[1].str(), flavor.name, flavor.devices, flavor.price_per_hour,
                                 out, cfg.name, c.sim.tokens_per_step}));
  std::printf("submitted job %s: %s on %s (%s), predicted %s; batch script %s\n",
              m[1].str().c_str(), cfg.name.c_str(), flavor.name.c_str(), c.describe().c_str(),
              slurm_time(limit).c_str(), script_path.c_str());
  return Status();
}

}  // namespace

void add_submit_command(CLI::App& app) {
  auto o = std::make_shared<SubmitOptions>();
  CLI::App* cmd = app.add_subcommand(
      "submit", "Plan a training run for a flavor's GPUs and submit it to Slurm (sbatch)");
  cmd->add_option("--flavor", o->flavor,
                  "The virtual accelerator to train on (small.80gb ... 48xlarge.30720gb, or one "
                  "of --flavors)");
  cmd->add_option("--gpus", o->gpus, "Instead of --flavor: this many devices of --cluster");
  cmd->add_option("--cluster", o->cluster, "With --gpus: the cluster spec")->capture_default_str();
  cmd->add_option("--flavors", o->flavors, "A TOML file of [[flavor]] sections to add");
  cmd->add_option("--time-margin", o->margin,
                  "The time limit above the predicted steps, as a fraction (plus 15 minutes)")
      ->capture_default_str();
  cmd->add_option("--max-requeues", o->max_requeues,
                  "How many times the job runs again (from its last checkpoint) after a task "
                  "died")
      ->capture_default_str();
  cmd->add_flag("--dry-run", o->dry_run, "Print the plan and the batch script; submit nothing");
  cmd->add_option("--sbatch", o->sbatch, "The submission command")->capture_default_str();
  cmd->add_option("args", o->args, "`train` and its flags, after --");
  cmd->callback([o] { exit_on_error(run_submit(*o)); });
}

}  // namespace tessera
