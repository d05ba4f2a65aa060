// Communicator: f32 collectives (and point-to-point sends) among the ranks of a distributed run,
// implemented by us as ring algorithms (comm/ring.cc) over a point-to-point Transport (MPI, or
// in-process threads for tests). Operations are non-blocking: each communicator runs its operations
// in issue order on a background "comm stream" thread of its own, so the collectives of one mesh
// axis (the tensor-parallel all-reduce on the forward's critical path) never queue behind another's
// (a gradient bucket of the data axes). A process's comm threads share its transport.
//
//   TS_ASSIGN_OR_RETURN(auto world, mpi_world(&argc, &argv));          // comm/mpi_comm.h
//   TS_ASSIGN_OR_RETURN(auto dp, world->split(/*color=*/tp_index, /*key=*/dp_index, "dp"));
//   Request r = dp->all_reduce(grads, n, "grad bucket 3");              // returns at once
//   ...compute while it runs; leave `grads` untouched...
//   TS_RETURN_IF_ERROR(dp->wait(r));                                    // summed on every rank
//   TS_ASSIGN_OR_RETURN(double loss, dp->all_reduce_scalar(local_loss, /*max=*/false, "loss"));
//
// Guarantees: the reduction order is fixed (it depends only on the ranks and the count), so
// results are the same on every run and bitwise identical on every rank. A wait never aborts
// or hangs: a peer that sends nothing for the timeout makes it return an error naming the
// operation, the axis and the (world) rank it waited for. After any error the process's
// communicators are unusable: every later operation fails with that first error.
//
// Chunking: all_reduce of `count` elements over n ranks splits them into n chunks, chunk i
// holding count/n elements plus one for i < count%n. Bytes sent by each rank (stats()):
//   all_reduce     2*count*4 - 4*(chunk r + chunk (r+1)%n)   ≈ 2(n-1)/n · B
//   reduce_scatter (n-1)*count*4   (count = per-rank block)    = (n-1)/n · B of the input
//   all_gather     (n-1)*count*4   (count = per-rank block)    = (n-1)/n · B of the output
//   broadcast      count*4 on every rank but the last of the chain root, root+1, ..., root-1
//                  (which sends 0): a pipeline of 256 KiB segments
//   barrier        n-1 bytes; all_reduce_scalar 8(n-1) bytes (an all_gather of the values)
// With size()==1 everything is a local copy and sends 0 bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera {

// Counted per communicator (not per process) since construction or reset_stats(). split()'s
// own exchange is counted on the communicator being split; a new communicator starts at 0.
struct CommStats {
  int64_t bytes_sent = 0;      // payload bytes actually handed to the transport's send
  int64_t bytes_received = 0;  // payload bytes received
  int64_t collectives = 0;     // operations issued, barrier/all_reduce_scalar/split included
  double wait_seconds = 0;     // time callers spent blocked in wait() (and blocking helpers)
};

class CommRequest;  // opaque; completed by the comm thread
using Request = std::shared_ptr<CommRequest>;

class Communicator;
namespace detail {
struct CommState;  // one communicator's ranks, channel, stats; defined in communicator.cc
class Transport;   // comm/transport.h
Transport* transport_of(const Communicator& comm);
}  // namespace detail

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  // The axis name given at split ("world" for the root); used in messages.
  const std::string& name() const;
  // The world rank of local rank r (messages always use world ranks).
  int world_rank(int r) const;

  // Like MPI_Comm_split: ranks with the same color form a sub-communicator, ordered by key
  // (ties by rank here). Collective over this communicator: every rank calls it, in the same
  // order relative to its other operations. A negative color joins no group and yields a null
  // pointer. The new communicator has a comm thread of its own and shares this one's
  // transport. Under MPI the split holds the process's transport until every rank has joined,
  // so split all communicators before issuing collectives on them (MeshComms::create does).
  virtual Result<std::unique_ptr<Communicator>> split(int color, int key, std::string name) = 0;

  // Non-blocking f32 collectives, executed in issue order on this communicator's comm thread.
  // Buffers must stay valid and untouched until wait() returns. `what` names the operation
  // in error messages ("grad bucket 3", "all-gather h.2.mlp.fc.weight").
  Request all_reduce(float* data, int64_t count, std::string what);  // sum, in place
  // in: size()*count; out: count. Rank r receives the sum over ranks of block r.
  Request reduce_scatter(const float* in, float* out, int64_t count, std::string what);
  // in: count; out: size()*count, block r from rank r.
  Request all_gather(const float* in, float* out, int64_t count, std::string what);
  // Copies root's `count` elements to every rank.
  Request broadcast(float* data, int64_t count, int root, std::string what);

  // Point-to-point, non-blocking: send `count` floats to local rank `peer`, or receive them
  // from it, with a tag in [0, kMaxP2PTag]. Unlike the collectives these run on the
  // communicator's p2p stream, each posted at once and completed in any order (two ranks may
  // send to each other at the same time); messages with the same peer and tag are received in
  // the order they were sent, and sizes must match. A peer that takes (or sends) nothing for
  // the timeout fails the request, naming `what`, the axis and the peer's world rank.
  static constexpr int kMaxP2PTag = 767;
  Request send(const float* data, int64_t count, int peer, int tag, std::string what);
  Request recv(float* data, int64_t count, int peer, int tag, std::string what);

  // Blocks until the request is done; returns its error (timeout, dead peer, mismatched
  // counts across ranks, or an earlier failure), e.g.
  //   rank 0: timed out after 30.0 s in all_reduce 'grad bucket 3' (axis dp, 4 ranks,
  //   1.20 MiB) waiting for data from rank 1
  //   HINT: rank 1 died or is stuck ... — check its log; raise --comm-timeout if it is only slow
  // Waiting again on a finished request returns the same status.
  Status wait(const Request& r);
  // Whether the request is done (wait() would return at once).
  bool test(const Request& r) const;
  // Blocking conveniences.
  Status barrier(std::string what);
  // Sum (or max) of one double over the ranks; the same bits on every rank.
  Result<double> all_reduce_scalar(double x, bool max, std::string what);

  CommStats stats() const;
  void reset_stats();
  // Seconds a collective may wait for any one message before failing; default 60. Applies
  // to operations issued after the call.
  void set_timeout(double seconds);
  double timeout() const;

 protected:
  friend detail::Transport* detail::transport_of(const Communicator& comm);
  explicit Communicator(std::shared_ptr<detail::CommState> state);
  Request p2p(bool receiving, float* data, int64_t count, int peer, int tag, std::string what);
  std::shared_ptr<detail::CommState> state_;
};

}  // namespace tessera
