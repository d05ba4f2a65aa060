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

// The last training record of a run: its step (0-based) and tokens/s (or images/s); -1 and 0
// when it has none yet.
std::pair<int64_t, double> last_record(const std::string& out) {
  std::ifstream f(out + "/metrics.jsonl");
  std::string line;
  int64_t step = -1;
  double rate = 0;
  while (std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("loss") || !j.contains("step")) continue;
    if (!j["step"].is_number_integer()) continue;
    step = j["step"].get<int64_t>();
    for (const char* key : {"tokens_per_s", "images_per_s"})
      if (j.contains(key) && j[key].is_number()) rate = j[key].get<double>();
  }
  return {step, rate};
}

Status run_jobs(const JobsOptions& o) {
  TS_ASSIGN_OR_RETURN(std::vector<SubmittedJob> jobs, recorded_jobs());
  if (jobs.empty()) {
    std::printf("no jobs submitted from here (%s)\n", jobs_file().c_str());
    return Status();
  }
  std::string ids;
  for (const SubmittedJob& j : jobs) ids += (ids.empty() ? "" : ",") + j.id;
  std::string said;
  // -D: a requeued job's every run (its earlier runs used the devices too), oldest first.
  const int rc = run_captured(shell_quote(o.sacct) + " -X -D --noheader --parsable2 -j " + ids +
                                  " --format=JobID,State,Elapsed",
                              &said);
  if (rc != 0)
    return error("Slurm's accounting (`" + o.sacct + "`) failed (exit code " + std::to_string(rc) +
                     "): " + said,
                 "run tessera jobs where Slurm's sacct works (its accounting storage enabled)");
  struct Used {
    std::string state;   // the last run's
    double seconds = 0;  // every run's elapsed time
    int runs = 0;
  };
  std::map<std::string, Used> used;
  std::istringstream lines(said);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t a = line.find('|'), b = line.find('|', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    Used& u = used[line.substr(0, a)];
    u.state = line.substr(a + 1, b - a - 1);
    u.seconds += std::max(slurm_elapsed_seconds(line.substr(b + 1)), 0.0);
    ++u.runs;
  }
  std::printf("%-10s %-18s %-14s %-11s %4s %6s %10s %12s %10s %12s\n", "job", "model", "flavor",
              "state", "runs", "step", "tokens/s", "GPU-hours", "cost $", "$/M tokens");
  for (const SubmittedJob& j : jobs) {
    const auto it = used.find(j.id);
    const Used u = it == used.end() ? Used{"UNKNOWN", 0, 0} : it->second;
    const auto [step, rate] = last_record(j.out);
    const double gpu_hours = u.seconds / 3600 * j.devices;
    const double cost = u.seconds / 3600 * j.price_per_hour;
    const double tokens = static_cast<double>(step + 1) * j.tokens_per_step;
    char per_million[32] = "-";
    if (tokens > 0 && j.price_per_hour > 0)
      std::snprintf(per_million, sizeof per_million, "%.4f", cost / tokens * 1e6);
    std::printf("%-10s %-18s %-14s %-11s %4d %6s %10s %12.4f %10.4f %12s\n", j.id.c_str(),
                j.model.c_str(), j.flavor.c_str(), u.state.c_str(), u.runs,
                step >= 0 ? std::to_string(step + 1).c_str() : "-",
                rate > 0 ? format_si(rate).c_str() : "-", gpu_hours, cost, per_million);
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
