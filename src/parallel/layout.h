// How one tensor lives on a device mesh (DESIGN.md "Tensor layouts and redistribution"): its
// global shape and, per mesh axis, Replicate, Shard(dim) or Partial; optionally a flat ZeRO
// block of the rank's local piece over some axes.
//
//   Mesh m({{"dp", 2}, {"tp", 4}});
//   TensorLayout w{Shape{1024, 768}, {Placement::replicate(), Placement::shard(0)}};
//   TS_ASSIGN_OR_RETURN(Shape s, w.local_shape(m));  // [256,768]
//   Box b = w.local_box(m, /*rank=*/5);                 // dp 1, tp 1: rows [256, 512)
//   TensorLayout z = w; z.flat_axes = {"dp"};           // TP x FSDP: half of the TP piece
//   FlatRange f = z.flat_block(m, 5);                   // elements [98304, 196608) of it
//
// Several axes may shard one dim: the dim is split in mesh order (the first such axis makes
// the outermost blocks), so rank coordinates (i, j) on {dp, tp} both sharding dim 0 hold
// block i * tp + j. Sharded dims must divide evenly; a dim that does not is an error naming
// the dim and the degrees that would divide it. Flat blocks are zero-padded like FlatShard:
// the flat axes' group of g ranks each hold ceil(numel / g) elements of the local piece,
// the last ones fewer or none. A flat axis must be Replicate in `axes`: the flat block splits
// a piece the axis replicates (a Partial gradient becomes a flat block by reduce-scatter).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "ir/placement.h"
#include "ir/shape.h"
#include "parallel/plan.h"

namespace tessera {

// An N-D box of a global tensor: [lo[d], hi[d]) on every dim.
struct Box {
  std::vector<int64_t> lo, hi;
  int64_t numel() const;
  Shape shape() const;
  bool operator==(const Box&) const = default;
  std::string to_string() const;  // "[0:4, 6:12]"
};

// A contiguous range of a flattened local piece.
struct FlatRange {
  int64_t offset = 0, count = 0;
  int64_t block = 0;  // elements every rank of the group holds, padding included
  bool operator==(const FlatRange&) const = default;
};

struct TensorLayout {
  Shape global;
  std::vector<Placement> axes;         // one per mesh axis, in mesh order
  std::vector<std::string> flat_axes;  // ZeRO: flat block of the local piece (mesh order)

  // Replicate on every axis of `mesh`.
  static TensorLayout replicated(Shape global, const Mesh& mesh);

  // One placement per axis, dims in range, sharded dims divisible, flat axes valid. Errors
  // name the dim, its size, the axes and the degrees that would divide it.
  Status check(const Mesh& mesh) const;
  // The local piece's shape (before the flat block), after check().
  Result<Shape> local_shape(const Mesh& mesh) const;
  // The part of the global tensor `rank` holds (before the flat block). Requires check().
  Box local_box(const Mesh& mesh, int rank) const;
  // `rank`'s block of its flattened local piece over flat_axes (the whole piece when there
  // are none). Requires check().
  FlatRange flat_block(const Mesh& mesh, int rank) const;
  // Elements `rank` stores: flat_block's block when flat, else the local piece's.
  int64_t stored_numel(const Mesh& mesh) const;

  // Mesh axes sharding `dim`, in split order (mesh order).
  std::vector<std::string> shard_axes(const Mesh& mesh, int dim) const;
  int64_t shard_degree(const Mesh& mesh, int dim) const;  // the product of their sizes
  std::vector<std::string> partial_axes(const Mesh& mesh) const;
  // "[8,6] {dp: S(0), tp: P} flat(dp)"
  std::string to_string(const Mesh& mesh) const;
  bool operator==(const TensorLayout&) const = default;
};

// Copies between a whole row-major tensor of shape `global` and the box `b` of it.
std::vector<float> box_of(const std::vector<float>& whole, const Shape& global, const Box& b);
void place_box(const float* piece, const Shape& global, const Box& b, float* whole);

// The rank whose coordinates equal `rank`'s except on `axes`, where they are the `index`-th
// member of the group over `axes` (row-major in mesh order, as Mesh::group_index counts).
int group_member(const Mesh& mesh, int rank, const std::vector<std::string>& axes, int index);

}  // namespace tessera
