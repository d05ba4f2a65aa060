#include "runtime/mesh_comms.h"

#include <algorithm>

#include "base/check.h"
#include "comm/local_comm.h"

namespace tessera {

Result<MeshComms> MeshComms::create(Communicator& world, const Plan& plan,
                                    Communicator* device_world) {
  TS_RETURN_IF_ERROR(validate(plan, world.size()));
  TS_CHECK(!device_world || device_world->size() == world.size())
      << "a device world of " << device_world->size() << " ranks beside " << world.size();
  MeshComms mc;
  mc.world_ = &world;
  mc.device_world_ = device_world;
  // Every group a Program may use: each axis, the data axes, the ZeRO axes, and the other
  // data axes (HSDP replicas). With a context axis, partial sums span it and the data axes,
  // and under sequence parallelism the tensor axes too: every combination of those axes.
  // Split in a fixed order so every rank makes the same calls.
  std::vector<std::string> keys;
  for (const MeshAxis& a : plan.mesh.axes()) keys.push_back(a.name);
  keys.push_back(axes_key(plan.data_axes));
  keys.push_back(axes_key(plan.zero_axes));
  if (!plan.replica_axes().empty()) keys.push_back(axes_key(plan.replica_axes()));
  if (plan.context_group() > 1) {
    std::vector<std::string> sums;  // the axes of more than one rank partial sums may span
    for (const std::string& a : plan.with_context_axis(plan.data_axes))
      if (plan.mesh.axis_size(a) > 1) sums.push_back(a);
    for (const std::string& t : plan.tensor_axes)
      if (plan.mesh.axis_size(t) > 1) sums.push_back(t);
    std::vector<std::string> ordered;  // mesh order
    for (const MeshAxis& a : plan.mesh.axes())
      if (std::count(sums.begin(), sums.end(), a.name)) ordered.push_back(a.name);
    for (uint32_t mask = 1; mask < (1u << ordered.size()); ++mask) {
      std::vector<std::string> group;
      for (size_t i = 0; i < ordered.size(); ++i)
        if (mask & (1u << i)) group.push_back(ordered[i]);
      keys.push_back(axes_key(group));
    }
  }
  keys.push_back(axes_key(plan.tensor_axes));
  if (plan.expert_group() > 1) {
    // Expert weights: their gradients are summed over the other data axes; they are split
    // over the expert and tensor axes.
    std::vector<std::string> others;
    for (const std::string& a : plan.data_axes)
      if (a != plan.expert_axis) others.push_back(a);
    keys.push_back(axes_key(others));
    std::vector<std::string> split;
    for (const MeshAxis& a : plan.mesh.axes())
      if (a.name == plan.expert_axis ||
          std::count(plan.tensor_axes.begin(), plan.tensor_axes.end(), a.name))
        split.push_back(a.name);
    keys.push_back(axes_key(split));
  }
  keys.push_back(axes_key(plan.grad_norm_axes()));
  // The partition pass names a partial sum's group by its axes of more than one rank: each
  // group above without its axes of one rank, too.
  const size_t named = keys.size();
  for (size_t i = 0; i < named; ++i) {
    std::vector<std::string> wide;
    for (const std::string& a : axes_of_key(keys[i]))
      if (plan.mesh.axis_size(a) > 1) wide.push_back(a);
    keys.push_back(axes_key(wide));
  }
  const int r = world.rank();
  for (const std::string& k : keys) {
    if (k.empty() || mc.groups_.count(k)) continue;
    std::vector<std::string> axes = axes_of_key(k);
    const int color = plan.mesh.group_color(r, axes), index = plan.mesh.group_index(r, axes);
    TS_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> c, world.split(color, index, k));
    mc.groups_[k] = std::move(c);
    if (!device_world) continue;
    TS_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> d, device_world->split(color, index, k));
    mc.device_groups_[k] = std::move(d);
  }
  return mc;
}

Result<MeshComms> MeshComms::single(const Plan& plan) {
  std::vector<std::unique_ptr<Communicator>> one = make_local_comms(1);
  std::shared_ptr<Communicator> world(std::move(one[0]));
  TS_ASSIGN_OR_RETURN(MeshComms mc, create(*world, plan));
  mc.own_world_ = std::move(world);
  return mc;
}

Communicator& MeshComms::group(const std::string& axes, MemSpace memory) const {
  const auto& groups = memory == MemSpace::device && device_world_ ? device_groups_ : groups_;
  auto it = groups.find(axes);
  TS_CHECK(it != groups.end()) << "no communicator for mesh axes '" << axes << "'";
  return *it->second;
}

std::vector<Communicator*> MeshComms::all() const {
  std::vector<Communicator*> out{world_};
  if (device_world_) out.push_back(device_world_);
  for (const auto& [k, c] : groups_) out.push_back(c.get());
  for (const auto& [k, c] : device_groups_) out.push_back(c.get());
  return out;
}

int64_t MeshComms::bytes_sent() const {
  int64_t b = 0;
  for (Communicator* c : all()) b += c->stats().bytes_sent;
  return b;
}

void MeshComms::reset_stats() {
  for (Communicator* c : all()) c->reset_stats();
}

void MeshComms::set_timeout(double seconds) {
  for (Communicator* c : all()) c->set_timeout(seconds);
}

void MeshComms::set_trace_sink(CommTraceSink* sink) {
  for (Communicator* c : all()) c->set_trace_sink(sink);
}

}  // namespace tessera
