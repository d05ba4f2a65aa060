// `tessera validate`: simulates every published training run the Program can express
// (validation/published_runs.csv) and reports predicted against published, with error
// statistics per source, and every row it cannot model with the reason.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"
#include "cost/cluster_spec.h"
#include "io/toml_config.h"
#include "planner/quality.h"
#include "sim/validation.h"

namespace tessera {

namespace {

struct ValidateOptions {
  std::string csv = TESSERA_VALIDATION_CSV;
  std::string source, cluster_dir;
  bool rows = false, planner = false;
  int threads = 0;
};

// A validation that compared nothing fails (a CI job on a CSV it never read must not pass).
Status nothing_compared(const ValidateOptions& o, const ValidationReport& rep) {
  return error("no row of " + o.csv + " was compared" +
                   (rep.excluded.empty() ? std::string()
                                         : " (" + std::to_string(rep.excluded.size()) +
                                               " not modelled, each listed above with the reason)"),
               "fix the rows' cells the reasons name, or validate another --csv / --source");
}

Status run_validate(const ValidateOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  if (!o.cluster_dir.empty() && !std::filesystem::is_directory(o.cluster_dir))
    return error("--cluster-dir " + o.cluster_dir + " is not a directory",
                 "give the directory holding the edited or calibrated <preset>.toml specs");
  TS_ASSIGN_OR_RETURN(std::vector<PublishedRun> runs, read_published_runs(o.csv));
  int threads = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  ValidationReport rep = validate_runs(runs, threads, o.source, o.cluster_dir);
  if (rep.results.empty() && rep.excluded.empty())
    return error("no rows with source_key '" + o.source + "' in " + o.csv,
                 "run `tessera validate --rows` to see the rows and their source_key");
  if (rep.results.empty() && !o.cluster_dir.empty()) {
    std::string why = rep.excluded.front().reason;  // preferably one naming the directory
    for (const ExcludedRun& e : rep.excluded)
      if (e.reason.find(o.cluster_dir) != std::string::npos) {
        why = e.reason;
        break;
      }
    return error("no row could be simulated with the specs in " + o.cluster_dir + ": " + why,
                 "the directory needs <preset>.toml for the rows' clusters, among " +
                     join_strings(cluster_presets()));
  }
  if (o.planner) {  // the search's quality rather than the simulator's accuracy
    // Rows as they finish (a search of a 500B model takes minutes), then the summary.
    std::fputs(planner_quality_header().c_str(), stdout);
    PlannerQuality q = planner_quality(rep, threads, [&](const PlannerRow& r) {
      if (!o.rows && !planner_row_differs(r)) return;
      std::fputs(format_planner_row(r).c_str(), stdout);
      std::fflush(stdout);
    });
    const std::string all = format_planner_quality(q, false);
    std::fputs(all.substr(all.rfind("auto plan / published plan")).c_str(), stdout);
    if (!rep.excluded.empty()) std::fputs(("\n" + format_excluded(rep)).c_str(), stdout);
    if (q.searched == q.failed) return nothing_compared(o, rep);
    return Status();
  }
  std::fputs(format_report(rep, o.rows).c_str(), stdout);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n%zu rows simulated, %zu not modelled, in %.1f s\n", rep.results.size(),
              rep.excluded.size(), secs);
  if (rep.results.empty()) return nothing_compared(o, rep);
  return Status();
}

}  // namespace

void add_validate_command(CLI::App& app) {
  auto o = std::make_shared<ValidateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "validate", "Compare the simulator with published training runs (error per source)");
  cmd->add_option("--csv", o->csv, "Table of published runs")->capture_default_str();
  cmd->add_option("--source", o->source, "Only rows with this source_key");
  cmd->add_option("--cluster-dir", o->cluster_dir,
                  "Read cluster presets as DIR/<preset>.toml (edited or calibrated specs; "
                  "presets: " +
                      join_strings(cluster_presets()) + ")");
  cmd->add_flag("--rows", o->rows, "Print every simulated row, not just the statistics");
  cmd->add_flag("--planner", o->planner,
                "Instead, search each simulated row's model, cluster, devices and batch with "
                "`plan --auto` and compare its best plan's predicted tokens/s with the published "
                "plan's (rows where they differ; --rows: every row)");
  cmd->add_option("--threads", o->threads, "Rows simulated in parallel (default: all cores)");
  cmd->callback([o] { exit_on_error(run_validate(*o)); });
}

}  // namespace tessera
