// Ring collectives over a Transport. Rank r sends to r+1 and receives from r-1 (mod n).
//
// reduce-scatter, step s = 0..n-2: send chunk (r-s-1), receive chunk (r-s-2) and add our
//   own contribution to it. Chunk c is therefore summed in the fixed order
//   ((x[c+1] + x[c+2]) + ...) + x[c], ending complete on rank c.
// all-gather, step s = 0..n-2: send chunk (r-s), receive chunk (r-s-1) into place. Every
//   rank ends with the bits computed by the chunk's owner.
// all_reduce = reduce-scatter + all-gather. Chunks of zero length are skipped by both sides
// (both compute the same chunking), so count < n and count == 0 work.
#include "comm/ring.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>

#include "base/check.h"
#include "base/format.h"

namespace tessera::detail {

std::vector<int64_t> ring_chunk_offsets(int64_t count, int n) {
  std::vector<int64_t> off(n + 1, 0);
  const int64_t base = count / n, rem = count % n;
  for (int i = 0; i < n; ++i) off[i + 1] = off[i] + base + (i < rem ? 1 : 0);
  return off;
}

namespace {

constexpr int kMaxTag = kFirstP2PTag;             // the rest are point-to-point tags
constexpr int64_t kBroadcastSegment = 256 << 10;  // bytes
constexpr size_t kMaxPendingSends = 8;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int mod(int a, int n) { return ((a % n) + n) % n; }

struct Xfer {
  Transport::Handle handle;
  int peer;  // world rank
  bool receiving;
  int64_t bytes;
  bool done = false;
};

Status timeout_error(const RingOp& op, const Xfer& x, double waited) {
  char head[160];
  std::snprintf(head, sizeof head, "rank %d: timed out after %.1f s in %s '",
                (*op.members)[op.rank], waited, op.kind);
  std::string msg = head + *op.what + "' (axis " + *op.axis + ", " + std::to_string(op.size()) +
                    " ranks, " + format_bytes(static_cast<double>(op.total_bytes)) + ") ";
  if (x.peer < 0) {  // the transport's collective: any member may be the one missing
    std::string members;
    for (int i = 0; i < op.size(); ++i)
      if (i != op.rank) members += (members.empty() ? "" : ", ") + std::to_string((*op.members)[i]);
    msg += "waiting in the MPI library's collective with ranks " + members;
    return error(msg,
                 "one of them died or is stuck (or is itself waiting for a rank that did) "
                 "— check their logs; raise --comm-timeout if it is only slow");
  }
  const std::string peer = "rank " + std::to_string(x.peer);
  msg += x.receiving ? "waiting for data from " + peer : "waiting for " + peer + " to take data";
  return error(msg, peer +
                        " died or is stuck (or is itself waiting for a rank that did) — "
                        "check its log; raise --comm-timeout if it is only slow");
}

// Polls until every transfer is done; on failure or timeout abandons the rest.
Status wait_all(RingOp& op, Xfer* x, int k) {
  if (k == 0) return Status();
  const Xfer* shown = nullptr;
  for (int i = 0; i < k && !shown; ++i)
    if (x[i].receiving) shown = &x[i];
  if (!shown) shown = &x[0];
  WaitInfo info{op.kind, op.what, op.axis, shown->peer, shown->receiving};
  op.transport->note_waiting(&info);

  const double start = now_seconds();
  int idle_polls = 0;
  Status result;
  for (;;) {
    bool all_done = true, progressed = false;
    for (int i = 0; i < k; ++i) {
      if (x[i].done) continue;
      Status err;
      int r = op.transport->test(x[i].handle, &err);
      if (r < 0) {
        x[i].done = true;  // released by the transport
        const std::string with = x[i].peer < 0
                                     ? std::string("in the MPI library's collective")
                                     : "exchanging with rank " + std::to_string(x[i].peer);
        result =
            error("rank " + std::to_string((*op.members)[op.rank]) + ": " + op.kind + " '" +
                      *op.what + "' (axis " + *op.axis + ") failed " + with + ": " + err.message(),
                  err.hint());
        break;
      }
      if (r > 0) {
        x[i].done = true;
        progressed = true;
        if (x[i].receiving) op.bytes_received += x[i].bytes;
      } else {
        all_done = false;
      }
    }
    if (!result.ok()) break;
    if (all_done) break;
    const double waited = now_seconds() - start;
    if (waited > op.timeout) {
      for (int i = 0; i < k; ++i)
        if (!x[i].done && x[i].receiving) {
          result = timeout_error(op, x[i], waited);
          break;
        }
      if (result.ok())
        for (int i = 0; i < k; ++i)
          if (!x[i].done) {
            result = timeout_error(op, x[i], waited);
            break;
          }
      break;
    }
    idle_polls = progressed ? 0 : idle_polls + 1;
    op.transport->idle(idle_polls);
  }
  if (!result.ok())
    for (int i = 0; i < k; ++i)
      if (!x[i].done) op.transport->abandon(x[i].handle);
  op.transport->note_waiting(nullptr);
  return result;
}

Xfer post_recv(RingOp& op, int from_local, int tag, void* buf, int64_t bytes) {
  const int peer = (*op.members)[from_local];
  return Xfer{op.transport->irecv(op.channel, peer, tag % kMaxTag, buf, bytes), peer, true, bytes};
}

Xfer post_send(RingOp& op, int to_local, int tag, const void* buf, int64_t bytes) {
  const int peer = (*op.members)[to_local];
  op.bytes_sent += bytes;
  return Xfer{op.transport->isend(op.channel, peer, tag % kMaxTag, buf, bytes), peer, false, bytes};
}

// One ring step: receive `rbytes` from the left neighbour while sending `sbytes` to the right.
Status exchange(RingOp& op, int tag, const void* sbuf, int64_t sbytes, void* rbuf, int64_t rbytes) {
  const int n = op.size();
  Xfer x[2];
  int k = 0;
  if (rbytes > 0) x[k++] = post_recv(op, mod(op.rank - 1, n), tag, rbuf, rbytes);
  if (sbytes > 0) x[k++] = post_send(op, mod(op.rank + 1, n), tag, sbuf, sbytes);
  return wait_all(op, x, k);
}

// The all-gather phase over chunks at byte offsets off[0..n] of `base`: on entry this rank's
// chunk is in place; on exit all are.
Status gather_phase(RingOp& op, uint8_t* base, const std::vector<int64_t>& off, int tag0) {
  const int n = op.size(), r = op.rank;
  for (int s = 0; s < n - 1; ++s) {
    const int sc = mod(r - s, n), rc = mod(r - s - 1, n);
    TS_RETURN_IF_ERROR(exchange(op, tag0 + s, base + off[sc], off[sc + 1] - off[sc], base + off[rc],
                                off[rc + 1] - off[rc]));
  }
  return Status();
}

}  // namespace

Status ring_all_reduce(RingOp& op, float* data, int64_t count) {
  const int n = op.size(), r = op.rank;
  if (n == 1 || count == 0) return Status();
  const std::vector<int64_t> off = ring_chunk_offsets(count, n);
  std::vector<float> tmp(off[1] - off[0]);  // the first chunk is the longest
  for (int s = 0; s < n - 1; ++s) {
    const int sc = mod(r - s - 1, n), rc = mod(r - s - 2, n);
    const int64_t rlen = off[rc + 1] - off[rc];
    TS_RETURN_IF_ERROR(
        exchange(op, s, data + off[sc], (off[sc + 1] - off[sc]) * 4, tmp.data(), rlen * 4));
    float* dst = data + off[rc];
    for (int64_t i = 0; i < rlen; ++i) dst[i] = tmp[i] + dst[i];
  }
  std::vector<int64_t> off_bytes(off);
  for (auto& o : off_bytes) o *= 4;
  return gather_phase(op, reinterpret_cast<uint8_t*>(data), off_bytes, n - 1);
}

Status ring_reduce_scatter(RingOp& op, const float* in, float* out, int64_t count) {
  const int n = op.size(), r = op.rank;
  if (n == 1) {
    if (count > 0 && in != out) std::memmove(out, in, count * 4);
    return Status();
  }
  if (count == 0) return Status();
  std::vector<float> tmp(count), acc(count);
  for (int s = 0; s < n - 1; ++s) {
    const int sc = mod(r - s - 1, n), rc = mod(r - s - 2, n);
    const float* send = s == 0 ? in + sc * count : acc.data();
    TS_RETURN_IF_ERROR(exchange(op, s, send, count * 4, tmp.data(), count * 4));
    float* dst = s == n - 2 ? out : acc.data();  // the last chunk received is ours (rc == r)
    const float* own = in + rc * count;
    for (int64_t i = 0; i < count; ++i) dst[i] = tmp[i] + own[i];
  }
  return Status();
}

Status ring_all_gather(RingOp& op, const void* in, void* out, int64_t bytes_per_rank) {
  const int n = op.size();
  uint8_t* base = static_cast<uint8_t*>(out);
  uint8_t* mine = base + op.rank * bytes_per_rank;
  if (bytes_per_rank > 0 && in != mine) std::memmove(mine, in, bytes_per_rank);
  if (n == 1 || bytes_per_rank == 0) return Status();
  std::vector<int64_t> off(n + 1);
  for (int i = 0; i <= n; ++i) off[i] = i * bytes_per_rank;
  return gather_phase(op, base, off, 0);
}

Status pairwise_all_to_all(RingOp& op, const void* in, void* out, int64_t bytes_per_rank) {
  const int n = op.size(), r = op.rank;
  const uint8_t* src = static_cast<const uint8_t*>(in);
  uint8_t* dst = static_cast<uint8_t*>(out);
  if (bytes_per_rank == 0) return Status();
  std::memcpy(dst + r * bytes_per_rank, src + r * bytes_per_rank, bytes_per_rank);
  for (int s = 1; s < n; ++s) {
    const int to = mod(r + s, n), from = mod(r - s, n);
    Xfer x[2] = {post_recv(op, from, s, dst + from * bytes_per_rank, bytes_per_rank),
                 post_send(op, to, s, src + to * bytes_per_rank, bytes_per_rank)};
    TS_RETURN_IF_ERROR(wait_all(op, x, 2));
  }
  return Status();
}

Status chain_broadcast(RingOp& op, void* data, int64_t bytes, int root) {
  const int n = op.size();
  if (n == 1 || bytes == 0) return Status();
  const int pos = mod(op.rank - root, n);  // position in the chain root, root+1, ...
  const int prev = mod(op.rank - 1, n), next = mod(op.rank + 1, n);
  uint8_t* base = static_cast<uint8_t*>(data);
  std::deque<Xfer> sends;
  for (int64_t at = 0, seg = 0; at < bytes; at += kBroadcastSegment, ++seg) {
    const int64_t len = std::min(kBroadcastSegment, bytes - at);
    if (pos > 0) {
      Xfer x = post_recv(op, prev, static_cast<int>(seg % kMaxTag), base + at, len);
      TS_RETURN_IF_ERROR(wait_all(op, &x, 1));
    }
    if (pos < n - 1) {
      sends.push_back(post_send(op, next, static_cast<int>(seg % kMaxTag), base + at, len));
      if (sends.size() > kMaxPendingSends) {
        Status st = wait_all(op, &sends.front(), 1);
        sends.pop_front();
        if (!st.ok()) {
          for (auto& x : sends) op.transport->abandon(x.handle);
          return st;
        }
      }
    }
  }
  std::vector<Xfer> rest(sends.begin(), sends.end());
  return wait_all(op, rest.data(), static_cast<int>(rest.size()));
}

namespace {

// The transport's collective `call`, polled like a ring step; counts the ring's bytes.
Status native(RingOp& op, const Transport::CollectiveCall& call, int64_t sent, int64_t received) {
  Xfer x{op.transport->icollective(op.channel, call), -1, true, 0};
  TS_RETURN_IF_ERROR(wait_all(op, &x, 1));
  op.bytes_sent += sent;
  op.bytes_received += received;
  return Status();
}

bool fits_int(int64_t n) { return n <= INT_MAX; }

}  // namespace

Transport::Handle Transport::icollective(uint64_t, const CollectiveCall&) {
  TS_CHECK(false) << "this transport has no collectives of its own";
  return 0;
}

Status all_reduce_f32(RingOp& op, float* data, int64_t count) {
  const int n = op.size(), r = op.rank;
  if (!op.native || n == 1 || count == 0 || !fits_int(count))
    return ring_all_reduce(op, data, count);
  const std::vector<int64_t> off = ring_chunk_offsets(count, n);
  auto chunk = [&](int c) { return off[mod(c, n) + 1] - off[mod(c, n)]; };
  Transport::CollectiveCall call{Transport::Collective::all_reduce, data, data,
                                 static_cast<int>(count)};
  return native(op, call, 4 * (2 * count - chunk(r) - chunk(r + 1)),
                4 * (2 * count - chunk(r - 1) - chunk(r)));
}

Status reduce_scatter_f32(RingOp& op, const float* in, float* out, int64_t count) {
  const int n = op.size();
  if (!op.native || n == 1 || count == 0 || !fits_int(count))
    return ring_reduce_scatter(op, in, out, count);
  Transport::CollectiveCall call{Transport::Collective::reduce_scatter, in, out,
                                 static_cast<int>(count)};
  return native(op, call, (n - 1) * count * 4, (n - 1) * count * 4);
}

Status all_gather_bytes(RingOp& op, const void* in, void* out, int64_t bytes_per_rank) {
  const int n = op.size();
  if (!op.native || n == 1 || bytes_per_rank == 0 || !fits_int(bytes_per_rank))
    return ring_all_gather(op, in, out, bytes_per_rank);
  Transport::CollectiveCall call{Transport::Collective::all_gather, in, out,
                                 static_cast<int>(bytes_per_rank)};
  return native(op, call, (n - 1) * bytes_per_rank, (n - 1) * bytes_per_rank);
}

Status broadcast_bytes(RingOp& op, void* data, int64_t bytes, int root) {
  const int n = op.size();
  if (!op.native || n == 1 || bytes == 0 || !fits_int(bytes))
    return chain_broadcast(op, data, bytes, root);
  const int pos = mod(op.rank - root, n);  // the chain's counts: all but its last link send
  Transport::CollectiveCall call{Transport::Collective::broadcast, data, data,
                                 static_cast<int>(bytes), root};
  return native(op, call, pos < n - 1 ? bytes : 0, pos > 0 ? bytes : 0);
}

}  // namespace tessera::detail
