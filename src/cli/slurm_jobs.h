// The jobs `tessera submit` sent to Slurm from this machine, as `tessera jobs` and `tessera
// cancel` see them: a registry of one JSON line per submission ($TESSERA_JOBS_FILE, else
// ~/.tessera/jobs.jsonl) with what Slurm does not keep (the flavor, its price, the run
// directory), and Slurm's own accounting (sacct) for the state and elapsed time.
//
//   TS_RETURN_IF_ERROR(record_job({"4242", "xlarge.640gb", 8, 98.3, "/runs/a", "llama3-8b",
//                                  131072}));
#pragma once

#include <cstdint>
#include <string>
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

// Slurm's elapsed time ("[D-]HH:MM:SS", "MM:SS" or "MM:SS.mmm") in seconds; -1 if unreadable.
double slurm_elapsed_seconds(const std::string& text);

}  // namespace tessera
