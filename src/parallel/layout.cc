#include "parallel/layout.h"

#include <algorithm>

namespace tessera {

int64_t Box::numel() const {
  int64_t n = 1;
  for (size_t d = 0; d < lo.size(); ++d) n *= hi[d] - lo[d];
  return n;
}

Shape Box::shape() const {
  std::vector<int64_t> s(lo.size());
  for (size_t d = 0; d < lo.size(); ++d) s[d] = hi[d] - lo[d];
  return Shape(std::move(s));
}

std::string Box::to_string() const {
  std::string s = "[";
  for (size_t d = 0; d < lo.size(); ++d)
    s += (d ? ", " : "") + std::to_string(lo[d]) + ":" + std::to_string(hi[d]);
  return s + "]";
}

TensorLayout TensorLayout::replicated(Shape global, const Mesh& mesh) {
  return {std::move(global), std::vector<Placement>(mesh.axes().size()), {}};
}

namespace {

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string divisors_of(int64_t n) {
  std::vector<std::string> d;
  for (int64_t k = 1; k <= n && d.size() < 12; ++k)
    if (n % k == 0) d.push_back(std::to_string(k));
  return join(d, ", ");
}

}  // namespace

std::vector<std::string> TensorLayout::shard_axes(const Mesh& mesh, int dim) const {
  std::vector<std::string> out;
  for (size_t i = 0; i < axes.size() && i < mesh.axes().size(); ++i)
    if (axes[i].is_shard(dim)) out.push_back(mesh.axes()[i].name);
  return out;
}

int64_t TensorLayout::shard_degree(const Mesh& mesh, int dim) const {
  int64_t n = 1;
  for (size_t i = 0; i < axes.size() && i < mesh.axes().size(); ++i)
    if (axes[i].is_shard(dim)) n *= mesh.axes()[i].size;
  return n;
}

std::vector<std::string> TensorLayout::partial_axes(const Mesh& mesh) const {
  std::vector<std::string> out;
  for (size_t i = 0; i < axes.size() && i < mesh.axes().size(); ++i)
    if (axes[i].is_partial()) out.push_back(mesh.axes()[i].name);
  return out;
}

Status TensorLayout::check(const Mesh& mesh) const {
  auto what = [&] { return "layout " + to_string(mesh); };  // for the errors only
  if (axes.size() != mesh.axes().size())
    return error(what() + ": " + std::to_string(axes.size()) + " placements for a mesh of " +
                     std::to_string(mesh.axes().size()) + " axes " + mesh.to_string(),
                 "give one placement per mesh axis, in mesh order");
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i].is_shard() && (axes[i].dim < 0 || axes[i].dim >= global.rank()))
      return error(what() + ": axis '" + mesh.axes()[i].name + "' shards dim " +
                       std::to_string(axes[i].dim) + " of a rank-" + std::to_string(global.rank()) +
                       " tensor",
                   "shard a dim in [0, " + std::to_string(global.rank()) + ")");
  for (int d = 0; d < global.rank(); ++d) {
    const int64_t n = shard_degree(mesh, d);
    if (global.dim(d) % n != 0)
      return error(what() + ": dim " + std::to_string(d) + " (size " +
                       std::to_string(global.dim(d)) + ") cannot be split " + std::to_string(n) +
                       " ways over " + join(shard_axes(mesh, d), " x "),
                   "use a degree that divides " + std::to_string(global.dim(d)) + ": " +
                       divisors_of(global.dim(d)));
  }
  std::vector<std::string> seen;
  for (const std::string& a : flat_axes) {
    int i = mesh.axis_index(a);
    if (i < 0)
      return error(what() + ": flat axis '" + a + "' is not a mesh axis " + mesh.to_string());
    if (!axes[static_cast<size_t>(i)].is_replicate())
      return error(what() + ": flat axis '" + a + "' is " +
                       axes[static_cast<size_t>(i)].to_string() + ", not Replicate",
                   "a flat (ZeRO) block splits the local piece over axes that replicate it");
    if (!seen.empty() && mesh.axis_index(seen.back()) >= i)
      return error(what() + ": flat axes must be distinct and in mesh order");
    seen.push_back(a);
  }
  return Status();
}

Result<Shape> TensorLayout::local_shape(const Mesh& mesh) const {
  if (Status s = check(mesh); !s.ok()) return s;
  std::vector<int64_t> dims = global.dims();
  for (int d = 0; d < global.rank(); ++d) dims[static_cast<size_t>(d)] /= shard_degree(mesh, d);
  return Shape(std::move(dims));
}

Box TensorLayout::local_box(const Mesh& mesh, int rank) const {
  Box b;
  std::vector<int> c = mesh.coords(rank);
  for (int d = 0; d < global.rank(); ++d) {
    // Mixed radix over the sharding axes in mesh order: the first is the outermost.
    int64_t index = 0, n = 1;
    for (size_t i = 0; i < axes.size(); ++i)
      if (axes[i].is_shard(d)) {
        index = index * mesh.axes()[i].size + c[i];
        n *= mesh.axes()[i].size;
      }
    const int64_t block = global.dim(d) / n;
    b.lo.push_back(index * block);
    b.hi.push_back((index + 1) * block);
  }
  return b;
}

FlatRange TensorLayout::flat_block(const Mesh& mesh, int rank) const {
  int64_t numel = local_box(mesh, rank).numel();
  if (flat_axes.empty()) return {0, numel, numel};
  const int64_t g = mesh.group_size(flat_axes);
  const int64_t index = mesh.group_index(rank, flat_axes);
  const int64_t block = (numel + g - 1) / g;
  const int64_t offset = std::min(numel, index * block);
  return {offset, std::min(numel, offset + block) - offset, block};
}

int64_t TensorLayout::stored_numel(const Mesh& mesh) const { return flat_block(mesh, 0).block; }

namespace {

// Calls fn(offset in the whole tensor, offset in the piece, run length) for each contiguous
// run of the box (a row of its last dim).
template <typename Fn>
void for_each_run(const Shape& global, const Box& b, Fn fn) {
  const int r = global.rank();
  if (b.numel() == 0) return;
  if (r == 0) return fn(int64_t{0}, int64_t{0}, int64_t{1});
  const int64_t run = b.hi.back() - b.lo.back();
  std::vector<int64_t> i(b.lo.begin(), b.lo.end());
  for (int64_t piece = 0;; piece += run) {
    int64_t off = 0;
    for (int d = 0; d < r; ++d) off = off * global.dim(d) + i[static_cast<size_t>(d)];
    fn(off, piece, run);
    int d = r - 2;
    for (; d >= 0; --d) {
      const size_t u = static_cast<size_t>(d);
      if (++i[u] < b.hi[u]) break;
      i[u] = b.lo[u];
    }
    if (d < 0) return;
  }
}

}  // namespace

std::vector<float> box_of(const std::vector<float>& whole, const Shape& global, const Box& b) {
  std::vector<float> out(static_cast<size_t>(b.numel()));
  for_each_run(global, b, [&](int64_t w, int64_t p, int64_t n) {
    std::copy_n(whole.data() + w, n, out.data() + p);
  });
  return out;
}

void place_box(const float* piece, const Shape& global, const Box& b, float* whole) {
  for_each_run(global, b,
               [&](int64_t w, int64_t p, int64_t n) { std::copy_n(piece + p, n, whole + w); });
}

int group_member(const Mesh& mesh, int rank, const std::vector<std::string>& axes, int index) {
  std::vector<int> c = mesh.coords(rank);
  for (size_t i = mesh.axes().size(); i-- > 0;)
    if (std::count(axes.begin(), axes.end(), mesh.axes()[i].name)) {
      c[i] = index % mesh.axes()[i].size;
      index /= mesh.axes()[i].size;
    }
  return mesh.rank_of(c);
}

std::string TensorLayout::to_string(const Mesh& mesh) const {
  std::string s = global.to_string() + " {";
  for (size_t i = 0; i < axes.size(); ++i) {
    const std::string name = i < mesh.axes().size() ? mesh.axes()[i].name : "?";
    s += (i ? ", " : "") + name + ": " + axes[i].to_string();
  }
  s += "}";
  if (!flat_axes.empty()) s += " flat(" + join(flat_axes, ",") + ")";
  return s;
}

}  // namespace tessera
