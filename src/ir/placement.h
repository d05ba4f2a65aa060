// How one tensor is laid out along one axis of a device mesh, and the arguments of an op's
// sharding rule (OpDef::sharding, defined in ops_sharding.cc).
//
//   Placement::replicate()   every rank of the axis holds the whole tensor
//   Placement::shard(0)      dim 0 is split into equal contiguous blocks, block r on rank r
//   Placement::partial()     every rank holds a full-shape addend; the tensor is their sum
//
// A rule sees the global input types and the inputs' placements along one axis of size n
// and either returns the outputs' placements (true) or refuses (false); the partition pass
// (parallel/partition.h) then converts the inputs to a pattern the op accepts. Divisibility
// of sharded dims is the pass's (an error naming the value and the degree), not the rules'.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "ir/op.h"

namespace tessera {

struct Placement {
  enum Kind : uint8_t { kReplicate, kShard, kPartial };
  Kind kind = kReplicate;
  int dim = 0;  // kShard only

  static Placement replicate() { return {kReplicate, 0}; }
  static Placement shard(int d) { return {kShard, d}; }
  static Placement partial() { return {kPartial, 0}; }
  bool is_replicate() const { return kind == kReplicate; }
  bool is_shard() const { return kind == kShard; }
  bool is_shard(int d) const { return kind == kShard && dim == d; }
  bool is_partial() const { return kind == kPartial; }
  bool operator==(const Placement&) const = default;
  // "R", "S(0)", "P"
  std::string to_string() const;
};

struct ShardingRuleArgs {
  const Attrs& attrs;
  std::span<const TensorType> in;         // global input types
  std::span<const TensorType> out;        // global output types
  std::span<const Placement> placements;  // of the inputs, along this axis
  const Placement& p(int i) const { return placements[static_cast<size_t>(i)]; }
};

}  // namespace tessera
