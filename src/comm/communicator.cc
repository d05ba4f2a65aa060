// The comm thread (one Engine per process), requests, stats and split. The algorithms are in
// ring.cc, the transports in local_comm.cc and mpi_comm.cc.
#include "comm/communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "base/check.h"
#include "comm/comm_internal.h"
#include "comm/ring.h"

namespace tessera {

class CommRequest {
 public:
  void finish(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(s);
    done_ = true;
    cv_.notify_all();
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

namespace detail {

// The comm thread of one process and the transport it alone uses. Tasks run in submission
// order. The destructor runs the tasks still queued, then stops the transport.
class Engine {
 public:
  explicit Engine(std::unique_ptr<Transport> t) : transport_(std::move(t)) {
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
  Transport& transport() { return *transport_; }
  // Comm thread only: the first failure, after which nothing more is attempted.
  const Status& failure() const { return failure_; }
  void fail(const Status& s) {
    if (failure_.ok()) failure_ = s;
  }

 private:
  void run() {
    transport_->start();
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
    transport_->stop(!failure_.ok());
  }

  std::unique_ptr<Transport> transport_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  Status failure_;
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
  std::shared_ptr<Engine> engine;
  std::shared_ptr<CommInfo> info;
  std::atomic<double> timeout{60.0};
  int64_t split_seq = 0;  // number of splits issued (the caller's thread only)
};

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

using Body = std::function<Status(RingOp&)>;

Request issue(CommState& st, const char* kind, std::string what, int64_t total_bytes, Body body) {
  auto req = std::make_shared<CommRequest>();
  {
    std::lock_guard<std::mutex> lock(st.info->stats_mu);
    ++st.info->stats.collectives;
  }
  Engine* engine = st.engine.get();  // outlives its queued tasks (see ~Engine)
  st.engine->submit([engine, info = st.info, req, kind, what = std::move(what), total_bytes,
                     timeout = st.timeout.load(), body = std::move(body)] {
    const Status& failed = engine->failure();
    if (!failed.ok()) {
      req->finish(error("rank " + std::to_string(info->members[info->rank]) + ": " + kind + " '" +
                            what + "' (axis " + info->name +
                            ") not run: an earlier collective failed: " + failed.message(),
                        failed.hint()));
      return;
    }
    RingOp op{&engine->transport(), info->channel, &info->members, info->rank, timeout, kind, &what,
              &info->name,          total_bytes};
    Status s = body(op);
    {
      std::lock_guard<std::mutex> lock(info->stats_mu);
      info->stats.bytes_sent += op.bytes_sent;
      info->stats.bytes_received += op.bytes_received;
    }
    if (!s.ok()) engine->fail(s);
    req->finish(std::move(s));
  });
  return req;
}

class RingCommunicator final : public Communicator {
 public:
  explicit RingCommunicator(std::shared_ptr<CommState> st) : Communicator(std::move(st)) {}
  Result<std::unique_ptr<Communicator>> split(int color, int key, std::string name) override;
};

struct SplitResult {
  uint64_t channel = 0;
  std::vector<int> members;
  int rank = -1;
};

Result<std::unique_ptr<Communicator>> RingCommunicator::split(int color, int key,
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
  st->engine = state_->engine;
  st->info = std::make_shared<CommInfo>();
  st->info->channel = out->channel;
  st->info->members = std::move(out->members);
  st->info->rank = out->rank;
  st->info->name = std::move(name);
  st->timeout = state_->timeout.load();
  return std::unique_ptr<Communicator>(new RingCommunicator(std::move(st)));
}

}  // namespace

std::unique_ptr<Communicator> make_world_communicator(std::unique_ptr<Transport> transport) {
  auto st = std::make_shared<CommState>();
  st->info = std::make_shared<CommInfo>();
  st->info->rank = transport->world_rank();
  for (int i = 0; i < transport->world_size(); ++i) st->info->members.push_back(i);
  st->info->name = "world";
  st->engine = std::make_shared<Engine>(std::move(transport));
  return std::unique_ptr<Communicator>(new RingCommunicator(std::move(st)));
}

Transport* transport_of(const Communicator& comm) { return &comm.state_->engine->transport(); }

}  // namespace detail

Communicator::Communicator(std::shared_ptr<detail::CommState> state) : state_(std::move(state)) {}
Communicator::~Communicator() = default;

int Communicator::rank() const { return state_->info->rank; }
int Communicator::size() const { return static_cast<int>(state_->info->members.size()); }
const std::string& Communicator::name() const { return state_->info->name; }
int Communicator::world_rank(int r) const { return state_->info->members.at(r); }

Request Communicator::all_reduce(float* data, int64_t count, std::string what) {
  TS_CHECK_GE(count, 0) << "all_reduce '" << what << "'";
  return detail::issue(*state_, "all_reduce", std::move(what), count * 4,
                       [=](detail::RingOp& op) { return ring_all_reduce(op, data, count); });
}

Request Communicator::reduce_scatter(const float* in, float* out, int64_t count, std::string what) {
  TS_CHECK_GE(count, 0) << "reduce_scatter '" << what << "'";
  return detail::issue(*state_, "reduce_scatter", std::move(what), count * 4 * size(),
                       [=](detail::RingOp& op) { return ring_reduce_scatter(op, in, out, count); });
}

Request Communicator::all_gather(const float* in, float* out, int64_t count, std::string what) {
  TS_CHECK_GE(count, 0) << "all_gather '" << what << "'";
  return detail::issue(*state_, "all_gather", std::move(what), count * 4 * size(),
                       [=](detail::RingOp& op) { return ring_all_gather(op, in, out, count * 4); });
}

Request Communicator::broadcast(float* data, int64_t count, int root, std::string what) {
  TS_CHECK_GE(count, 0) << "broadcast '" << what << "'";
  TS_CHECK(root >= 0 && root < size())
      << "broadcast '" << what << "': root " << root << " of " << size() << " ranks";
  return detail::issue(*state_, "broadcast", std::move(what), count * 4, [=](detail::RingOp& op) {
    return chain_broadcast(op, data, count * 4, root);
  });
}

Status Communicator::wait(const Request& r) {
  TS_CHECK(r != nullptr) << "wait on a null request";
  const double start = detail::now_seconds();
  Status s = r->wait();
  const double waited = detail::now_seconds() - start;
  std::lock_guard<std::mutex> lock(state_->info->stats_mu);
  state_->info->stats.wait_seconds += waited;
  return s;
}

Status Communicator::barrier(std::string what) {
  Request r = detail::issue(*state_, "barrier", std::move(what), 0, [](detail::RingOp& op) {
    const uint8_t token = 1;
    std::vector<uint8_t> all(op.size());
    return ring_all_gather(op, &token, all.data(), 1);
  });
  return wait(r);
}

Result<double> Communicator::all_reduce_scalar(double x, bool max, std::string what) {
  auto result = std::make_shared<double>(0.0);
  Request r = detail::issue(*state_, max ? "all_reduce_scalar(max)" : "all_reduce_scalar(sum)",
                            std::move(what), 8, [=](detail::RingOp& op) {
                              std::vector<double> all(op.size());
                              TS_RETURN_IF_ERROR(ring_all_gather(op, &x, all.data(), 8));
                              double acc = all[0];  // combined in rank order: same bits everywhere
                              for (size_t i = 1; i < all.size(); ++i)
                                acc = max ? std::max(acc, all[i]) : acc + all[i];
                              *result = acc;
                              return Status();
                            });
  TS_RETURN_IF_ERROR(wait(r));
  return *result;
}

CommStats Communicator::stats() const {
  std::lock_guard<std::mutex> lock(state_->info->stats_mu);
  return state_->info->stats;
}

void Communicator::reset_stats() {
  std::lock_guard<std::mutex> lock(state_->info->stats_mu);
  state_->info->stats = CommStats();
}

void Communicator::set_timeout(double seconds) {
  TS_CHECK_GT(seconds, 0.0);
  state_->timeout = seconds;
}

double Communicator::timeout() const { return state_->timeout.load(); }

}  // namespace tessera
