// The in-process transport: sends copy the payload into a mailbox keyed by (channel, source,
// destination, tag) and complete at once; receives complete when a message is there.
#include "comm/local_comm.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "base/check.h"
#include "comm/comm_internal.h"

namespace tessera {
namespace {

struct LocalWorld {
  explicit LocalWorld(int n) : dead(n, false) {}
  using Key = std::tuple<uint64_t, int, int, int>;  // channel, source, destination, tag
  std::mutex mu;
  std::condition_variable cv;
  std::map<Key, std::deque<std::vector<uint8_t>>> mail;
  std::vector<bool> dead;
};

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class LocalTransport final : public detail::Transport {
 public:
  LocalTransport(std::shared_ptr<LocalWorld> world, int rank)
      : world_(std::move(world)), rank_(rank) {}

  int world_rank() const override { return rank_; }
  int world_size() const override { return static_cast<int>(world_->dead.size()); }

  Handle isend(uint64_t channel, int peer, int tag, const void* data, int64_t bytes) override {
    {
      std::lock_guard<std::mutex> lock(world_->mu);
      if (!world_->dead[rank_]) {
        const uint8_t* p = static_cast<const uint8_t*>(data);
        world_->mail[{channel, rank_, peer, tag}].emplace_back(p, p + bytes);
      }
    }
    world_->cv.notify_all();
    return next_++;  // complete at once: not in recvs_
  }

  Handle irecv(uint64_t channel, int peer, int tag, void* data, int64_t bytes) override {
    recvs_[next_] = Recv{{channel, peer, rank_, tag}, data, bytes};
    return next_++;
  }

  int test(Handle h, Status* err) override {
    auto it = recvs_.find(h);
    if (it == recvs_.end()) return 1;
    // Receives match messages in the order they were posted (as MPI's do): an earlier receive
    // of the same key takes the next message first.
    for (auto e = recvs_.begin(); e != it; ++e)
      if (e->second.key == it->second.key) return 0;
    const Recv& r = it->second;
    std::lock_guard<std::mutex> lock(world_->mu);
    auto box = world_->mail.find(r.key);
    if (box == world_->mail.end() || box->second.empty()) return 0;
    std::vector<uint8_t> msg = std::move(box->second.front());
    box->second.pop_front();
    if (box->second.empty()) world_->mail.erase(box);
    const int64_t expected = r.bytes;
    void* dst = r.data;
    recvs_.erase(it);
    if (static_cast<int64_t>(msg.size()) != expected) {
      *err = error("received " + std::to_string(msg.size()) + " bytes but expected " +
                       std::to_string(expected),
                   "every rank must issue the same collectives, in the same order, with the "
                   "same counts");
      return -1;
    }
    std::memcpy(dst, msg.data(), msg.size());
    return 1;
  }

  void abandon(Handle h) override { recvs_.erase(h); }

  void idle(int polls) override {
    std::unique_lock<std::mutex> lock(world_->mu);
    world_->cv.wait_for(lock, std::chrono::microseconds(std::min(20 * polls, 2000)));
  }

  Result<uint64_t> open_channel(uint64_t parent, int64_t split_seq, int color, int key,
                                const std::vector<int>& members) override {
    if (color < 0) return uint64_t{0};
    return mix(mix(mix(parent) ^ static_cast<uint64_t>(split_seq)) ^ static_cast<uint64_t>(color)) |
           1;
  }

  void kill() {
    std::lock_guard<std::mutex> lock(world_->mu);
    world_->dead[rank_] = true;
  }

 private:
  struct Recv {
    LocalWorld::Key key;
    void* data;
    int64_t bytes;
  };
  std::shared_ptr<LocalWorld> world_;
  int rank_;
  Handle next_ = 1;
  std::map<Handle, Recv> recvs_;  // by posting order; calls are serialized (transport.h)
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_local_comms(int n) {
  TS_CHECK_GE(n, 1);
  auto world = std::make_shared<LocalWorld>(n);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r)
    comms.push_back(detail::make_world_communicator(std::make_unique<LocalTransport>(world, r)));
  return comms;
}

void kill_local_rank(Communicator& comm) {
  auto* t = dynamic_cast<LocalTransport*>(detail::transport_of(comm));
  TS_CHECK(t != nullptr) << "kill_local_rank needs a communicator from make_local_comms";
  t->kill();
}

}  // namespace tessera
