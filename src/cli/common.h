// Helpers shared by the subcommands.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include "base/status.h"
#include "comm/communicator.h"

namespace tessera {

// Prints "error: message\nHINT: hint" and exits 1 when `s` is an error.
void exit_on_error(const Status& s);

// This process's world communicator when started by mpirun (or `tessera launch`), with the
// dead-rank reporter installed and messages prefixed by the rank; null otherwise.
Result<std::unique_ptr<Communicator>> join_mpi_job();

}  // namespace tessera
