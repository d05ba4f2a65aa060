// MeshComms: the communicators of a plan's rank groups, which the step runner issues its
// collectives on.
//
//   TS_ASSIGN_OR_RETURN(MeshComms comms, MeshComms::create(world, plan));  // or ::single(plan)
//   comms.group("dp").all_reduce(...);
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "parallel/plan.h"

namespace tessera {

// The communicators of a plan's rank groups, keyed by the comma-joined axes of the group
// ("dp", "dp_rep,dp_shard"), split from the world communicator (host memory) and, where given,
// from a device world too (NCCL: comm/nccl_comm.h), whose groups take the collectives of values
// in device memory without a host copy.
class MeshComms {
 public:
  static Result<MeshComms> create(Communicator& world, const Plan& plan,
                                  Communicator* device_world = nullptr);
  // One process: a world of one rank (owned), for a plan whose mesh has one rank.
  static Result<MeshComms> single(const Plan& plan);
  Communicator& world() const { return *world_; }
  // The group spanned by `axes` (a comma-joined list) that this rank belongs to, for buffers in
  // `memory`: the device world's group when there is one and memory is a device's, else the
  // host's (device values are then staged through the host).
  Communicator& group(const std::string& axes, MemSpace memory = MemSpace::host) const;
  // Bytes sent by this rank over all groups (and the world) since the last reset.
  int64_t bytes_sent() const;
  void reset_stats();
  void set_timeout(double seconds);
  // Every communicator's operations to `sink` (null: stop); Communicator::set_trace_sink.
  void set_trace_sink(CommTraceSink* sink);

 private:
  // All of this rank's communicators: the worlds and every group.
  std::vector<Communicator*> all() const;

  Communicator* world_ = nullptr;
  Communicator* device_world_ = nullptr;
  std::shared_ptr<Communicator> own_world_;  // single(): the one-rank world
  std::map<std::string, std::shared_ptr<Communicator>> groups_;
  std::map<std::string, std::shared_ptr<Communicator>> device_groups_;
};

}  // namespace tessera
