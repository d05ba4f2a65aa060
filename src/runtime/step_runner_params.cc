// A rank's pieces of the parameters (runtime/step_runner.h): the box of the global tensor each
// holds, which rank writes a piece into a checkpoint, their initial values and the whole
// parameters gathered from the pieces.
#include <algorithm>
#include <cstring>

#include "runtime/step_runner.h"

namespace tessera {

Box StepRunner::param_box(size_t i) const {
  return prog_.part.params[i].layout.local_box(prog_.plan.mesh, rank_);
}

std::vector<std::string> StepRunner::replicated_tensor_axes(size_t i) const {
  const Plan& plan = prog_.plan;
  std::vector<std::string> out;
  std::vector<std::string> axes = plan.tensor_axes;
  if (plan.expert_group() > 1) axes.push_back(plan.expert_axis);  // in the norm's group too
  for (const std::string& t : axes)
    if (prog_.part.params[i]
            .layout.axes[static_cast<size_t>(plan.mesh.axis_index(t))]
            .is_replicate())
      out.push_back(t);
  return out;
}

bool StepRunner::first_holder(size_t i, bool zero_sharded) const {
  const Plan& plan = prog_.plan;
  std::vector<std::string> same;  // the axes along which the rank's piece is repeated
  const ParamLayout& pl = prog_.part.params[i];
  for (const std::string& a : zero_sharded ? plan.replica_axes() : plan.data_axes)
    if (!pl.layout.axes[static_cast<size_t>(plan.mesh.axis_index(a))].is_shard())  // experts
      same.push_back(a);
  for (const std::string& t : replicated_tensor_axes(i))
    if (std::count(same.begin(), same.end(), t) == 0) same.push_back(t);
  // Parameters are replicated over a context axis, unless ZeRO shards over it.
  const bool context_sharded =
      zero_sharded && std::count(plan.zero_axes.begin(), plan.zero_axes.end(), plan.context_axis);
  if (plan.context_group() > 1 && !context_sharded) same.push_back(plan.context_axis);
  return plan.mesh.group_index(rank_, same) == 0;
}

// Each rank computes only its piece: the elements [offset, offset + count) of its box's
// row-major order, each from its index in the global tensor (initial_value).
void StepRunner::init_params(uint64_t seed) {
  for (size_t i = 0; i < prog_.part.params.size(); ++i) {
    const ParamLayout& pl = prog_.part.params[i];
    const LocalPiece pc = param_piece(i);
    const int64_t stored = exec_->graph().type(param_value(i)).shape.numel();
    std::vector<float> host(static_cast<size_t>(stored), 0.0f);  // copied to the backend below
    float* dst = host.data();
    const Box box = param_box(i);
    const Shape& gs = pl.global_shape;
    const int r = gs.rank();
    std::vector<int64_t> extent(static_cast<size_t>(r)), stride(static_cast<size_t>(r), 1);
    for (int d = 0; d < r; ++d)
      extent[static_cast<size_t>(d)] =
          box.hi[static_cast<size_t>(d)] - box.lo[static_cast<size_t>(d)];
    for (int d = r - 2; d >= 0; --d) stride[static_cast<size_t>(d)] = stride[d + 1] * gs[d + 1];
    // Runs along the box's last dim are contiguous in the global tensor too.
    const int64_t row = r > 0 ? extent[static_cast<size_t>(r - 1)] : 1;
    for (int64_t k = 0; k < pc.count;) {
      int64_t rem = pc.offset + k, global = 0;  // box-local flat index -> global flat index
      for (int d = r - 1; d >= 0; --d) {
        const size_t du = static_cast<size_t>(d);
        global += (box.lo[du] + rem % extent[du]) * stride[du];
        rem /= extent[du];
      }
      const int64_t run = std::min(pc.count - k, row - (pc.offset + k) % row);
      fill_initial_values(global_, model_index_[i], seed, global, run, dst + k);
      k += run;
    }
    state_backend().to_device(param_storage(i), dst, stored * static_cast<int64_t>(sizeof(float)));
  }
  refresh_working_params();
}

Status StepRunner::gather_params(std::vector<std::vector<float>>* whole) {
  whole->resize(prog_.part.params.size());
  const Plan& plan = prog_.plan;
  for (size_t i = 0; i < prog_.part.params.size(); ++i) {
    const ParamLayout& pl = prog_.part.params[i];
    const int64_t local = pl.local_shape.numel();
    std::vector<float>& w = (*whole)[i];
    std::vector<float> piece;
    if (!pl.params_sharded) {
      piece = read_param(i);
    } else {  // the ZeRO-3 blocks of this rank's piece
      const int group = plan.zero_group();
      const int64_t block = FlatShard{group, 0, local}.block();
      piece.assign(static_cast<size_t>(block * group), 0.0f);
      Communicator& c = comms_.group(axes_key(plan.zero_axes));
      std::vector<float> mine = read_param(i);        // host memory: the communicator's
      mine.resize(static_cast<size_t>(block), 0.0f);  // the last block's padding
      Request r = c.all_gather(mine.data(), piece.data(), block, "gather " + pl.name);
      TS_RETURN_IF_ERROR(c.wait(r));
      piece.resize(static_cast<size_t>(local));
    }
    if (pl.local_shape == pl.global_shape) {
      w = std::move(piece);
      continue;
    }
    // The pieces of the group over the axes that split it (tensor axes; the expert axis for
    // expert weights), each placed at its box.
    std::vector<std::string> split;
    for (size_t k = 0; k < plan.mesh.axes().size(); ++k)
      if (pl.layout.axes[k].is_shard()) split.push_back(plan.mesh.axes()[k].name);
    const int tg = plan.mesh.group_size(split);
    std::vector<float> all(static_cast<size_t>(local * tg));
    Communicator& c = comms_.group(axes_key(split));
    Request r = c.all_gather(piece.data(), all.data(), local, "gather " + pl.name);
    TS_RETURN_IF_ERROR(c.wait(r));
    w.assign(static_cast<size_t>(pl.global_shape.numel()), 0.0f);
    for (int k = 0; k < tg; ++k) {
      const int q = group_member(plan.mesh, rank_, split, k);
      place_box(all.data() + k * local, pl.global_shape, pl.layout.local_box(plan.mesh, q),
                w.data());
    }
  }
  return Status();
}

}  // namespace tessera
