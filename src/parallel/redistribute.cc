#include "parallel/redistribute.h"

#include <algorithm>

#include "base/check.h"

namespace tessera {

const char* comm_step_name(CommStep::Kind k) {
  switch (k) {
    case CommStep::all_reduce:
      return "all_reduce";
    case CommStep::reduce_scatter:
      return "reduce_scatter";
    case CommStep::all_gather:
      return "all_gather";
    case CommStep::all_to_all:
      return "all_to_all";
    case CommStep::local_slice:
      return "local_slice";
    case CommStep::to_partial:
      return "to_partial";
    case CommStep::flat_all_gather:
      return "flat_all_gather";
    case CommStep::flat_reduce_scatter:
      return "flat_reduce_scatter";
    case CommStep::flat_slice:
      return "flat_slice";
  }
  return "?";
}

int64_t CommStep::sent_elems() const {
  const int64_t n = group;
  switch (kind) {
    case all_reduce:
      return 2 * (n - 1) * in_elems / n;
    case reduce_scatter:
    case flat_reduce_scatter:
      return (n - 1) * out_elems;
    case all_gather:
    case flat_all_gather:
      return (n - 1) * in_elems;
    case all_to_all:
      return (n - 1) * in_elems / n;
    case local_slice:
    case to_partial:
    case flat_slice:
      return 0;
  }
  return 0;
}

std::string CommStep::to_string() const {
  std::string s = comm_step_name(kind);
  s += "(";
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? "," : "") + axes[i];
  if (dim >= 0) s += ", dim " + std::to_string(dim);
  if (to_dim >= 0) s += " -> dim " + std::to_string(to_dim);
  s += "): " + in_shape.to_string() + " -> " + out_shape.to_string();
  return s;
}

int64_t sent_bytes(const std::vector<CommStep>& steps, int64_t elem_bytes) {
  int64_t n = 0;
  for (const CommStep& s : steps) n += s.sent_elems();
  return n * elem_bytes;
}

namespace {

bool is_prefix(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// Builds the steps, keeping `cur` up to date.
class Planner {
 public:
  Planner(const Mesh& mesh, TensorLayout from) : mesh_(mesh), cur_(std::move(from)) {}

  const TensorLayout& cur() const { return cur_; }
  std::vector<CommStep> take() { return std::move(steps_); }

  // Records a step from the current layout to `next`.
  void step(CommStep::Kind kind, std::vector<std::string> axes, int dim, int to_dim,
            TensorLayout next) {
    CommStep s;
    s.kind = kind;
    s.dim = dim;
    s.to_dim = to_dim;
    s.group = mesh_.group_size(axes);
    s.axes = std::move(axes);
    s.before = std::move(cur_);
    s.after = cur_ = std::move(next);
    s.in_shape = s.before.local_shape(mesh_).value();
    s.out_shape = s.after.local_shape(mesh_).value();
    s.in_elems = s.before.stored_numel(mesh_);
    s.out_elems = s.after.stored_numel(mesh_);
    steps_.push_back(std::move(s));
  }
  // The current layout with axis `a` placed as `pl`.
  TensorLayout with(const std::string& a, Placement pl) const {
    TensorLayout l = cur_;
    l.axes[static_cast<size_t>(mesh_.axis_index(a))] = pl;
    return l;
  }

 private:
  const Mesh& mesh_;
  TensorLayout cur_;
  std::vector<CommStep> steps_;
};

}  // namespace

Result<std::vector<CommStep>> redistribute(const TensorLayout& from, const TensorLayout& to,
                                           const Mesh& mesh) {
  if (Status s = from.check(mesh); !s.ok()) return s.with_context("redistribute from");
  if (Status s = to.check(mesh); !s.ok()) return s.with_context("redistribute to");
  if (from.global != to.global)
    return error("redistribute: global shapes differ, " + from.global.to_string() + " and " +
                 to.global.to_string());
  if (from == to) return std::vector<CommStep>{};
  const auto& axes = mesh.axes();
  const int rank = from.global.rank();
  Planner p(mesh, from);
  auto name = [&](size_t i) { return axes[i].name; };

  // 0. Unflatten: the flat block becomes the whole local piece again.
  if (!from.flat_axes.empty()) {
    TensorLayout whole = p.cur();
    whole.flat_axes.clear();
    p.step(CommStep::flat_all_gather, from.flat_axes, -1, -1, whole);
  }

  // Does the flat target come from one reduce-scatter of a Partial over its flat axes?
  bool flat_rs = !to.flat_axes.empty();
  for (const std::string& a : to.flat_axes) {
    const size_t i = static_cast<size_t>(mesh.axis_index(a));
    flat_rs = flat_rs && p.cur().axes[i].is_partial() && to.axes[i].is_replicate();
  }

  // 1. Shards beyond the prefix `to` keeps, innermost first: all_to_all when the axis moves to
  //    a dim where it comes next, all_gather otherwise.
  for (int d = 0; d < rank; ++d) {
    const std::vector<std::string> target = to.shard_axes(mesh, d);
    for (;;) {
      std::vector<std::string> have = p.cur().shard_axes(mesh, d);
      if (is_prefix(have, target)) break;
      const std::string a = have.back();
      const Placement want = to.axes[static_cast<size_t>(mesh.axis_index(a))];
      if (want.is_shard() && want.dim != d) {
        std::vector<std::string> next = p.cur().shard_axes(mesh, want.dim);
        next.push_back(a);
        if (is_prefix(next, to.shard_axes(mesh, want.dim))) {
          p.step(CommStep::all_to_all, {a}, d, want.dim, p.with(a, want));
          continue;
        }
      }
      p.step(CommStep::all_gather, {a}, d, -1, p.with(a, Placement::replicate()));
    }
  }
  // 2. Partial sums the target replicates (unless a flat reduce-scatter will do it).
  for (size_t i = 0; i < axes.size(); ++i)
    if (p.cur().axes[i].is_partial() && to.axes[i].is_replicate() &&
        !(flat_rs && std::count(to.flat_axes.begin(), to.flat_axes.end(), name(i))))
      p.step(CommStep::all_reduce, {name(i)}, -1, -1, p.with(name(i), Placement::replicate()));
  // 3. New shards in mesh order (each comes innermost on its dim), and new Partials.
  for (size_t i = 0; i < axes.size(); ++i) {
    const Placement have = p.cur().axes[i], want = to.axes[i];
    if (want.is_shard() && !have.is_shard(want.dim)) {
      TS_CHECK(!have.is_shard()) << "redistribute: axis " << name(i) << " still shards dim "
                                 << have.dim;
      p.step(have.is_partial() ? CommStep::reduce_scatter : CommStep::local_slice, {name(i)},
             want.dim, -1, p.with(name(i), want));
    } else if (want.is_partial() && have.is_replicate()) {
      p.step(CommStep::to_partial, {name(i)}, -1, -1, p.with(name(i), want));
    }
  }
  // 4. The flat block.
  // 4. The flat block: a reduce-scatter sums the Partial flat axes as it cuts.
  if (!to.flat_axes.empty()) {
    TensorLayout next = p.cur();
    next.flat_axes = to.flat_axes;
    if (flat_rs)
      for (const std::string& a : to.flat_axes)
        next.axes[static_cast<size_t>(mesh.axis_index(a))] = Placement::replicate();
    p.step(flat_rs ? CommStep::flat_reduce_scatter : CommStep::flat_slice, to.flat_axes, -1, -1,
           std::move(next));
  }
  TS_CHECK(p.cur() == to) << "redistribute reached " << p.cur().to_string(mesh) << ", not "
                          << to.to_string(mesh);
  return p.take();
}

}  // namespace tessera
