// Internal to comm/: the point-to-point layer under the ring algorithms (ring.cc). One
// Transport per process (per simulated rank for the in-process one), shared by the comm threads
// of its communicators, which never call it concurrently (communicator.cc serializes the calls,
// idle() excepted). Peers are world ranks; a channel is one communicator (0 is the
// world), so messages of different communicators never match each other. Messages with the
// same (channel, source, destination, tag) are received in the order they were sent.
//
//   Transport::Handle h = t.irecv(channel, left, tag, buf, bytes);
//   Status err;
//   while (t.test(h, &err) == 0) t.idle(++polls);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera::detail {

// Tags below kFirstP2PTag are the collectives' (ring.cc); Communicator::send/recv use
// kFirstP2PTag + their tag (MPI guarantees tags up to 32767).
constexpr int kFirstP2PTag = 32000;

// What a comm thread is blocked on, for the termination reporter (mpi_comm.cc).
struct WaitInfo {
  const char* kind;         // "all_reduce"
  const std::string* what;  // "grad bucket 3"
  const std::string* axis;  // "dp"
  int peer;                 // world rank; -1: the transport's collective (any member)
  bool receiving;           // waiting for data from peer (else: for peer to take our data)
};

class Transport {
 public:
  using Handle = int64_t;
  virtual ~Transport() = default;

  virtual int world_rank() const = 0;
  virtual int world_size() const = 0;
  // First and last calls: when the world communicator is made, and when the last comm thread
  // has ended. `broken`: an operation failed (peers may be
  // dead), so nothing collective may be attempted.
  virtual void start() {}
  virtual void stop(bool broken) {}

  // Post a transfer of `bytes` > 0 bytes; the buffer must stay valid until test() reports
  // completion or abandon() is called.
  virtual Handle isend(uint64_t channel, int peer, int tag, const void* data, int64_t bytes) = 0;
  virtual Handle irecv(uint64_t channel, int peer, int tag, void* data, int64_t bytes) = 0;
  // 1: done; 0: pending; -1: failed with *error (e.g. a message of the wrong size). Done and
  // failed handles are released.
  virtual int test(Handle h, Status* error) = 0;
  // Gives up on a pending transfer after an error; the handle is released.
  virtual void abandon(Handle h) = 0;
  // Called between polls that completed nothing; may sleep briefly.
  virtual void idle(int unproductive_polls) = 0;

  // The channel for the members (world ranks, in order) of a split of `parent`. Collective
  // over the parent's members (all of them call it, negative colors too, which get 0).
  virtual Result<uint64_t> open_channel(uint64_t parent, int64_t split_seq, int color, int key,
                                        const std::vector<int>& members) = 0;

  // A comm thread starts waiting for a peer (w), or no comm thread is waiting (null).
  virtual void note_waiting(const WaitInfo* w) {}

  // The transport's own collectives (MPI's), where it has them: posts one over the members
  // of `channel` and returns its handle, completed through test() like a transfer (abandon()
  // leaves it to the broken process's end). Every member posts the same calls in the same
  // order. all_reduce (in place when in == out) and reduce_scatter sum f32 elements, `count`
  // of them per rank; all_gather and broadcast move `count` bytes per rank. Counts fit an int.
  enum class Collective { all_reduce, reduce_scatter, all_gather, broadcast };
  struct CollectiveCall {
    Collective kind = Collective::all_reduce;
    const void* in = nullptr;
    void* out = nullptr;
    int count = 0;
    int root = 0;  // broadcast: the root's rank in the channel
  };
  virtual bool has_collectives() const { return false; }
  virtual Handle icollective(uint64_t channel, const CollectiveCall& call);
};

}  // namespace tessera::detail
