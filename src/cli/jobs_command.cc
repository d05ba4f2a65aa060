// `tessera jobs` and `tessera cancel JOB`: the training jobs `tessera submit` sent to Slurm
// from this machine (cli/slurm_jobs.h), with their state and elapsed time from Slurm's
// accounting (sacct), the step each reached and its tokens/s (its metrics.jsonl), and what it
// has cost: device-hours used (elapsed x devices) at the flavor's price, and dollars per
// million tokens trained. cancel asks a job's ranks to stop as SIGTERM does (scancel
// --signal=TERM): they finish the step and save a checkpoint.
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/format.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/slurm_jobs.h"

namespace tessera {
namespace {

struct JobsOptions {
  std::string sacct = "sacct";
  std::string scancel = "scancel";
  std::string job;  // cancel's
};

Status run_jobs(const JobsOptions& o) {
  TS_ASSIGN_OR_RETURN(std::vector<SubmittedJob> jobs, recorded_jobs());
  if (jobs.empty()) {
    std::printf("no jobs submitted from here (%s)\n", jobs_file().c_str());
    return Status();
  }
  std::vector<std::string> ids;
  for (const SubmittedJob& j : jobs) ids.push_back(j.id);
  TS_ASSIGN_OR_RETURN(auto used, slurm_usage(o.sacct, ids));
  std::printf("%-10s %-18s %-14s %-11s %4s %6s %10s %12s %10s %12s\n", "job", "model", "flavor",
              "state", "runs", "step", "tokens/s", "GPU-hours", "cost $", "$/M tokens");
  for (const SubmittedJob& j : jobs) {
    const JobUsage u = used.count(j.id) ? used.at(j.id) : JobUsage{};
    const auto [step, rate] = last_training_record(j.out);
    const JobCost c = job_cost(j, u, static_cast<double>(step + 1) * j.tokens_per_step);
    char per_million[32] = "-";
    if (c.per_million_tokens >= 0)
      std::snprintf(per_million, sizeof per_million, "%.4f", c.per_million_tokens);
    std::printf("%-10s %-18s %-14s %-11s %4d %6s %10s %12.4f %10.4f %12s\n", j.id.c_str(),
                j.model.c_str(), j.flavor.c_str(), u.state.c_str(), u.runs,
                step >= 0 ? std::to_string(step + 1).c_str() : "-",
                rate > 0 ? format_si(rate).c_str() : "-", c.device_hours, c.dollars, per_million);
  }
  return Status();
}

Status run_cancel(const JobsOptions& o) {
  TS_ASSIGN_OR_RETURN(std::vector<SubmittedJob> jobs, recorded_jobs());
  bool ours = false;
  for (const SubmittedJob& j : jobs) ours = ours || j.id == o.job;
  if (!ours)
    return error("job " + o.job + " was not submitted from here (" + jobs_file() + ")",
                 "`tessera jobs` lists the jobs tessera submit sent; scancel stops any other");
  std::string said;
  const int rc =
      run_captured(shell_quote(o.scancel) + " --signal=TERM " + shell_quote(o.job), &said);
  if (rc != 0) return error("scancel refused (exit code " + std::to_string(rc) + "): " + said);
  std::printf(
      "asked job %s to stop: its ranks finish the step and save a checkpoint; `tessera "
      "jobs` shows when it has ended\n",
      o.job.c_str());
  return Status();
}

}  // namespace

void add_jobs_commands(CLI::App& app) {
  auto o = std::make_shared<JobsOptions>();
  CLI::App* jobs = app.add_subcommand(
      "jobs", "The training jobs tessera submit sent to Slurm: state, step, tokens/s and cost");
  jobs->add_option("--sacct", o->sacct, "Slurm's accounting command")->capture_default_str();
  jobs->callback([o] { exit_on_error(run_jobs(*o)); });
  CLI::App* cancel = app.add_subcommand(
      "cancel", "Stop a submitted job as SIGTERM does: its ranks finish the step and save");
  cancel->add_option("job", o->job, "The job id (tessera jobs lists them)")->required();
  cancel->add_option("--scancel", o->scancel, "Slurm's cancel command")->capture_default_str();
  cancel->callback([o] { exit_on_error(run_cancel(*o)); });
}

}  // namespace tessera
