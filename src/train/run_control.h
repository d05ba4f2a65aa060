// What keeps a training run safe to stop and to share a machine with:
//  - stop signals: the first SIGTERM or SIGINT is recorded, so the training loop can finish
//    its step, save a checkpoint and exit 128 + signal; a second one ends the process at once.
//    `tessera launch` passes a stop on to the ranks as SIGUSR1 (for SIGTERM) or SIGUSR2 (for
//    SIGINT), taken the same way but known to be the user's, not the SIGTERM mpirun sends
//    when a rank died (after which a rank waiting on the dead one names it);
//  - the run-directory lock: one run at a time per --out (flock on OUT/.lock, released by
//    the kernel when the holder exits, however it exits);
//  - stale checkpoint staging directories (".tmp-*" under OUT/checkpoints) of killed runs,
//    removed by the next run that holds the lock.
//
//   install_stop_signals();
//   TS_ASSIGN_OR_RETURN(RunDirLock lock, RunDirLock::acquire(out));
//   ...; if (int sig = pending_stop_signal()) { save(); exit(128 + sig); }
#pragma once

#include <string>

#include "base/status.h"

namespace tessera {

void install_stop_signals();
// The first stop signal received (SIGTERM or SIGINT; launch's SIGUSR1/SIGUSR2 as those), 0 if
// none.
int pending_stop_signal();

class RunDirLock {
 public:
  // Errors name the directory and the pid of the run holding it.
  static Result<RunDirLock> acquire(const std::string& dir);
  RunDirLock(RunDirLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  RunDirLock& operator=(RunDirLock&& o) noexcept;
  ~RunDirLock();

 private:
  explicit RunDirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// Removes OUT/checkpoints/.tmp-* (call while holding the lock); returns how many.
Result<int> remove_stale_staging(const std::string& dir);

}  // namespace tessera
