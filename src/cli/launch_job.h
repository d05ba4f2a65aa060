// How `tessera launch` starts a job: the plan check in one process, mpirun as a child, and
// `--elastic`, which starts the job again on the ranks left when a rank dies.
//
// Elastic training keeps what makes the losses those of an uninterrupted run: the global
// micro-batch (--batch, split over the data-parallel ranks) and --grad-accum stay as given,
// so every step sees the same sequences in the same order; the data-parallel degree follows
// the ranks (a plan whose other axes -- --tp, --pp, --hsdp -- do not fit the ranks left runs
// on fewer of them, idling the rest); the run continues from the last complete checkpoint in
// --out. A job that ends with an error it printed (bad input, a diverged loss, a peer timing
// out) is not started again: it would meet the same error.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace tessera {

struct LaunchJob {
  std::string self;               // this tessera binary
  std::string mpirun = "mpirun";  // the MPI launcher
  int ranks = 2;
  std::vector<std::string> args;  // the tessera command and its flags
};

// Whether `mpirun --version` runs: a launcher that is not MPI's (--mpirun /bin/false) is one
// error, not a silent exit.
Status check_mpirun(const std::string& mpirun);

// Runs `args` once with `TESSERA_LAUNCH_CHECK` set to `ranks`: exit 0 when the command's flags
// suit that many ranks (train: they make a plan; calibrate: its device). `quiet` discards
// what it prints.
int check_train_plan(const LaunchJob& job, bool quiet);

// Runs mpirun as a child, in a process group of its own, and returns its exit code (128 +
// signal if a signal ended it). SIGTERM or SIGINT sent to this process (a scheduler, Ctrl-C) is
// passed on to the ranks themselves, not to mpirun, which would kill them before they finish
// the step and save; a second signal is passed on too (the ranks then exit at once).
// `*stopped` records the signal.
int run_mpirun(const LaunchJob& job, int* stopped);

// `launch --elastic`: runs the train job; each time it ends because a rank died (a process
// ended by a signal), starts it again on one rank fewer (never below `min_ranks`), resumed
// from the last checkpoint in --out. Returns the exit code to leave with, or an error.
Result<int> run_elastic(LaunchJob job, int min_ranks);

}  // namespace tessera
