// `tessera report RUN_DIR [--out DIR]`: a run's curves and plan as an HTML page with PNG
// plots (train/report.h).
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/slurm_jobs.h"
#include "io/fs.h"
#include "train/report.h"

namespace tessera {

namespace {

struct ReportArgs {
  std::string run_dir, out;
  std::string sacct = "sacct";
};

Status run_report(const ReportArgs& a) {
  const std::string out = a.out.empty() ? join_path(a.run_dir, "report") : a.out;
  // A run tessera submit sent: what it has cost, by Slurm's accounting.
  std::vector<std::string> facts;
  Result<std::string> cost = submitted_run_cost(a.run_dir, a.sacct);
  if (!cost.ok())
    std::printf("note: the cost of this Slurm job is unknown: %s\n",
                cost.status().message().c_str());
  else if (!cost->empty())
    facts.push_back("cost: " + *cost);
  TS_ASSIGN_OR_RETURN(RunReport r, write_report(a.run_dir, out, facts));
  for (const std::string& fact : facts) std::printf("%s\n", fact.c_str());
  std::printf("report of %lld training steps and %lld evaluations: %s", (long long)r.steps,
              (long long)r.evals, r.html.c_str());
  for (const std::string& png : r.pngs) std::printf(", %s", base_name(png).c_str());
  std::printf("\n");
  if (r.cut_last_line)
    std::printf("note: the last line of metrics.jsonl was cut off (a killed run); left out\n");
  for (const std::string& note : r.notes) std::printf("note: %s\n", note.c_str());
  return Status();
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "report", "Write a run's loss, learning-rate and throughput curves and its plan as HTML");
  cmd->add_option("run_dir", a->run_dir, "The --out directory of a `tessera train` run")
      ->required();
  cmd->add_option("--out", a->out, "Folder for index.html and the PNGs (default: RUN_DIR/report)");
  cmd->add_option("--sacct", a->sacct,
                  "Slurm's accounting command (the cost of a run tessera submit sent)")
      ->capture_default_str();
  cmd->callback([a] { exit_on_error(run_report(*a)); });
}

}  // namespace tessera
