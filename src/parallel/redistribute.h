// The one conversion between tensor layouts (DESIGN.md "Tensor layouts and redistribution"):
// the collectives and local slices that turn a tensor laid out as `from` into `to` on a mesh.
//
//   TensorLayout partial{Shape{8, 6}, {Placement::partial()}};      // a row-parallel output
//   TensorLayout seq{Shape{8, 6}, {Placement::shard(0)}};           // sequence parallel
//   TS_ASSIGN_OR_RETURN(std::vector<CommStep> s, redistribute(partial, seq, mesh));
//   // one reduce_scatter on dim 0 over tp
//
// The table of DESIGN.md, generalized to any dim and any number of axes:
//   Partial  -> Replicate   all_reduce
//   Partial  -> Shard(d)    reduce_scatter on d
//   Shard(d) -> Replicate   all_gather on d
//   Shard(d) -> Shard(e)    all_to_all (d gathered, e scattered)
//   Replicate -> Shard(d)   local_slice (free)
//   Replicate -> Partial    to_partial (free: the group's first rank keeps the value, the
//                           others hold zeros)
//   flat (ZeRO)             flat_all_gather / flat_reduce_scatter / flat_slice of the local
//                           piece over the flat axes
// Where several axes shard one dim, the axes beyond the prefix `from` and `to` share are
// gathered innermost first and the missing ones added in mesh order, so every intermediate
// tensor is a layout (DTensor's rule). The steps are the plan; executing them is the runtime's
// (and, for tests, a dense reference's) business.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/layout.h"

namespace tessera {

struct CommStep {
  enum Kind : uint8_t {
    all_reduce,
    reduce_scatter,
    all_gather,
    all_to_all,
    local_slice,
    to_partial,
    flat_all_gather,
    flat_reduce_scatter,
    flat_slice,
  };
  Kind kind = all_reduce;
  std::vector<std::string> axes;        // the group: one axis, or the flat axes
  int dim = -1;                         // dim gathered, scattered or sliced; all_to_all: gathered
  int to_dim = -1;                      // all_to_all: the dim scattered
  TensorLayout before, after;           // the layouts on either side of the step
  int64_t group = 1;                    // ranks in one group
  Shape in_shape, out_shape;            // the local pieces (before any flat block)
  int64_t in_elems = 0, out_elems = 0;  // stored per rank (flat blocks include padding)
  // Elements each rank sends with the ring algorithms (all_reduce 2(n-1)/n of the tensor,
  // gather and scatter n-1 pieces, all_to_all (n-1)/n); local steps send nothing.
  int64_t sent_elems() const;
  bool is_local() const { return kind == local_slice || kind == to_partial || kind == flat_slice; }
  std::string to_string() const;  // "reduce_scatter(tp, dim 0): [8,6] -> [4,6]"
};

const char* comm_step_name(CommStep::Kind k);

// Both layouts are checked against `mesh` and must have the same global shape.
Result<std::vector<CommStep>> redistribute(const TensorLayout& from, const TensorLayout& to,
                                           const Mesh& mesh);

// Sum of sent_elems() over the steps, times the element size.
int64_t sent_bytes(const std::vector<CommStep>& steps, int64_t elem_bytes);

}  // namespace tessera
