// The MPI transport (non-blocking MPI_Isend/MPI_Irecv polled with MPI_Testall, one MPI
// communicator per Tessera communicator) and the termination reporter.
#include "comm/mpi_comm.h"

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <unordered_map>

#include "base/check.h"
#include "comm/comm_internal.h"

namespace tessera {
namespace {

// ---- termination reporter ------------------------------------------------------------------
// Lines are composed ahead of time (by the comm threads, one at a time) into rotating preallocated
// buffers; the handler only reads an atomic index and write()s.
constexpr int kLines = 4;
constexpr int kLineLen = 512;
char g_lines[kLines][kLineLen];
std::atomic<int> g_line_len[kLines];
std::atomic<int> g_current{-1};
std::atomic<bool> g_waiting{false};  // the current line is a wait in a collective
int g_next = 0;                      // written by one thread at a time (init, then comm threads)
int g_world_rank = -1;
volatile sig_atomic_t g_terminated = 0;

void publish_line(bool waiting, const char* fmt, ...) {
  char* buf = g_lines[g_next];
  va_list args;
  va_start(args, fmt);
  int len = std::vsnprintf(buf, kLineLen - 1, fmt, args);  // room for the newline
  va_end(args);
  len = std::clamp(len, 0, kLineLen - 2);
  buf[len++] = '\n';
  g_line_len[g_next].store(len);
  g_waiting.store(waiting);
  g_current.store(g_next);
  g_next = (g_next + 1) % kLines;
}

void publish_idle() {
  publish_line(false,
               "tessera: rank %d terminated by the launcher while not waiting in a collective",
               g_world_rank);
}

extern "C" void on_termination_signal(int sig) {
  g_terminated = 1;
  const int i = g_current.load();
  if (i >= 0) {
    ssize_t ignored = write(STDERR_FILENO, g_lines[i], g_line_len[i].load());
    (void)ignored;
  }
  _exit(128 + sig);
}

// ---- transport -----------------------------------------------------------------------------
constexpr int64_t kMaxSegment = 1 << 30;  // MPI counts are ints: split larger messages

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, len);
}

class MpiTransport final : public detail::Transport {
 public:
  MpiTransport(int rank, int size) : rank_(rank), size_(size) {}
  ~MpiTransport() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!broken_ && !finalized) MPI_Finalize();
  }

  int world_rank() const override { return rank_; }
  int world_size() const override { return size_; }

  void start() override {
    Channel world;
    MPI_Comm_dup(MPI_COMM_WORLD, &world.comm);
    MPI_Comm_set_errhandler(world.comm, MPI_ERRORS_RETURN);
    world.local.resize(size_);
    for (int i = 0; i < size_; ++i) world.local[i] = i;
    channels_[0] = std::move(world);
  }

  void stop(bool broken) override {
    broken_ = broken;
    if (!broken)
      for (auto& [id, ch] : channels_) MPI_Comm_free(&ch.comm);
    channels_.clear();
  }

  Handle isend(uint64_t channel, int peer, int tag, const void* data, int64_t bytes) override {
    return post(false, channel, peer, tag, const_cast<void*>(data), bytes);
  }
  Handle irecv(uint64_t channel, int peer, int tag, void* data, int64_t bytes) override {
    return post(true, channel, peer, tag, data, bytes);
  }

  int test(Handle h, Status* err) override {
    auto it = xfers_.find(h);
    TS_CHECK(it != xfers_.end()) << "unknown transfer " << h;
    Xfer& x = it->second;
    if (x.post_error != MPI_SUCCESS) return fail(it, err, x.post_error);
    int flag = 0;
    std::vector<MPI_Status> statuses(x.reqs.size());
    int rc = MPI_Testall(static_cast<int>(x.reqs.size()), x.reqs.data(), &flag, statuses.data());
    if (rc == MPI_ERR_IN_STATUS) {
      for (auto& s : statuses)
        if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING)
          return fail(it, err, s.MPI_ERROR);
    }
    if (rc != MPI_SUCCESS) return fail(it, err, rc);
    if (!flag) return 0;
    if (x.receiving && !x.collective) {
      for (size_t i = 0; i < statuses.size(); ++i) {
        int got = 0;
        MPI_Get_count(&statuses[i], MPI_BYTE, &got);
        if (got != x.segment_bytes[i]) {
          *err = size_error(got, x.segment_bytes[i]);
          xfers_.erase(it);
          return -1;
        }
      }
    }
    xfers_.erase(it);
    return 1;
  }

  void abandon(Handle h) override {
    auto it = xfers_.find(h);
    if (it == xfers_.end()) return;
    // A collective cannot be cancelled: it is left to the broken process's end.
    for (MPI_Request& r : it->second.reqs) {
      if (it->second.collective) break;
      if (r == MPI_REQUEST_NULL) continue;
      if (it->second.receiving) MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
    xfers_.erase(it);
  }

  void idle(int polls) override {
    if (polls < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(10 * (polls - 63), 500)));
    }
  }

  Result<uint64_t> open_channel(uint64_t parent, int64_t split_seq, int color, int key,
                                const std::vector<int>& members) override {
    Channel ch;
    const int rc =
        MPI_Comm_split(channels_.at(parent).comm, color < 0 ? MPI_UNDEFINED : color, key, &ch.comm);
    if (rc != MPI_SUCCESS) return error("MPI_Comm_split failed: " + mpi_error_string(rc));
    if (color < 0) return uint64_t{0};
    int size = 0, rank = 0;
    MPI_Comm_size(ch.comm, &size);
    MPI_Comm_rank(ch.comm, &rank);
    TS_CHECK_EQ(size, static_cast<int>(members.size()));
    TS_CHECK_EQ(members[rank], rank_) << "MPI_Comm_split ordered the ranks differently";
    MPI_Comm_set_errhandler(ch.comm, MPI_ERRORS_RETURN);
    ch.local.assign(size_, -1);
    for (size_t i = 0; i < members.size(); ++i) ch.local[members[i]] = static_cast<int>(i);
    const uint64_t id = next_channel_++;
    channels_[id] = std::move(ch);
    return id;
  }

  bool has_collectives() const override { return true; }

  Handle icollective(uint64_t channel, const CollectiveCall& c) override {
    const MPI_Comm comm = channels_.at(channel).comm;
    Xfer x;
    x.collective = true;
    MPI_Request req = MPI_REQUEST_NULL;
    void* out = c.out;
    switch (c.kind) {
      case Collective::all_reduce:
        x.post_error = MPI_Iallreduce(c.in == out ? MPI_IN_PLACE : c.in, out, c.count, MPI_FLOAT,
                                      MPI_SUM, comm, &req);
        break;
      case Collective::reduce_scatter:
        x.post_error =
            MPI_Ireduce_scatter_block(c.in, out, c.count, MPI_FLOAT, MPI_SUM, comm, &req);
        break;
      case Collective::all_gather: {  // in place when this rank's block is already in `out`
        const int me = channels_.at(channel).local[static_cast<size_t>(rank_)];
        const bool in_place = c.in == static_cast<const uint8_t*>(out) + int64_t{me} * c.count;
        x.post_error = MPI_Iallgather(in_place ? MPI_IN_PLACE : c.in, c.count, MPI_BYTE, out,
                                      c.count, MPI_BYTE, comm, &req);
        break;
      }
      case Collective::broadcast:
        x.post_error = MPI_Ibcast(out, c.count, MPI_BYTE, c.root, comm, &req);
        break;
    }
    x.reqs.push_back(req);
    x.segment_bytes.push_back(c.count);
    const Handle h = next_handle_++;
    xfers_[h] = std::move(x);
    return h;
  }

  void note_waiting(const detail::WaitInfo* w) override {
    if (!w) {
      publish_idle();
      return;
    }
    if (w->peer < 0) {
      publish_line(true,
                   "tessera: rank %d got a termination signal while waiting in %s '%s' (axis %s, "
                   "the MPI library's collective) — if the job ends now, a rank of axis %s (or "
                   "a rank it waits for) probably died; see the launcher's message",
                   rank_, w->kind, w->what->c_str(), w->axis->c_str(), w->axis->c_str());
    } else if (w->receiving) {
      publish_line(
          true,
          "tessera: rank %d got a termination signal while waiting in %s '%s' (axis %s) for "
          "data from rank %d — if the job ends now, rank %d (or a rank it waits for) probably "
          "died; see the launcher's message",
          rank_, w->kind, w->what->c_str(), w->axis->c_str(), w->peer, w->peer);
    } else {
      publish_line(
          true,
          "tessera: rank %d got a termination signal while waiting in %s '%s' (axis %s) for "
          "rank %d to take data — if the job ends now, rank %d probably died; see the "
          "launcher's message",
          rank_, w->kind, w->what->c_str(), w->axis->c_str(), w->peer, w->peer);
    }
  }

 private:
  struct Channel {
    MPI_Comm comm = MPI_COMM_NULL;
    std::vector<int> local;  // world rank -> rank in comm
  };
  struct Xfer {
    bool receiving = false;
    bool collective = false;  // MPI's own: no sizes to check, never cancelled
    int post_error = MPI_SUCCESS;
    std::vector<MPI_Request> reqs;
    std::vector<int> segment_bytes;
  };

  Handle post(bool receiving, uint64_t channel, int peer, int tag, void* data, int64_t bytes) {
    const Channel& ch = channels_.at(channel);
    const int dest = ch.local.at(peer);
    TS_CHECK_GE(dest, 0) << "rank " << peer << " is not in this communicator";
    Xfer x;
    x.receiving = receiving;
    char* p = static_cast<char*>(data);
    for (int64_t at = 0; at < bytes; at += kMaxSegment) {
      const int len = static_cast<int>(std::min(kMaxSegment, bytes - at));
      MPI_Request req = MPI_REQUEST_NULL;
      const int rc = receiving ? MPI_Irecv(p + at, len, MPI_BYTE, dest, tag, ch.comm, &req)
                               : MPI_Isend(p + at, len, MPI_BYTE, dest, tag, ch.comm, &req);
      if (rc != MPI_SUCCESS && x.post_error == MPI_SUCCESS) x.post_error = rc;
      x.reqs.push_back(req);
      x.segment_bytes.push_back(len);
    }
    const Handle h = next_handle_++;
    xfers_[h] = std::move(x);
    return h;
  }

  int fail(std::unordered_map<Handle, Xfer>::iterator it, Status* err, int code) {
    *err = error("MPI error: " + mpi_error_string(code),
                 code == MPI_ERR_TRUNCATE ? "every rank must issue the same collectives, in the "
                                            "same order, with the same counts"
                                          : "");
    const Handle h = it->first;
    abandon(h);
    return -1;
  }

  static Status size_error(int got, int expected) {
    return error(
        "received " + std::to_string(got) + " bytes but expected " + std::to_string(expected),
        "every rank must issue the same collectives, in the same order, with the same "
        "counts");
  }

  int rank_, size_;
  bool broken_ = false;
  uint64_t next_channel_ = 1;
  Handle next_handle_ = 1;
  std::unordered_map<uint64_t, Channel> channels_;
  std::unordered_map<Handle, Xfer> xfers_;
};

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown level";
}

}  // namespace

bool launched_by_mpirun() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK"))
    return true;
  // srun (a `tessera submit` job): a step of several tasks.
  const char* tasks = std::getenv("SLURM_STEP_NUM_TASKS");
  return tasks != nullptr && std::atoi(tasks) > 1;
}

Result<std::unique_ptr<Communicator>> mpi_world(int* argc, char*** argv, CollectiveAlgo algo) {
  static bool called = false;
  if (called) return error("mpi_world() called twice", "create the world communicator once");
  called = true;
  int initialized = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  if (!initialized) {
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return error("MPI_Init_thread failed: " + mpi_error_string(rc));
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    return error(std::string("the MPI library provides ") + thread_level_name(provided) +
                     " but Tessera needs MPI_THREAD_MULTIPLE (its comm threads call MPI while "
                     "other threads run)",
                 "use an MPI built with thread support (Open MPI: "
                 "--enable-mpi-thread-multiple; MPICH: --enable-threads=multiple)");
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  set_process_rank(rank);
  g_world_rank = rank;
  publish_idle();
  return detail::make_world_communicator(std::make_unique<MpiTransport>(rank, size), algo);
}

void write_collective_wait() {
  const int i = g_current.load();
  if (i < 0 || !g_waiting.load()) return;
  ssize_t ignored = write(STDERR_FILENO, g_lines[i], g_line_len[i].load());
  (void)ignored;
}

void install_termination_reporter() {
  if (g_current.load() < 0) publish_idle();
  struct sigaction sa = {};
  sa.sa_handler = on_termination_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

}  // namespace tessera
