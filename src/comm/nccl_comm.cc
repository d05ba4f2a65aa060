// NCCL communicators: typed operations on a comm stream ordered by events, the split, and the
// watchdog that turns a stuck or failed operation into the process's failure (nccl_comm.h).
#include "comm/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "base/check.h"
#include "base/format.h"

namespace tessera {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
  }
  return ncclFloat32;
}

const char* const kNcclHint = "set NCCL_DEBUG=WARN for NCCL's own account of it";

Status nccl_error(const std::string& where, ncclResult_t r) {
  return error(where + ": NCCL: " + ncclGetErrorString(r), kNcclHint);
}

Status cuda_error(const std::string& where, cudaError_t e) {
  return error(where + ": CUDA: " + cudaGetErrorString(e));
}

// One operation in flight, complete when its event is.
class NcclRequest final : public CommRequest {
 public:
  NcclRequest() { cudaEventCreateWithFlags(&done, cudaEventDisableTiming); }
  ~NcclRequest() override {
    if (done) cudaEventDestroy(done);
  }
  cudaEvent_t done = nullptr;
  Status status;      // a failure at issue: nothing was enqueued
  std::string desc;   // "rank 0: all_reduce 'grad bucket 3' (axis dp, 4 ranks, 1.20 MiB)"
  std::string ranks;  // the others, for the timeout's hint
  double issued = 0;
  double timeout = 60;
};

// Makes `device` the calling thread's current device for a scope (a rank's calls may come
// from any thread; its streams, events and buffers are on its own device).
class OnDevice {
 public:
  explicit OnDevice(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~OnDevice() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

NcclRequest& nccl_request(const Request& r) {
  TS_CHECK(r != nullptr) << "wait on a null request";
  auto* q = dynamic_cast<NcclRequest*>(r.get());
  TS_CHECK(q != nullptr) << "a request of another kind of communicator";
  return *q;
}

// What the NCCL communicators of one process share: the first failure, the communicators (to
// abort them all on a failure) and the operations in flight, polled by a thread of its own.
class Watchdog {
 public:
  explicit Watchdog(int device) : device_(device) {
    thread_ = std::thread([this] { run(); });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void add(ncclComm_t c) {
    std::lock_guard<std::mutex> lock(mu_);
    comms_.push_back(c);
  }
  // The communicator is going away (its owner's thread): destroyed, or aborted after a
  // failure; outside the lock, since a destroy may wait for the node's other ranks.
  void release(ncclComm_t c) {
    bool failed = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::erase(comms_, c);
      failed = revoked_;
    }
    if (failed)
      ncclCommAbort(c);
    else
      ncclCommDestroy(c);
  }
  void watch(std::shared_ptr<NcclRequest> r) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(r));
  }
  Status failure() {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }
  void fail(const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_locked(s);
  }

 private:
  // The first failure wins; every communicator is revoked, so that no kernel waits on (a
  // revoke stops the operations in flight and frees nothing: the owners, on their threads,
  // abort their communicators when they release them).
  void fail_locked(const Status& s) {
    if (!failure_.ok()) return;
    failure_ = s;
    if (revoked_) return;
    revoked_ = true;
    for (ncclComm_t c : comms_) ncclCommRevoke(c, NCCL_REVOKE_DEFAULT);
    pending_.clear();
  }
  void run() {
    cudaSetDevice(device_);  // its queries on the ranks' device (no context on another GPU)
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::milliseconds(5));
      if (revoked_) continue;
      for (ncclComm_t c : comms_) {
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(c, &async);
        if (async != ncclSuccess && async != ncclInProgress) {
          fail_locked(nccl_error("an NCCL operation failed", async));
          break;
        }
      }
      const double now = now_seconds();
      for (auto it = pending_.begin(); !revoked_ && it != pending_.end();) {
        const NcclRequest& q = **it;
        const cudaError_t e = cudaEventQuery(q.done);
        if (e == cudaSuccess) {
          it = pending_.erase(it);
        } else if (e != cudaErrorNotReady) {
          fail_locked(cuda_error(q.desc + " failed", e));
        } else if (now - q.issued > q.timeout) {
          char secs[32];
          std::snprintf(secs, sizeof secs, "%.1f", now - q.issued);
          fail_locked(error(q.desc + " timed out after " + secs + " s on the GPU (NCCL)",
                            "one of ranks " + q.ranks +
                                " died or is stuck (or is itself waiting for a rank that did) "
                                "— check their logs; raise --comm-timeout if it is only slow"));
        } else {
          ++it;
        }
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  const int device_;
  bool stopping_ = false;
  bool revoked_ = false;
  Status failure_;
  std::vector<ncclComm_t> comms_;
  std::vector<std::shared_ptr<NcclRequest>> pending_;
  std::thread thread_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Watchdog> watchdog, ncclComm_t comm, int device,
                   cudaStream_t compute, std::vector<int> members, int rank, std::string name,
                   double timeout)
      : watchdog_(std::move(watchdog)),
        comm_(comm),
        device_(device),
        compute_(compute),
        members_(std::move(members)),
        rank_(rank),
        name_(std::move(name)),
        timeout_(timeout),
        scratch_bytes_(std::max<int64_t>(4096, 16 * static_cast<int64_t>(members_.size()))) {
    OnDevice on(device_);
    cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaMalloc(&scratch_, static_cast<size_t>(scratch_bytes_));
    watchdog_->add(comm_);
    if (e != cudaSuccess) watchdog_->fail(cuda_error("NCCL communicator '" + name_ + "'", e));
  }
  ~NcclCommunicator() override {
    OnDevice on(device_);
    if (watchdog_->failure().ok()) cudaStreamSynchronize(stream_);
    watchdog_->release(comm_);
    cudaFree(scratch_);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::string& name() const override { return name_; }
  int world_rank(int r) const override { return members_.at(static_cast<size_t>(r)); }
  MemSpace memory() const override { return MemSpace::device; }
  const char* kind() const override { return "nccl"; }
  Result<std::unique_ptr<Communicator>> split(int color, int key, std::string name) override;

  Status wait(const Request& r) override {
    NcclRequest& q = nccl_request(r);
    if (!q.status.ok()) return q.status;
    OnDevice on(device_);
    if (cudaEventQuery(q.done) == cudaSuccess) return Status();  // done: the same answer again
    TS_RETURN_IF_ERROR(watchdog_->failure());
    const cudaError_t e = cudaStreamWaitEvent(compute_, q.done, 0);
    return e == cudaSuccess ? Status() : cuda_error(q.desc, e);
  }
  bool test(const Request& r) const override {
    const NcclRequest& q = nccl_request(r);
    OnDevice on(device_);
    return !q.status.ok() || !watchdog_->failure().ok() ||
           cudaEventQuery(q.done) != cudaErrorNotReady;
  }
  Status barrier(std::string what) override {
    return all_reduce_scalar(0.0, /*max=*/false, std::move(what)).status();
  }
  Result<double> all_reduce_scalar(double x, bool max, std::string what) override {
    OnDevice on(device_);
    const int64_t moved = 8 * (size() - 1);  // as the contract counts it (communicator.h)
    Request r = enqueue(
        max ? "all_reduce_scalar(max)" : "all_reduce_scalar(sum)", what, 8, moved, moved, [&] {
          if (cudaMemcpyAsync(scratch_, &x, 8, cudaMemcpyHostToDevice, stream_) != cudaSuccess)
            return ncclUnhandledCudaError;
          return ncclAllReduce(scratch_, scratch_, 1, ncclFloat64, max ? ncclMax : ncclSum, comm_,
                               stream_);
        });
    TS_RETURN_IF_ERROR(host_wait(r));
    double sum = 0;
    cudaMemcpyAsync(&sum, scratch_, 8, cudaMemcpyDeviceToHost, stream_);
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return cuda_error("all_reduce_scalar '" + what + "'", e);
    return sum;
  }
  CommStats stats() const override {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_;
  }
  void reset_stats() override {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_ = CommStats();
  }
  void set_timeout(double seconds) override {
    TS_CHECK_GT(seconds, 0.0);
    timeout_ = seconds;
  }
  double timeout() const override { return timeout_; }

 protected:
  // Bytes each rank moves are those of NCCL's ring: 2(n-1)/n of the buffer for all_reduce,
  // (n-1)/n for reduce_scatter and all_gather, the buffer for broadcast and p2p.
  Request do_all_reduce(void* data, int64_t count, DType dt, std::string what) override {
    const int64_t bytes = count * dtype_size(dt), moved = 2 * bytes * (size() - 1) / size();
    return enqueue("all_reduce", what, bytes, moved, moved, [&] {
      return ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(dt), ncclSum, comm_,
                           stream_);
    });
  }
  Request do_reduce_scatter(const void* in, void* out, int64_t count, DType dt,
                            std::string what) override {
    const int64_t bytes = count * dtype_size(dt), moved = bytes * (size() - 1);
    return enqueue("reduce_scatter", what, bytes * size(), moved, moved, [&] {
      return ncclReduceScatter(in, out, static_cast<size_t>(count), nccl_type(dt), ncclSum, comm_,
                               stream_);
    });
  }
  Request do_all_gather(const void* in, void* out, int64_t count, DType dt,
                        std::string what) override {
    const int64_t bytes = count * dtype_size(dt), moved = bytes * (size() - 1);
    return enqueue("all_gather", what, bytes * size(), moved, moved, [&] {
      return ncclAllGather(in, out, static_cast<size_t>(count), nccl_type(dt), comm_, stream_);
    });
  }
  // Grouped point-to-point: a send to and a receive from every rank (NCCL has no all-to-all).
  Request do_all_to_all(const void* in, void* out, int64_t count, DType dt,
                        std::string what) override {
    const int64_t bytes = count * dtype_size(dt), moved = bytes * (size() - 1);
    return enqueue("all_to_all", what, bytes * size(), moved, moved, [&] {
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < size() && r == ncclSuccess; ++p) {
        r = ncclSend(static_cast<const char*>(in) + p * bytes, static_cast<size_t>(count),
                     nccl_type(dt), p, comm_, stream_);
        if (r == ncclSuccess)
          r = ncclRecv(static_cast<char*>(out) + p * bytes, static_cast<size_t>(count),
                       nccl_type(dt), p, comm_, stream_);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }
  Request do_broadcast(void* data, int64_t count, DType dt, int root, std::string what) override {
    const int64_t bytes = count * dtype_size(dt);
    // Counted as the contract's chain root, root+1, ...: every rank but the last sends.
    const bool last = (rank_ + 1) % size() == root;
    return enqueue("broadcast", what, bytes, last ? 0 : bytes, rank_ == root ? 0 : bytes, [&] {
      return ncclBroadcast(data, data, static_cast<size_t>(count), nccl_type(dt), root, comm_,
                           stream_);
    });
  }
  // Not yet: NCCL's send and recv block the GPU until the peer's matching call and match
  // by issue order, not by tag, so the contract's independent, tagged transfers need grouped
  // calls (ncclGroupStart/End) of a pipeline's whole exchange. Pipeline messages go over the
  // host communicator meanwhile.
  Request do_p2p(bool receiving, void* data, int64_t count, DType dt, int peer, int tag,
                 std::string what) override {
    (void)data, (void)count, (void)dt, (void)peer, (void)tag;
    auto req = std::make_shared<NcclRequest>();
    req->status = error(std::string(receiving ? "recv '" : "send '") + what + "' (axis " + name_ +
                            "): the NCCL communicator does not do point-to-point transfers yet",
                        "send pipeline messages over the host communicator");
    return req;
  }

 private:
  std::string others() const {
    std::string s;
    for (int i = 0; i < size(); ++i)
      if (i != rank_) s += (s.empty() ? "" : ", ") + std::to_string(members_[i]);
    return s;
  }

  // Enqueues `call` on the comm stream after the compute stream's work so far.
  Request enqueue(const char* kind, const std::string& what, int64_t bytes, int64_t sent,
                  int64_t received, const std::function<ncclResult_t()>& call) {
    OnDevice on(device_);  // the request's event on this rank's device
    auto req = std::make_shared<NcclRequest>();
    req->desc = "rank " + std::to_string(members_[rank_]) + ": " + kind + " '" + what + "' (axis " +
                name_ + ", " + std::to_string(size()) + " ranks, " +
                format_bytes(static_cast<double>(bytes)) + ")";
    req->ranks = others();
    req->timeout = timeout_;
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.collectives;
    }
    const Status failed = watchdog_->failure();
    if (!failed.ok()) {
      req->status = error(req->desc + " not run: an earlier operation failed: " + failed.message(),
                          failed.hint());
      return req;
    }
    cudaError_t e = cudaEventRecord(ready_, compute_);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream_, ready_, 0);
    if (e != cudaSuccess) {
      req->status = cuda_error(req->desc, e);
      watchdog_->fail(req->status);
      return req;
    }
    const ncclResult_t r = call();
    if (r != ncclSuccess && r != ncclInProgress) {
      req->status = nccl_error(req->desc, r);
      watchdog_->fail(req->status);
      return req;
    }
    if (const cudaError_t done = cudaEventRecord(req->done, stream_); done != cudaSuccess) {
      req->status = cuda_error(req->desc, done);
      watchdog_->fail(req->status);
      return req;
    }
    req->issued = now_seconds();
    watchdog_->watch(req);
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.bytes_sent += sent;
    stats_.bytes_received += received;
    return req;
  }

  // The host waits for the operation (blocking helpers), until the watchdog reports a failure.
  Status host_wait(const Request& r) {
    NcclRequest& q = nccl_request(r);
    if (!q.status.ok()) return q.status;
    OnDevice on(device_);
    const double start = now_seconds();
    for (;;) {
      TS_RETURN_IF_ERROR(watchdog_->failure());
      const cudaError_t e = cudaEventQuery(q.done);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) return cuda_error(q.desc, e);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.wait_seconds += now_seconds() - start;
    return Status();
  }

  std::shared_ptr<Watchdog> watchdog_;
  ncclComm_t comm_;
  int device_;  // the GPU of this rank (its streams, events, buffers)
  cudaStream_t compute_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  void* scratch_ = nullptr;
  std::vector<int> members_;  // world rank of each rank
  int rank_;
  std::string name_;
  double timeout_;
  int64_t scratch_bytes_;  // all_reduce_scalar's, and split's 16 bytes per rank
  mutable std::mutex stats_mu_;
  CommStats stats_;
};

Result<std::unique_ptr<Communicator>> NcclCommunicator::split(int color, int key,
                                                              std::string name) {
  // The new group's members, as the host communicators find them: every rank's (color, key)
  // gathered, the ranks of this one's color ordered by key, ties by rank (as ncclCommSplit).
  OnDevice on(device_);
  const int n = size();
  const int64_t mine[2] = {color, key};
  int64_t* all = static_cast<int64_t*>(scratch_);  // 16 bytes per rank: scratch_bytes_
  Request r = enqueue("split", name, 16 * n, 16 * (n - 1), 16 * (n - 1), [&] {
    if (cudaMemcpyAsync(all + 2 * rank_, mine, sizeof mine, cudaMemcpyHostToDevice, stream_) !=
        cudaSuccess)
      return ncclUnhandledCudaError;
    return ncclAllGather(all + 2 * rank_, all, 2, ncclInt64, comm_, stream_);
  });
  TS_RETURN_IF_ERROR(host_wait(r));
  std::vector<int64_t> got(2 * static_cast<size_t>(n));
  cudaMemcpyAsync(got.data(), all, got.size() * sizeof(int64_t), cudaMemcpyDeviceToHost, stream_);
  if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess)
    return cuda_error("split '" + name + "'", e);
  std::vector<int> group;
  for (int i = 0; i < n; ++i)
    if (color >= 0 && got[2 * i] == color) group.push_back(i);
  std::stable_sort(group.begin(), group.end(),
                   [&](int a, int b) { return got[2 * a + 1] < got[2 * b + 1]; });
  std::vector<int> members;
  int new_rank = -1;
  for (int i : group) {
    if (i == rank_) new_rank = static_cast<int>(members.size());
    members.push_back(members_[i]);
  }
  TS_RETURN_IF_ERROR(watchdog_->failure());  // a revoked communicator splits no more
  ncclComm_t out = nullptr;
  const ncclResult_t res =
      ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &out, nullptr);
  if (res != ncclSuccess) return nccl_error("split '" + name + "'", res);
  if (color < 0) return std::unique_ptr<Communicator>();
  return std::unique_ptr<Communicator>(new NcclCommunicator(
      watchdog_, out, device_, compute_, std::move(members), new_rank, std::move(name), timeout_));
}

}  // namespace

Result<std::unique_ptr<Communicator>> nccl_world(Communicator& host, void* compute_stream) {
  TS_CHECK(host.memory() == MemSpace::host) << "nccl_world bootstraps over a host communicator";
  // The rank groups' communicators run on streams of their own at once: NCCL orders their
  // launches as the host issued them (its documented remedy for concurrent communicators).
  setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", /*overwrite=*/0);
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    return cuda_error("nccl_world: the calling thread's device", e);
  // Rank 0's unique id, broadcast; any rank's failure fails every rank's call.
  ncclUniqueId id{};
  static_assert(sizeof id % 4 == 0);
  Status made;
  if (host.rank() == 0)
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
      made = nccl_error("ncclGetUniqueId", r);
  TS_ASSIGN_OR_RETURN(double bad, host.all_reduce_scalar(made.ok() ? 0 : 1, true, "NCCL id"));
  if (bad > 0) return made.ok() ? error("rank 0 could not make NCCL's unique id") : made;
  TS_RETURN_IF_ERROR(
      host.wait(host.broadcast(&id, sizeof id / 4, DType::i32, 0, "NCCL unique id")));
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, host.size(), id, host.rank());
  Status joined = r == ncclSuccess ? Status() : nccl_error("ncclCommInitRank", r);
  TS_ASSIGN_OR_RETURN(bad, host.all_reduce_scalar(joined.ok() ? 0 : 1, true, "NCCL init"));
  if (bad > 0) {
    if (comm) ncclCommAbort(comm);
    return joined.ok()
               ? error("another rank could not join the NCCL communicator", "see that rank's error")
               : joined;
  }
  std::vector<int> members;
  for (int i = 0; i < host.size(); ++i) members.push_back(host.world_rank(i));
  return std::unique_ptr<Communicator>(new NcclCommunicator(
      std::make_shared<Watchdog>(device), comm, device, static_cast<cudaStream_t>(compute_stream),
      std::move(members), host.rank(), "world", host.timeout()));
}

}  // namespace tessera
