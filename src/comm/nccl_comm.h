// NCCL communicators (CUDA builds, library tessera_comm_nccl): the Communicator interface over
// device memory. Each communicator has a CUDA stream of its own (its comm stream); an operation
// is enqueued on it after the work enqueued so far on the compute stream (an event), and wait()
// makes the compute stream wait for its completion event: the host never blocks, and the
// communication overlaps whatever compute runs in between. bf16/f16 are reduced by NCCL in their
// own type. RCCL has the same API for AMD GPUs.
//
//   TS_ASSIGN_OR_RETURN(auto host, mpi_world(&argc, &argv));
//   TS_ASSIGN_OR_RETURN(auto dev, nccl_world(*host, cuda.stream()));  // unique id over `host`
//   TS_ASSIGN_OR_RETURN(auto dp, dev->split(tp_index, dp_index, "dp"));
//   Request r = dp->all_reduce(grads_on_device, n, DType::bf16, "grad bucket 3");  // enqueued
//   ...enqueue compute...
//   TS_RETURN_IF_ERROR(dp->wait(r));   // the compute stream waits for it; the host does not
//
// Failures: NCCL has no per-operation timeout, so a watchdog thread per process polls every
// operation in flight; one not complete after the timeout, or an asynchronous NCCL error,
// revokes every NCCL communicator of the process (the kernels stuck waiting for a dead peer
// end; each owner aborts its communicator when it releases it) and becomes the process's
// failure, naming the operation, the axis, its size and the ranks, which the next wait (or any
// later operation) returns. Every call runs on the rank's device, whatever thread makes it.
// Not yet: point-to-point (send/recv return an error: NCCL's match by issue order and need
// grouped calls; pipeline messages stay on the host communicator), a timeout on the blocking
// bootstrap (ncclCommInitRank, ncclCommSplit wait for every rank), spans for train --trace.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace tessera {

// The world communicator over the ranks of `host`, each on its own GPU (the calling thread's
// current device): rank 0 makes NCCL's unique id and broadcasts it over `host`. Collective over
// `host`. `compute_stream` (a cudaStream_t: the CUDA backend's stream()) is the stream each
// operation follows and wait() orders; it must outlive the communicator and its splits.
Result<std::unique_ptr<Communicator>> nccl_world(Communicator& host, void* compute_stream);

}  // namespace tessera
