// The jobs `tessera submit` sent to Slurm from this machine, as `tessera jobs` and `tessera
// cancel` see them: a registry of one JSON line per submission ($TESSERA_JOBS_FILE, else
// ~/.tessera/jobs.jsonl) with what Slurm does not keep (the flavor, its price, the run
// directory), and Slurm's own accounting (sacct) for the state and elapsed time.
//
//   TS_RETURN_IF_ERROR(record_job({"4242", "xlarge.640gb", 8, 98.3, "/runs/a", "llama3-8b",
//                                  131072}));
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace tessera {

struct SubmittedJob {
  std::string id;      // Slurm's job id
  std::string flavor;  // "xlarge.640gb", or "16 x dgx-h100"
  int devices = 0;
  double price_per_hour = 0;  // dollars per hour of the whole flavor
  std::string out;            // the run directory (metrics.jsonl, checkpoints)
  std::string model;
  double tokens_per_step = 0;  // sequences x tokens per step (images: images)
};

// The registry's path: $TESSERA_JOBS_FILE, else $HOME/.tessera/jobs.jsonl.
std::string jobs_file();
// Appends one submission to the registry.
Status record_job(const SubmittedJob& job);
// Every submission recorded, oldest first (none when the file does not exist).
Result<std::vector<SubmittedJob>> recorded_jobs();

// What a job used, by Slurm's accounting: every run of it (a requeued job runs again).
struct JobUsage {
  // The last run's: Slurm's (COMPLETED, RUNNING, FAILED, ...), or STOPPED when its ranks
  // stopped on SIGTERM or SIGINT with a checkpoint (tessera cancel; Slurm says FAILED).
  std::string state = "UNKNOWN";
  double seconds = 0;  // elapsed, every run together
  int runs = 0;
};
// The usage of each job in `ids` that `sacct` (the command) knows, by job id.
Result<std::map<std::string, JobUsage>> slurm_usage(const std::string& sacct,
                                                    const std::vector<std::string>& ids);

// What a job has cost: device-hours used, dollars at its flavor's price, and dollars per
// million tokens over `tokens` trained (-1 when none were, or the flavor has no price).
struct JobCost {
  double device_hours = 0, dollars = 0, per_million_tokens = -1;
};
JobCost job_cost(const SubmittedJob& job, const JobUsage& used, double tokens);

// The last training record of a run directory's metrics.jsonl: its step (0-based) and tokens/s
// (or images/s); -1 and 0 when it has none yet.
std::pair<int64_t, double> last_training_record(const std::string& out);

// The cost of the run in `run_dir` when `tessera submit` sent it (the registry names its
// directory), as one line: "job 42 on xlarge.640gb (2 runs, COMPLETED): 3.2 GPU-hours, $39.33,
// $0.0120 per million tokens"; "" for a run submit did not send.
Result<std::string> submitted_run_cost(const std::string& run_dir, const std::string& sacct);

// Slurm's elapsed time ("[D-]HH:MM:SS", "MM:SS" or "MM:SS.mmm") in seconds; -1 if unreadable.
double slurm_elapsed_seconds(const std::string& text);

}  // namespace tessera
