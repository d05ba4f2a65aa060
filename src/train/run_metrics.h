// metrics.jsonl of a run directory: one JSON object per line, each with the 0-based "step"
// it records ({"step": 7, "loss": ...} or {"step": 7, "val_loss": ...}).
//
//   TS_ASSIGN_OR_RETURN(std::ofstream m, open_run_metrics(out, o.resume, start_step));
//   m << record.dump() << "\n";
//
// A run that starts from scratch refuses a directory whose metrics.jsonl already holds
// records (they belong to an earlier run, which saved no checkpoint: appending would mix two
// runs). A resumed run first drops the records of steps at or after the checkpoint's step
// (work the checkpoint does not hold, which is now redone) and a cut-off last line of a killed
// writer, so every step is recorded once.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include "base/status.h"

namespace tessera {

// Opens OUT/metrics.jsonl for appending records of steps >= start_step.
Result<std::ofstream> open_run_metrics(const std::string& out, bool resume, int64_t start_step);

// The largest "step" recorded in OUT/metrics.jsonl; -1 when there is no file or no record.
// Lines that are not JSON objects with a numeric "step" are skipped.
int64_t last_recorded_step(const std::string& out);

}  // namespace tessera
