// Helpers shared by the subcommands.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "comm/communicator.h"

namespace tessera {

// Runs a shell command; returns its exit code (128 + signal when one ended it, -1 when it could
// not start) and puts its output, stdout and stderr, in *out.
int run_captured(const std::string& command, std::string* out);
// `s` as one word of a POSIX shell command (quoted where it must be).
std::string shell_quote(const std::string& s);

// A command line's flags, as another command passes them on.
// The value of `--name` ("--name V" or "--name=V"); "" when absent.
std::string flag_value(const std::vector<std::string>& args, const std::string& name);
// Whether `--name` (or `--name=V`) is among `args`.
bool has_flag(const std::vector<std::string>& args, const std::string& name);
// `args` without `--name` (and its value, when it takes one).
std::vector<std::string> without_flag(const std::vector<std::string>& args, const std::string& name,
                                      bool takes_value);

// Prints "error: message\nHINT: hint" and exits 1 when `s` is an error.
void exit_on_error(const Status& s);

// This process's world communicator when started by mpirun (or `tessera launch`), with the
// dead-rank reporter installed and messages prefixed by the rank; null otherwise. `collectives`
// is the --collectives flag: auto, ring or mpi (comm/host_comm.h).
Result<std::unique_ptr<Communicator>> join_mpi_job(const std::string& collectives = "auto");

// The help text of --collectives, shared by the commands that take it.
extern const char* const kCollectivesHelp;

// The device communicator of a job's ranks on `device` (TrainJob::device_world): NCCL when
// every rank of every node has a GPU of its own; null — the collectives staged through host
// memory over `world` — when ranks share GPUs, for host backends and for one rank. Collective
// over `world`; rank 0 says which on stderr.
Result<std::unique_ptr<Communicator>> open_device_comms(Communicator& world, Backend* device);

// --device against this build and this machine: a name that is not a device, or cuda without
// the CUDA backend or a device, is an error.
Status check_device(const std::string& device);
// The backend --device names: null for cpu (the caller's own CPU backend); for cuda the CUDA
// backend on this rank's GPU: its rank on this node (the launcher's local rank, 0 outside a
// job) modulo the node's GPUs, so ranks share GPUs when there are more ranks than GPUs.
Result<std::unique_ptr<Backend>> open_device(const std::string& device);
// A backend's device in words, e.g. "NVIDIA H100 80GB HBM3 (sm_90)".
std::string device_description(const Backend& b);

}  // namespace tessera
