// The sharded checkpoint format's pieces shared by its writer (sharded_checkpoint_write.cc)
// and reader (sharded_checkpoint.cc): shard descriptions, their coverage of a tensor, and the
// checks and messages of both sides. Internal to io/.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "ir/dtype.h"

namespace tessera::shard_detail {

inline constexpr const char* kManifest = "manifest.json";

inline constexpr const char* kShardsKey = "tessera.shards";  // safetensors metadata key
inline constexpr const char* kResumeHint =
    "the file is corrupt or truncated — resume from an earlier checkpoint";

inline constexpr const char* kBarrierHint =
    "every rank must call write_checkpoint_shards and succeed before rank 0 commits; check "
    "that rank's log";

// One shard as a rank file or the manifest describes it: elements [offset, offset + count)
// of the row-major order of the box [lo, hi) of the global tensor (the whole tensor when lo
// and hi are empty), stored as `count` elements in `entry` of `file`.
struct ShardDesc {
  std::string file, entry;
  std::vector<int64_t> lo, hi;
  int64_t offset = 0, count = 0;
};

// A contiguous run [offset, offset + count) of the flattened global tensor, held by shard
// `shard` starting `at` elements into its entry.
struct Segment {
  size_t shard = 0;
  int64_t offset = 0, count = 0, at = 0;
  int64_t end() const { return offset + count; }
};

struct TensorInfo {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  std::vector<ShardDesc> shards;
  std::vector<Segment> cover;  // disjoint, sorted; covers [0, numel) once complete
};

std::string staging_dir(const std::string& root, const std::string& name);

std::string receipt_name(int rank);

Status ckpt_error(const std::string& dir, const std::string& what, const std::string& hint = {});

Status check_name(const std::string& root, const std::string& name);

std::string range_string(int64_t begin, int64_t end);

// numel of a shape with non-negative dims, or nullopt (negative dim or overflow).
std::optional<int64_t> checked_numel(const std::vector<int64_t>& dims);

// "13 (index [4, 1])": a flat element index and its row-major multi-index.
std::string element_string(int64_t flat, const std::vector<int64_t>& dims);

std::string box_string(const std::vector<int64_t>& lo, const std::vector<int64_t>& hi);

std::string shard_string(const ShardDesc& s);

// Calls fn(global_offset, count, at) for each maximal run of [offset, offset + count) of the
// box [lo, hi) that is contiguous in the flattened global tensor; `at` counts from `offset`.
template <typename Fn>
void for_each_run(const std::vector<int64_t>& shape, const std::vector<int64_t>& lo,
                  const std::vector<int64_t>& hi, int64_t offset, int64_t count, Fn fn);

// What is wrong with elements [offset, offset + count) of the box [lo, hi) of `shape` (lo and
// hi empty: the whole tensor), or "".
std::string check_shard_range(const std::vector<int64_t>& shape, const std::vector<int64_t>& lo,
                              const std::vector<int64_t>& hi, int64_t offset, int64_t count);

// Reads {"offset", "count"} and the optional {"box": {"lo": [...], "hi": [...]}} of a shard
// description into s; returns what is wrong with them, or "".
std::string parse_shard_range(const nlohmann::json& d, const std::vector<int64_t>& shape,
                              ShardDesc* s);

// Builds t.cover from t.shards: of the shards holding each element, the one whose run
// reaches furthest (few file reads). Returns the first element no shard covers, or -1.
int64_t build_cover(TensorInfo& t);

Status coverage_error(const std::string& dir, const std::string& name, const TensorInfo& t,
                      int64_t missing);

nlohmann::json shard_json(const ShardDesc& s);

// Parses the "tessera.shards" metadata of one rank file and checks it against the header.
// Adds the shards to `tensors`, checking that dtype and shape agree with earlier files.
Status add_rank_file_shards(const std::string& dir, const std::string& file,
                            const SafetensorsHeader& header,
                            std::map<std::string, TensorInfo>& tensors,
                            std::map<std::string, std::string>& first_file);

}  // namespace tessera::shard_detail
