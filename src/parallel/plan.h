// The device mesh and the parallelization plan of a training step.
//
//   Plan p = Plan::data_parallel(4, /*zero=*/3);         // mesh {dp: 4}, FSDP
//   Plan h = Plan::hybrid_sharded(2, 2);                 // mesh {dp_rep: 2, dp_shard: 2}
//   nlohmann::json j = plan_to_json(p);                  // printed by `tessera plan`
//   TS_ASSIGN_OR_RETURN(Plan q, plan_from_json(j));      // accepted by `tessera train --plan`
//
// Data-axis strategies are shardings (DESIGN.md "Parallelism as sharding"): the batch is
// Shard(0) on every data axis; ZeRO stage s shards, along `zero_axes`, the optimizer state
// (s >= 1), the gradients (s >= 2) and the parameters (s >= 3) — each as Shard(0) of the
// flattened tensor, zero-padded to a multiple of the group size. HSDP is ZeRO-3 whose
// zero_axes are a strict subset of the data axes: shard within a group, replicate across.
// `recompute` trades compute for activation memory (parallel/recompute.h).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tessera {

// Activation recomputation (gradient checkpointing): `none` keeps every forward activation
// for the backward pass; `full` keeps only each transformer block's input and recomputes the
// block's forward just before its backward (parallel/recompute.h).
enum class RecomputePolicy : uint8_t { none, full };

const char* recompute_name(RecomputePolicy p);  // "none", "full"
// Errors name the value and the accepted ones.
Result<RecomputePolicy> parse_recompute(std::string_view name);

struct MeshAxis {
  std::string name;
  int size = 1;
  bool operator==(const MeshAxis&) const = default;
};

// Ranks laid out row-major over the axes (the last axis varies fastest).
class Mesh {
 public:
  Mesh() = default;
  explicit Mesh(std::vector<MeshAxis> axes) : axes_(std::move(axes)) {}

  const std::vector<MeshAxis>& axes() const { return axes_; }
  int size() const;                               // number of ranks
  int axis_index(const std::string& name) const;  // -1 when absent
  int axis_size(const std::string& name) const;   // 1 when absent
  std::vector<int> coords(int rank) const;
  int rank_of(const std::vector<int>& coords) const;
  // Index of `rank` within the group spanned by `axes` (row-major over them in mesh order),
  // and the group's size. Ranks with equal coordinates on the other axes form one group.
  int group_index(int rank, const std::vector<std::string>& axes) const;
  int group_size(const std::vector<std::string>& axes) const;
  // A color identifying rank's group over `axes` (equal for ranks of one group).
  int group_color(int rank, const std::vector<std::string>& axes) const;
  std::string to_string() const;  // "{dp_rep: 2, dp_shard: 2}"
  bool operator==(const Mesh&) const = default;

 private:
  std::vector<MeshAxis> axes_;
};

struct Plan {
  Mesh mesh{{{"dp", 1}}};
  std::vector<std::string> data_axes{"dp"};  // the batch is Shard(0) over these
  std::vector<std::string> zero_axes{"dp"};  // ZeRO shards over these (subset of data_axes)
  int zero = 0;                              // 0: plain data parallel; 1, 2, 3 (FSDP)
  int micro_batches = 1;                     // gradient accumulation steps per optimizer step
  int64_t bucket_bytes = 4 << 20;            // gradient reduction bucket size
  int64_t prefetch_bytes = 16 << 20;  // FSDP: gathered parameter bytes in flight ahead of use
  RecomputePolicy recompute = RecomputePolicy::none;  // activation recomputation

  static Plan data_parallel(int n, int zero = 0);
  static Plan hybrid_sharded(int replicas, int shards);  // HSDP, ZeRO-3 within a group

  // Data axes ZeRO does not shard over: HSDP's replica groups (empty otherwise).
  std::vector<std::string> replica_axes() const;
  int zero_group() const { return mesh.group_size(zero_axes); }
  int data_group() const { return mesh.group_size(data_axes); }
  bool shards_optimizer() const { return zero >= 1 && zero_group() > 1; }
  bool shards_grads() const { return zero >= 2 && zero_group() > 1; }
  bool shards_params() const { return zero >= 3 && zero_group() > 1; }
  // "dp=4 zero=3" / "dp_rep=2 x dp_shard=2 zero=3 (HSDP)" / "dp=2 zero=0 recompute=full"
  std::string describe() const;
};

// A rank group named by its mesh axes, as collectives' attrs.name and MeshComms keys hold it:
// {"dp_rep", "dp_shard"} <-> "dp_rep,dp_shard".
std::string axes_key(const std::vector<std::string>& axes);
std::vector<std::string> axes_of_key(const std::string& key);

// Checks axis names and sizes, that data/zero axes exist and zero_axes ⊆ data_axes, the ZeRO
// stage, and (when world > 0) that the mesh has exactly `world` ranks.
Status validate(const Plan& p, int world = 0);

nlohmann::json plan_to_json(const Plan& p);
// Errors name the key; unknown keys are refused (typos would otherwise be ignored). Absent
// keys keep their defaults (a file without "recompute" loads as recompute none).
Result<Plan> plan_from_json(const nlohmann::json& j);
Result<Plan> load_plan(const std::string& path);

}  // namespace tessera
