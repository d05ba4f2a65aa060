// Communicator: the collectives (and point-to-point sends) among the ranks of a distributed
// run — one interface over typed buffers, with implementations chosen by where the buffers live
// (memory()):
//   - host memory (comm/host_comm.cc): each communicator runs its operations in issue order on
//     a background "comm stream" thread of its own, as ring algorithms of ours (comm/ring.cc)
//     over a point-to-point Transport (MPI, or in-process threads for tests), or as the MPI
//     library's own non-blocking collectives (CollectiveAlgo, comm/mpi_comm.h). The collectives
//     of one mesh axis (the tensor-parallel all-reduce on the forward's critical path) never
//     queue behind another's (a gradient bucket of the data axes).
//   - device memory (comm/nccl_comm.h, CUDA builds): NCCL on device streams, ordered after the
//     compute stream's work by events; wait() orders the compute stream, the host never blocks.
//
//   TS_ASSIGN_OR_RETURN(auto world, mpi_world(&argc, &argv));          // comm/mpi_comm.h
//   TS_ASSIGN_OR_RETURN(auto dp, world->split(/*color=*/tp_index, /*key=*/dp_index, "dp"));
//   Request r = dp->all_reduce(grads, n, DType::bf16, "grad bucket 3");  // returns at once
//   ...compute while it runs; leave `grads` untouched...
//   TS_RETURN_IF_ERROR(dp->wait(r));                                    // summed on every rank
//   TS_ASSIGN_OR_RETURN(double loss, dp->all_reduce_scalar(local_loss, /*max=*/false, "loss"));
//
// Element types: f32, bf16 and f16 everywhere, i32 for the operations that only move data
// (all_gather, all_to_all, broadcast, send, recv). The host implementations reduce bf16/f16 in f32
// (widened on the comm thread, narrowed once at the end, so the result is that of an f32 reduction
// rounded once) and move their partial sums as f32; the operations that only move data move
// the stored bytes.
//
// Guarantees: the reduction order is fixed (it depends only on the ranks and the count), so
// results are the same on every run and bitwise identical on every rank. A wait never aborts
// or hangs: a peer that sends nothing for the timeout makes it return an error naming the
// operation, the axis and the (world) rank it waited for. After any error the process's
// communicators are unusable: every later operation fails with that first error.
//
// Chunking (the ring): all_reduce of `count` elements over n ranks splits them into n chunks,
// chunk i holding count/n elements plus one for i < count%n. Bytes sent by each rank (stats();
// e = 4 for reductions, the element size for the rest):
//   all_reduce     2*count*4 - 4*(chunk r + chunk (r+1)%n)   ≈ 2(n-1)/n · B
//   reduce_scatter (n-1)*count*4   (count = per-rank block)    = (n-1)/n · B of the input
//   all_gather     (n-1)*count*e   (count = per-rank block)    = (n-1)/n · B of the output
//   all_to_all     (n-1)*count*e   (count = per-rank block)    = (n-1)/n · B of the input
//   broadcast      count*e on every rank but the last of the chain root, root+1, ..., root-1
//                  (which sends 0): a pipeline of 256 KiB segments
//   barrier        n-1 bytes; all_reduce_scalar 8(n-1) bytes (an all_gather of the values)
// MPI's collectives count the same bytes (what the ring would send; the library picks its own
// algorithm). With size()==1 everything is a local copy and sends 0 bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "base/mem_space.h"
#include "base/status.h"
#include "comm/comm_trace.h"
#include "ir/dtype.h"

namespace tessera {

// Counted per communicator (not per process) since construction or reset_stats(). split()'s
// own exchange is counted on the communicator being split; a new communicator starts at 0.
struct CommStats {
  int64_t bytes_sent = 0;      // payload bytes actually handed to the transport's send
  int64_t bytes_received = 0;  // payload bytes received
  int64_t collectives = 0;     // operations issued, barrier/all_reduce_scalar/split included
  double wait_seconds = 0;     // time callers spent blocked in wait() (and blocking helpers)
};

// One operation in flight; each implementation completes its own kind.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
};
using Request = std::shared_ptr<CommRequest>;

class Communicator {
 public:
  Communicator() = default;
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The axis name given at split ("world" for the root); used in messages.
  virtual const std::string& name() const = 0;
  // The world rank of local rank r (messages always use world ranks).
  virtual int world_rank(int r) const = 0;
  // Where the buffers of this communicator's operations must live (host or device memory).
  virtual MemSpace memory() const = 0;
  // The implementation, for logs: "ring", "mpi" (the MPI library's collectives), "nccl".
  virtual const char* kind() const = 0;

  // Like MPI_Comm_split: ranks with the same color form a sub-communicator, ordered by key
  // (ties by rank here). Collective over this communicator: every rank calls it, in the same
  // order relative to its other operations. A negative color joins no group and yields a null
  // pointer. The new communicator is of the same implementation and runs on a comm stream of
  // its own. Under MPI the split holds the process's transport until every rank has joined,
  // so split all communicators before issuing collectives on them (MeshComms::create does).
  virtual Result<std::unique_ptr<Communicator>> split(int color, int key, std::string name) = 0;

  // Non-blocking collectives, executed in issue order on this communicator's stream. Buffers
  // (in memory()) must stay valid and untouched until wait() returns. `what` names the
  // operation in error messages ("grad bucket 3", "all-gather h.2.mlp.fc.weight").
  Request all_reduce(void* data, int64_t count, DType dtype, std::string what);  // sum, in place
  // in: size()*count; out: count. Rank r receives the sum over ranks of block r.
  Request reduce_scatter(const void* in, void* out, int64_t count, DType dtype, std::string what);
  // in: count; out: size()*count, block r from rank r.
  Request all_gather(const void* in, void* out, int64_t count, DType dtype, std::string what);
  // in: size()*count, block j for rank j; out: size()*count, block i from rank i (expert
  // parallelism's dispatch and combine). in and out must not overlap.
  Request all_to_all(const void* in, void* out, int64_t count, DType dtype, std::string what);
  // Copies root's `count` elements to every rank.
  Request broadcast(void* data, int64_t count, DType dtype, int root, std::string what);

  // Point-to-point, non-blocking: send `count` elements to local rank `peer`, or receive them
  // from it, with a tag in [0, kMaxP2PTag]. Unlike the collectives these run on the
  // communicator's p2p stream, each posted at once and completed in any order (two ranks may
  // send to each other at the same time); messages with the same peer and tag are received in
  // the order they were sent, and sizes must match. A peer that takes (or sends) nothing for
  // the timeout fails the request, naming `what`, the axis and the peer's world rank.
  static constexpr int kMaxP2PTag = 767;
  Request send(const void* data, int64_t count, DType dtype, int peer, int tag, std::string what);
  Request recv(void* data, int64_t count, DType dtype, int peer, int tag, std::string what);

  // f32 conveniences.
  Request all_reduce(float* data, int64_t count, std::string what) {
    return all_reduce(data, count, DType::f32, std::move(what));
  }
  Request reduce_scatter(const float* in, float* out, int64_t count, std::string what) {
    return reduce_scatter(in, out, count, DType::f32, std::move(what));
  }
  Request all_gather(const float* in, float* out, int64_t count, std::string what) {
    return all_gather(in, out, count, DType::f32, std::move(what));
  }
  Request broadcast(float* data, int64_t count, int root, std::string what) {
    return broadcast(data, count, DType::f32, root, std::move(what));
  }
  Request send(const float* data, int64_t count, int peer, int tag, std::string what) {
    return send(data, count, DType::f32, peer, tag, std::move(what));
  }
  Request recv(float* data, int64_t count, int peer, int tag, std::string what) {
    return recv(data, count, DType::f32, peer, tag, std::move(what));
  }

  // Completes the request for the caller's later work and returns its error (timeout, dead
  // peer, mismatched counts across ranks, or an earlier failure), e.g.
  //   rank 0: timed out after 30.0 s in all_reduce 'grad bucket 3' (axis dp, 4 ranks,
  //   1.20 MiB) waiting for data from rank 1
  //   HINT: rank 1 died or is stuck ... — check its log; raise --comm-timeout if it is only slow
  // Host memory: blocks until the operation is done. Device memory: orders the compute stream
  // after it and returns (the host does not wait; a failure found later is returned by a
  // later wait). Waiting again on a finished request returns the same status.
  virtual Status wait(const Request& r) = 0;
  // Whether the operation is done (a host wait would return at once).
  virtual bool test(const Request& r) const = 0;
  // Blocking conveniences (the host waits, whatever memory()).
  virtual Status barrier(std::string what) = 0;
  // Sum (or max) of one double over the ranks; the same bits on every rank.
  virtual Result<double> all_reduce_scalar(double x, bool max, std::string what) = 0;

  virtual CommStats stats() const = 0;
  virtual void reset_stats() = 0;
  // Seconds a collective may wait for any one message before failing; default 60. Applies
  // to operations issued after the call.
  virtual void set_timeout(double seconds) = 0;
  virtual double timeout() const = 0;
  // Reports each operation issued from now on to `sink` (null: stop) with the span its comm
  // stream ran it in (comm/comm_trace.h). Host communicators do; the default reports nothing
  // (NCCL's spans would need device events: not yet).
  virtual void set_trace_sink(CommTraceSink* sink) { (void)sink; }

 protected:
  // What the implementations provide; the public operations check their arguments (counts,
  // element types, root, peer and tag) first, so these may assume them valid.
  virtual Request do_all_reduce(void* data, int64_t count, DType dtype, std::string what) = 0;
  virtual Request do_reduce_scatter(const void* in, void* out, int64_t count, DType dtype,
                                    std::string what) = 0;
  virtual Request do_all_gather(const void* in, void* out, int64_t count, DType dtype,
                                std::string what) = 0;
  virtual Request do_all_to_all(const void* in, void* out, int64_t count, DType dtype,
                                std::string what) = 0;
  virtual Request do_broadcast(void* data, int64_t count, DType dtype, int root,
                               std::string what) = 0;
  virtual Request do_p2p(bool receiving, void* data, int64_t count, DType dtype, int peer, int tag,
                         std::string what) = 0;

 private:
  void check_p2p(int64_t count, int peer, int tag, const std::string& what) const;
};

}  // namespace tessera
