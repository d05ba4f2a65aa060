// The host-memory communicators: the comm threads (one Engine per communicator, sharing the
// process's transport), requests, stats, split, and the typed operations (bf16/f16 reductions
// widened to f32 on the comm thread). The algorithms are in ring.cc (the ring's, or the
// transport's own collectives), the transports in local_comm.cc and mpi_comm.cc.
#include "comm/host_comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "base/check.h"
#include "base/format.h"
#include "comm/comm_internal.h"
#include "comm/communicator.h"
#include "comm/ring.h"

namespace tessera {

namespace {

// Completed by a comm thread; the caller's wait blocks on it.
class HostRequest final : public CommRequest {
 public:
  void finish(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(s);
    done_ = true;
    cv_.notify_all();
  }
  bool done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  Status wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

HostRequest& host_request(const Request& r) {
  TS_CHECK(r != nullptr) << "wait on a null request";
  auto* h = dynamic_cast<HostRequest*>(r.get());
  TS_CHECK(h != nullptr) << "a request of another kind of communicator";
  return *h;
}

}  // namespace

namespace detail {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What the comm threads of one process share: the transport, whose calls they serialize
// (each call is non-blocking; idle() runs unlocked), and the first failure. Started when the
// world communicator is made; stopped when the last comm thread has ended.
class Process final : public Transport {
 public:
  explicit Process(std::unique_ptr<Transport> t) : raw_(std::move(t)) { raw_->start(); }
  ~Process() override { raw_->stop(!failure().ok()); }

  Transport& raw() { return *raw_; }
  Status failure() {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }
  void fail(const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.ok()) failure_ = s;
  }

  int world_rank() const override { return raw_->world_rank(); }
  int world_size() const override { return raw_->world_size(); }
  Handle isend(uint64_t channel, int peer, int tag, const void* data, int64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    return raw_->isend(channel, peer, tag, data, bytes);
  }
  Handle irecv(uint64_t channel, int peer, int tag, void* data, int64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    return raw_->irecv(channel, peer, tag, data, bytes);
  }
  int test(Handle h, Status* err) override {
    std::lock_guard<std::mutex> lock(mu_);
    return raw_->test(h, err);
  }
  void abandon(Handle h) override {
    std::lock_guard<std::mutex> lock(mu_);
    raw_->abandon(h);
  }
  void idle(int polls) override { raw_->idle(polls); }
  Result<uint64_t> open_channel(uint64_t parent, int64_t split_seq, int color, int key,
                                const std::vector<int>& members) override {
    std::lock_guard<std::mutex> lock(mu_);
    return raw_->open_channel(parent, split_seq, color, key, members);
  }
  bool has_collectives() const override { return raw_->has_collectives(); }
  Handle icollective(uint64_t channel, const CollectiveCall& call) override {
    std::lock_guard<std::mutex> lock(mu_);
    return raw_->icollective(channel, call);
  }
  // Several comm threads may wait at once: the reporter shows the latest wait still going.
  void note_waiting(const WaitInfo* w) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::thread::id me = std::this_thread::get_id();
    std::erase_if(waits_, [&](const auto& e) { return e.first == me; });
    if (w) waits_.emplace_back(me, *w);
    raw_->note_waiting(waits_.empty() ? nullptr : &waits_.back().second);
  }

 private:
  std::unique_ptr<Transport> raw_;
  std::mutex mu_;
  Status failure_;
  std::vector<std::pair<std::thread::id, WaitInfo>> waits_;
};

// The comm thread of one communicator: its operations run in issue order, independently of
// other communicators' (a tensor-parallel all-reduce never queues behind a gradient bucket
// of the data axes). The destructor runs the tasks still queued.
class Engine {
 public:
  explicit Engine(std::shared_ptr<Process> p) : process_(std::move(p)) {
    thread_ = std::thread([this] { run(); });
  }
  ~Engine() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void submit(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    cv_.notify_one();
  }
  const std::shared_ptr<Process>& process() const { return process_; }

 private:
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) break;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  std::shared_ptr<Process> process_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

// Point-to-point operations of one communicator (its "p2p stream"): each is posted on the
// transport as soon as it is issued and completes on its own, in any order, so two ranks that
// send to each other at once (a pipeline's activations one way, gradients the other) never
// deadlock, and a send never queues behind a receive. Started at the first send or receive.
class P2PEngine {
 public:
  struct Op {
    bool receiving = false;
    int peer = 0;  // world rank
    int tag = 0;
    void* data = nullptr;
    int64_t bytes = 0;
    double timeout = 60;
    std::string what;
    std::shared_ptr<HostRequest> req;
    std::function<void(int64_t sent, int64_t received)> count;
    CommTraceSink* trace = nullptr;
    // Set by the engine thread.
    Transport::Handle handle = 0;
    double posted = 0;
  };
  P2PEngine(std::shared_ptr<Process> p, uint64_t channel, int my_world_rank, std::string axis)
      : process_(std::move(p)), channel_(channel), me_(my_world_rank), axis_(std::move(axis)) {
    thread_ = std::thread([this] { run(); });
  }
  ~P2PEngine() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void submit(Op op) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(op));
    cv_.notify_one();
  }

 private:
  Status failed(const Op& op, const std::string& why, const std::string& hint) const {
    return error("rank " + std::to_string(me_) + ": " + (op.receiving ? "recv '" : "send '") +
                     op.what + "' (axis " + axis_ + ", " + format_bytes(double(op.bytes)) +
                     (op.receiving ? ") from rank " : ") to rank ") + std::to_string(op.peer) +
                     " " + why,
                 hint);
  }
  void note(const std::deque<Op>& pending) {
    const Op* shown = nullptr;
    for (const Op& op : pending)
      if (!shown || (op.receiving && !shown->receiving)) shown = &op;
    if (!shown) {
      process_->note_waiting(nullptr);
      return;
    }
    WaitInfo w{shown->receiving ? "recv" : "send", &shown->what, &axis_, shown->peer,
               shown->receiving};
    process_->note_waiting(&w);
  }
  void run() {
    std::deque<Op> pending;
    int idle_polls = 0;
    for (;;) {
      std::deque<Op> fresh;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (pending.empty()) cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (pending.empty() && queue_.empty() && stopping_) break;
        if (stopping_) {  // the communicator is going away: nothing will wait on these
          for (Op& op : pending) process_->abandon(op.handle);
          pending.clear();
          break;
        }
        fresh.swap(queue_);
      }
      for (Op& op : fresh) {
        const Status f = process_->failure();
        if (!f.ok()) {
          op.req->finish(
              failed(op, "not run: an earlier operation failed: " + f.message(), f.hint()));
          continue;
        }
        op.handle = op.receiving ? process_->irecv(channel_, op.peer, op.tag, op.data, op.bytes)
                                 : process_->isend(channel_, op.peer, op.tag, op.data, op.bytes);
        op.posted = now_seconds();
        pending.push_back(std::move(op));
      }
      if (!fresh.empty()) note(pending);
      bool progressed = false;
      for (auto it = pending.begin(); it != pending.end();) {
        Status err;
        const int r = process_->test(it->handle, &err);
        const double waited = now_seconds() - it->posted;
        if (r == 0 && waited <= it->timeout) {
          ++it;
          continue;
        }
        Status s;
        if (r < 0) {
          s = failed(*it, "failed: " + err.message(), err.hint());
        } else if (r == 0) {
          process_->abandon(it->handle);
          char secs[32];
          std::snprintf(secs, sizeof secs, "%.1f", waited);
          s = failed(*it, std::string("timed out after ") + secs + " s",
                     "rank " + std::to_string(it->peer) +
                         " died or is stuck (or is itself waiting for a rank that did) — check "
                         "its log; raise --comm-timeout if it is only slow");
        } else {
          it->count(it->receiving ? 0 : it->bytes, it->receiving ? it->bytes : 0);
          if (it->trace)
            it->trace->record(it->receiving ? "recv" : "send", it->what, axis_, it->posted,
                              trace_clock(), it->bytes);
        }
        if (!s.ok()) process_->fail(s);
        it->req->finish(std::move(s));
        it = pending.erase(it);
        progressed = true;
      }
      if (progressed) note(pending);
      idle_polls = progressed ? 0 : idle_polls + 1;
      if (!pending.empty()) process_->idle(idle_polls);
    }
    process_->note_waiting(nullptr);
  }

  std::shared_ptr<Process> process_;
  uint64_t channel_;
  int me_;
  std::string axis_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

// What a queued operation needs of its communicator (it may outlive the Communicator).
struct CommInfo {
  uint64_t channel = 0;
  std::vector<int> members;  // world rank of each local rank
  int rank = 0;
  std::string name;
  mutable std::mutex stats_mu;
  CommStats stats;
};

struct CommState {
  CollectiveAlgo algo = CollectiveAlgo::ring;
  std::atomic<CommTraceSink*> trace{nullptr};  // set_trace_sink's, read at issue
  std::shared_ptr<Engine> engine;
  std::unique_ptr<P2PEngine> p2p;  // made at the first send or recv (the caller's thread)
  std::shared_ptr<CommInfo> info;
  std::atomic<double> timeout{60.0};
  int64_t split_seq = 0;  // number of splits issued (the caller's thread only)
};

namespace {

using Body = std::function<Status(RingOp&)>;

// Whether an operation of `kind` on `bytes` runs MPI's collective (CollectiveAlgo::automatic's
// choice is in host_comm.h).
bool use_mpi(CollectiveAlgo algo, std::string_view kind, int64_t bytes) {
  if (algo != CollectiveAlgo::automatic) return algo == CollectiveAlgo::mpi;
  return kind == "all_gather" || kind == "barrier" || kind.starts_with("all_reduce_scalar") ||
         bytes < kMpiReductionBelowBytes;
}

Request issue(CommState& st, const char* kind, std::string what, int64_t total_bytes, Body body) {
  auto req = std::make_shared<HostRequest>();
  {
    std::lock_guard<std::mutex> lock(st.info->stats_mu);
    ++st.info->stats.collectives;
  }
  Process* process = st.engine->process().get();  // outlives the queued tasks (see ~Engine)
  const bool native = process->raw().has_collectives() && use_mpi(st.algo, kind, total_bytes);
  st.engine->submit([process, info = st.info, req, kind, what = std::move(what), total_bytes,
                     native, trace = st.trace.load(), timeout = st.timeout.load(),
                     body = std::move(body)] {
    const Status failed = process->failure();
    if (!failed.ok()) {
      req->finish(error("rank " + std::to_string(info->members[info->rank]) + ": " + kind + " '" +
                            what + "' (axis " + info->name +
                            ") not run: an earlier collective failed: " + failed.message(),
                        failed.hint()));
      return;
    }
    RingOp op{.transport = process,
              .channel = info->channel,
              .members = &info->members,
              .rank = info->rank,
              .timeout = timeout,
              .kind = kind,
              .what = &what,
              .axis = &info->name,
              .total_bytes = total_bytes,
              .native = native};
    const double start = trace ? trace_clock() : 0;
    Status s = body(op);
    if (trace) trace->record(kind, what, info->name, start, trace_clock(), total_bytes);
    {
      std::lock_guard<std::mutex> lock(info->stats_mu);
      info->stats.bytes_sent += op.bytes_sent;
      info->stats.bytes_received += op.bytes_received;
    }
    if (!s.ok()) process->fail(s);
    req->finish(std::move(s));
  });
  return req;
}

// bf16/f16 elements as f32 (for a reduction on the comm thread) and back, rounded once.
std::vector<float> widened(const void* src, DType dt, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  const uint16_t* x = static_cast<const uint16_t*>(src);
  if (dt == DType::bf16)
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(x[i]);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(x[i]);
  return out;
}

void narrow(const float* src, void* dst, DType dt, int64_t n) {
  uint16_t* y = static_cast<uint16_t*>(dst);
  if (dt == DType::bf16)
    for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(src[i]);
  else
    for (int64_t i = 0; i < n; ++i) y[i] = f32_to_f16(src[i]);
}

class HostCommunicator final : public Communicator {
 public:
  explicit HostCommunicator(std::shared_ptr<CommState> st) : state_(std::move(st)) {}

  int rank() const override { return state_->info->rank; }
  int size() const override { return static_cast<int>(state_->info->members.size()); }
  const std::string& name() const override { return state_->info->name; }
  int world_rank(int r) const override { return state_->info->members.at(r); }
  MemSpace memory() const override { return MemSpace::host; }
  const char* kind() const override { return collective_algo_name(state_->algo); }
  Result<std::unique_ptr<Communicator>> split(int color, int key, std::string name) override;

  Status wait(const Request& r) override;
  bool test(const Request& r) const override { return host_request(r).done(); }
  Status barrier(std::string what) override;
  Result<double> all_reduce_scalar(double x, bool max, std::string what) override;
  CommStats stats() const override;
  void reset_stats() override;
  void set_timeout(double seconds) override;
  double timeout() const override { return state_->timeout.load(); }
  void set_trace_sink(CommTraceSink* sink) override { state_->trace = sink; }

  CommState& state() const { return *state_; }

 protected:
  Request do_all_reduce(void* data, int64_t count, DType dt, std::string what) override;
  Request do_reduce_scatter(const void* in, void* out, int64_t count, DType dt,
                            std::string what) override;
  Request do_all_gather(const void* in, void* out, int64_t count, DType dt,
                        std::string what) override;
  Request do_all_to_all(const void* in, void* out, int64_t count, DType dt,
                        std::string what) override;
  Request do_broadcast(void* data, int64_t count, DType dt, int root, std::string what) override;
  Request do_p2p(bool receiving, void* data, int64_t count, DType dt, int peer, int tag,
                 std::string what) override;

 private:
  std::shared_ptr<CommState> state_;
};

struct SplitResult {
  uint64_t channel = 0;
  std::vector<int> members;
  int rank = -1;
};

Result<std::unique_ptr<Communicator>> HostCommunicator::split(int color, int key,
                                                              std::string name) {
  const int64_t seq = state_->split_seq++;
  const int n = size();
  auto out = std::make_shared<SplitResult>();
  Request r = issue(*state_, "split", name, 16 * n, [out, seq, color, key](RingOp& op) {
    const int n = op.size();
    const int64_t mine[2] = {color, key};
    std::vector<int64_t> all(2 * n);
    TS_RETURN_IF_ERROR(ring_all_gather(op, mine, all.data(), sizeof mine));
    if (color >= 0) {
      std::vector<int> group;  // local ranks of my color, ordered by (key, rank)
      for (int i = 0; i < n; ++i)
        if (all[2 * i] == color) group.push_back(i);
      std::stable_sort(group.begin(), group.end(),
                       [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
      for (int i : group) {
        if (i == op.rank) out->rank = static_cast<int>(out->members.size());
        out->members.push_back((*op.members)[i]);
      }
    }
    TS_ASSIGN_OR_RETURN(out->channel,
                        op.transport->open_channel(op.channel, seq, color, key, out->members));
    return Status();
  });
  TS_RETURN_IF_ERROR(wait(r));
  if (color < 0) return std::unique_ptr<Communicator>();
  auto st = std::make_shared<CommState>();
  st->algo = state_->algo;
  st->engine = std::make_shared<Engine>(state_->engine->process());
  st->info = std::make_shared<CommInfo>();
  st->info->channel = out->channel;
  st->info->members = std::move(out->members);
  st->info->rank = out->rank;
  st->info->name = std::move(name);
  st->timeout = state_->timeout.load();
  return std::unique_ptr<Communicator>(new HostCommunicator(std::move(st)));
}

Request HostCommunicator::do_all_reduce(void* data, int64_t count, DType dt, std::string what) {
  return issue(*state_, "all_reduce", std::move(what), count * dtype_size(dt),
               [=](RingOp& op) -> Status {
                 if (dt == DType::f32) return all_reduce_f32(op, static_cast<float*>(data), count);
                 std::vector<float> sum = widened(data, dt, count);
                 TS_RETURN_IF_ERROR(all_reduce_f32(op, sum.data(), count));
                 narrow(sum.data(), data, dt, count);
                 return Status();
               });
}

Request HostCommunicator::do_reduce_scatter(const void* in, void* out, int64_t count, DType dt,
                                            std::string what) {
  return issue(*state_, "reduce_scatter", std::move(what), count * dtype_size(dt) * size(),
               [=](RingOp& op) -> Status {
                 if (dt == DType::f32)
                   return reduce_scatter_f32(op, static_cast<const float*>(in),
                                             static_cast<float*>(out), count);
                 const std::vector<float> wide = widened(in, dt, count * op.size());
                 std::vector<float> sum(static_cast<size_t>(count));
                 TS_RETURN_IF_ERROR(reduce_scatter_f32(op, wide.data(), sum.data(), count));
                 narrow(sum.data(), out, dt, count);
                 return Status();
               });
}

Request HostCommunicator::do_all_gather(const void* in, void* out, int64_t count, DType dt,
                                        std::string what) {
  const int64_t bytes = count * dtype_size(dt);
  return issue(*state_, "all_gather", std::move(what), bytes * size(),
               [=](RingOp& op) { return all_gather_bytes(op, in, out, bytes); });
}

// The ring's pairwise exchange whatever the algorithm (the MPI library's MPI_Alltoall is not
// wired yet).
Request HostCommunicator::do_all_to_all(const void* in, void* out, int64_t count, DType dt,
                                        std::string what) {
  const int64_t bytes = count * dtype_size(dt);
  return issue(*state_, "all_to_all", std::move(what), bytes * size(),
               [=](RingOp& op) { return pairwise_all_to_all(op, in, out, bytes); });
}

Request HostCommunicator::do_broadcast(void* data, int64_t count, DType dt, int root,
                                       std::string what) {
  const int64_t bytes = count * dtype_size(dt);
  return issue(*state_, "broadcast", std::move(what), bytes,
               [=](RingOp& op) { return broadcast_bytes(op, data, bytes, root); });
}

Request HostCommunicator::do_p2p(bool receiving, void* data, int64_t count, DType dt, int peer,
                                 int tag, std::string what) {
  CommState& st = *state_;
  {
    std::lock_guard<std::mutex> lock(st.info->stats_mu);
    ++st.info->stats.collectives;
  }
  auto req = std::make_shared<HostRequest>();
  if (count == 0) {
    req->finish(Status());
    return req;
  }
  if (!st.p2p)
    st.p2p = std::make_unique<P2PEngine>(st.engine->process(), st.info->channel, world_rank(rank()),
                                         st.info->name);
  P2PEngine::Op op;
  op.receiving = receiving;
  op.peer = world_rank(peer);
  op.tag = kFirstP2PTag + tag;
  op.data = data;
  op.bytes = count * dtype_size(dt);
  op.timeout = st.timeout.load();
  op.what = std::move(what);
  op.req = req;
  op.trace = st.trace.load();
  op.count = [info = st.info](int64_t sent, int64_t received) {
    std::lock_guard<std::mutex> lock(info->stats_mu);
    info->stats.bytes_sent += sent;
    info->stats.bytes_received += received;
  };
  st.p2p->submit(std::move(op));
  return req;
}

Status HostCommunicator::wait(const Request& r) {
  HostRequest& req = host_request(r);
  const double start = now_seconds();
  Status s = req.wait();
  const double waited = now_seconds() - start;
  std::lock_guard<std::mutex> lock(state_->info->stats_mu);
  state_->info->stats.wait_seconds += waited;
  return s;
}

Status HostCommunicator::barrier(std::string what) {
  Request r = issue(*state_, "barrier", std::move(what), 0, [](RingOp& op) {
    const uint8_t token = 1;
    std::vector<uint8_t> all(op.size());
    return all_gather_bytes(op, &token, all.data(), 1);
  });
  return wait(r);
}

Result<double> HostCommunicator::all_reduce_scalar(double x, bool max, std::string what) {
  auto result = std::make_shared<double>(0.0);
  Request r = issue(*state_, max ? "all_reduce_scalar(max)" : "all_reduce_scalar(sum)",
                    std::move(what), 8, [=](RingOp& op) {
                      std::vector<double> all(op.size());
                      TS_RETURN_IF_ERROR(all_gather_bytes(op, &x, all.data(), 8));
                      double acc = all[0];  // combined in rank order: same bits everywhere
                      for (size_t i = 1; i < all.size(); ++i)
                        acc = max ? std::max(acc, all[i]) : acc + all[i];
                      *result = acc;
                      return Status();
                    });
  TS_RETURN_IF_ERROR(wait(r));
  return *result;
}

CommStats HostCommunicator::stats() const {
  std::lock_guard<std::mutex> lock(state_->info->stats_mu);
  return state_->info->stats;
}

void HostCommunicator::reset_stats() {
  std::lock_guard<std::mutex> lock(state_->info->stats_mu);
  state_->info->stats = CommStats();
}

void HostCommunicator::set_timeout(double seconds) {
  TS_CHECK_GT(seconds, 0.0);
  state_->timeout = seconds;
}

}  // namespace

std::unique_ptr<Communicator> make_world_communicator(std::unique_ptr<Transport> transport,
                                                      CollectiveAlgo algo) {
  auto st = std::make_shared<CommState>();
  st->algo = algo;
  st->info = std::make_shared<CommInfo>();
  st->info->rank = transport->world_rank();
  for (int i = 0; i < transport->world_size(); ++i) st->info->members.push_back(i);
  st->info->name = "world";
  st->engine = std::make_shared<Engine>(std::make_shared<Process>(std::move(transport)));
  return std::unique_ptr<Communicator>(new HostCommunicator(std::move(st)));
}

Transport* transport_of(const Communicator& comm) {
  auto* host = dynamic_cast<const HostCommunicator*>(&comm);
  TS_CHECK(host != nullptr) << "transport_of: not a host communicator";
  return &host->state().engine->process()->raw();
}

}  // namespace detail

void set_collective_algo(Communicator& comm, CollectiveAlgo algo) {
  auto* host = dynamic_cast<detail::HostCommunicator*>(&comm);
  TS_CHECK(host != nullptr) << "set_collective_algo: not a host communicator";
  host->state().algo = algo;
}

double trace_clock() { return detail::now_seconds(); }

const char* collective_algo_name(CollectiveAlgo a) {
  switch (a) {
    case CollectiveAlgo::ring:
      return "ring";
    case CollectiveAlgo::mpi:
      return "mpi";
    case CollectiveAlgo::automatic:
      return "auto";
  }
  return "?";
}

std::optional<CollectiveAlgo> parse_collective_algo(std::string_view name) {
  for (CollectiveAlgo a : {CollectiveAlgo::ring, CollectiveAlgo::mpi, CollectiveAlgo::automatic})
    if (name == collective_algo_name(a)) return a;
  return std::nullopt;
}

}  // namespace tessera
