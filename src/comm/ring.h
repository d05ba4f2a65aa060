// Internal to comm/: the collective algorithms, written against Transport. Each runs
// synchronously on the comm thread and counts the bytes it sends and receives in the RingOp.
//
//   RingOp op{&transport, channel, &members, my_rank, timeout, "all_reduce", &what, &axis, bytes};
//   Status s = ring_all_reduce(op, data, count);   // op.bytes_sent now holds what was sent
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "comm/transport.h"

namespace tessera::detail {

struct RingOp {
  Transport* transport;
  uint64_t channel;
  const std::vector<int>* members;  // world rank of each local rank
  int rank;                         // local rank
  double timeout;                   // seconds to wait for any one step's messages
  const char* kind;                 // "all_reduce", for messages
  const std::string* what;
  const std::string* axis;
  int64_t total_bytes;  // size of the operation, for messages
  // Run the transport's own collectives (Transport::has_collectives) instead of the ring's.
  bool native = false;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;

  int size() const { return static_cast<int>(members->size()); }
};

// Element offsets (n+1 of them) of the n chunks of `count` elements: as even as possible,
// the first count%n chunks one longer.
std::vector<int64_t> ring_chunk_offsets(int64_t count, int n);

Status ring_all_reduce(RingOp& op, float* data, int64_t count);
Status ring_reduce_scatter(RingOp& op, const float* in, float* out, int64_t count);
// Byte-level: every rank contributes `bytes_per_rank` bytes; out holds size() blocks.
Status ring_all_gather(RingOp& op, const void* in, void* out, int64_t bytes_per_rank);
Status chain_broadcast(RingOp& op, void* data, int64_t bytes, int root);
// Pairwise exchange: block j of `in` (bytes_per_rank each) to local rank j, block i of `out`
// from rank i; in step s = 1 .. n-1 rank r sends to r+s and receives from r-s. in != out.
Status pairwise_all_to_all(RingOp& op, const void* in, void* out, int64_t bytes_per_rank);

// The collectives as the operation asks (op.native: the transport's own, where the counts fit
// an int; else the ring's, as above). A native collective counts the bytes the ring would
// have moved, and times out like a ring step, naming the axis instead of a peer.
Status all_reduce_f32(RingOp& op, float* data, int64_t count);
Status reduce_scatter_f32(RingOp& op, const float* in, float* out, int64_t count);
Status all_gather_bytes(RingOp& op, const void* in, void* out, int64_t bytes_per_rank);
Status broadcast_bytes(RingOp& op, void* data, int64_t bytes, int root);

}  // namespace tessera::detail
