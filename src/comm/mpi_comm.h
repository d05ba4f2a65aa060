// Communicators over MPI: one process per rank, started by mpirun. MPI_Init_thread happens in
// mpi_world(); later MPI calls are made by the comm threads, one at a time; MPI_Finalize happens
// when the world communicator and every communicator split from it have been destroyed (skipped
// after a failed collective, when peers may be dead: the launcher then ends the job).
//
//   int main(int argc, char** argv) {
//     if (launched_by_mpirun()) {
//       auto world = mpi_world(&argc, &argv);
//       if (!world.ok()) { std::fprintf(stderr, "%s\n", world.status().to_string().c_str()); return
//       1; } install_termination_reporter();
//       (*world)->set_timeout(flags.comm_timeout);
//       ...train...
//     }
//   }
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "comm/host_comm.h"

namespace tessera {

// True when this process was started by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
// PMIX_RANK set), or by srun as one task of several (SLURM_STEP_NUM_TASKS > 1; not run here).
bool launched_by_mpirun();

// Initializes MPI (requesting MPI_THREAD_MULTIPLE; an error if the library does not provide
// it) and returns the world communicator, whose collectives (and those of every communicator
// split from it) run `algo` (comm/host_comm.h). Call at most once per process.
Result<std::unique_ptr<Communicator>> mpi_world(int* argc, char*** argv,
                                                CollectiveAlgo algo = kDefaultCollectiveAlgo);

// Installs SIGTERM/SIGINT handlers for when the launcher kills this rank (typically because
// another rank died). The handler writes one line to stderr naming this rank, the collective
// a comm thread was blocked in and the peer it waited for, e.g.
//   tessera: rank 2 got a termination signal while waiting in all_reduce 'grad bucket 1'
//   (axis dp) for data from rank 1 — if the job ends now, rank 1 (or a rank it waits for)
//   probably died; see the launcher's message
// and exits with 128 + the signal number (143 for SIGTERM). Call after mpi_world().
void install_termination_reporter();

// Async-signal-safe: writes that line to stderr if a comm thread is waiting in a collective
// now, nothing otherwise. For a handler that replaces the reporter's (a training run that
// stops gracefully on SIGTERM), so that a rank stuck behind a dead peer still says so.
void write_collective_wait();

}  // namespace tessera
