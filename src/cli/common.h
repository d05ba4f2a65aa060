// Helpers shared by the subcommands.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "base/status.h"
#include "comm/communicator.h"

namespace tessera {

// Prints "error: message\nHINT: hint" and exits 1 when `s` is an error.
void exit_on_error(const Status& s);

// This process's world communicator when started by mpirun (or `tessera launch`), with the
// dead-rank reporter installed and messages prefixed by the rank; null otherwise.
Result<std::unique_ptr<Communicator>> join_mpi_job();

// --device against this build, this machine and the run: a name that is not a device, cuda
// without the CUDA backend or a device, or cuda for several ranks is an error.
Status check_device(const std::string& device, bool distributed);
// The backend --device names: null for cpu (the caller's own CPU backend), the CUDA backend on
// GPU 0 for cuda.
Result<std::unique_ptr<Backend>> open_device(const std::string& device, bool distributed);
// A backend's device in words, e.g. "NVIDIA H100 80GB HBM3 (sm_90)".
std::string device_description(const Backend& b);

}  // namespace tessera
