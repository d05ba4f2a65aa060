// Sharded, plan-independent checkpoints: every rank writes the pieces of the tensors it
// holds, rank 0 commits, and any process can later read any piece of any tensor, so a
// checkpoint saved by 4 ranks under ZeRO-3 loads on 2 ranks under ZeRO-1 or on one, and one
// saved under tensor parallelism (each piece an N-D box of the global tensor, perhaps cut
// further into a flat ZeRO range of that box) loads under any other plan.
//
//   // Every rank: its flat range of each tensor (row-major; ranges of different ranks may
//   // overlap, e.g. a replicated tensor written by several ranks).
//   std::vector<TensorShard> shards = {
//       {"h.0.attn.qkv.weight", DType::f32, Shape{2304, 768}, off, cnt, w + off},
//       {"adam.m.h.0.attn.qkv.weight", DType::f32, Shape{2304, 768}, off, cnt, m + off}};
//   Status s = write_checkpoint_shards(root, checkpoint_name(step), rank, world, shards);
//   // the caller's barrier: every rank's outcome, e.g. the max of 0 (ok) / 1 (failed)
//   bool all_ok = comm.all_reduce_scalar(s.ok() ? 0 : 1, /*max=*/true, "ckpt").value() == 0;
//   if (rank == 0 && all_ok) {
//     TS_RETURN_IF_ERROR(commit_checkpoint_shards(root, checkpoint_name(step), world,
//                                                 {{"step", step}, {"model", cfg_json}}));
//   }
//
//   // Any process, any plan (also reads checkpoints written by CheckpointWriter):
//   TS_ASSIGN_OR_RETURN(ShardedCheckpoint ck, ShardedCheckpoint::open(root));  // or step dir
//   int64_t step = ck.manifest()["step"];
//   TS_ASSIGN_OR_RETURN(Shape shape, ck.global_shape("h.0.attn.qkv.weight"));
//   std::vector<float> mine(my_count);
//   TS_RETURN_IF_ERROR(ck.read("h.0.attn.qkv.weight", my_offset, my_count, mine.data()));
//   // A tensor-parallel piece: columns [1152, 2304), all of it.
//   TS_RETURN_IF_ERROR(ck.read_box("h.0.attn.qkv.weight", {0, 1152}, {768, 2304}, 0,
//                                  768 * 1152, mine.data()));
//
// Layout. Phase 1 writes `<root>/.tmp-<name>-shared/rank-00003.safetensors` (one 1-D entry
// per shard; the shard list {name, entry, dtype, shape, offset, count} is JSON in the
// "tessera.shards" metadata key) and then `rank-00003.json` ({"rank", "world", "bytes",
// "checksum"}), both atomically. The staging directory name is deterministic so ranks need
// not talk; it is created with mkdir -p (EEXIST tolerated). Phase 2 checks the rank files,
// drops everything else from the staging directory (the rank-*.json receipts, files of a
// crashed attempt with a larger world, temporary files), writes manifest.json and publishes
// the directory exactly like CheckpointWriter::commit (rename, fsync root, rewrite
// `latest`). manifest.json is the caller's object plus:
//   "format": "tessera-sharded-checkpoint", "format_version": 1, "name", "world",
//   "files": {"rank-00000.safetensors": {"bytes": N, "checksum": "<crc32c hex>"}, ...},
//   "tensors": {"<name>": {"dtype": "f32", "shape": [768, 2304],
//                          "shards": [{"file", "entry", "offset", "count"}, ...]}, ...}
// A shard of a box also has "box": {"lo": [0, 1152], "hi": [768, 2304]}; its offset and
// count then index the box's row-major order. format_version is 2 when any shard has a box
// (1 otherwise, which older builds read).
//
// Crash safety: as for CheckpointWriter. Until commit publishes the directory nothing exists
// under `<root>/<name>` and `latest` still names the previous checkpoint; a crashed attempt
// leaves only the `.tmp-<name>-shared` directory, which readers ignore and the next attempt
// at the same name reuses (each rank replaces its own files). Stale files of a crashed
// attempt are only safe because the caller commits after a barrier on every rank's success:
// a rank that did not write in this attempt could otherwise contribute old data.
//
// Failure behaviour: every function returns a Status / Result naming the checkpoint, the
// file and the tensor. Commit errors name the missing rank file, the tensor whose shards
// disagree on shape/dtype, or the first element that no shard covers. open() verifies every
// file's size and CRC-32C (unless disabled) and the manifest's shard lists; read() errors
// name the tensor (with a close match for unknown names) and the out-of-bounds range.
// ShardedCheckpoint is safe to read from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "ir/dtype.h"
#include "ir/shape.h"

namespace tessera {

inline constexpr int kShardedCheckpointFormatVersion = 2;  // the newest this build reads

// One rank's piece of one tensor: elements [offset, offset + count) of the flattened
// (row-major) tensor of shape `global_shape`, or, with a box, of the flattened box
// [box_lo, box_hi) of it. `data` holds count x dtype_size bytes and must stay valid during
// the call.
struct TensorShard {
  std::string name;  // e.g. "h.0.attn.qkv.weight" or "adam.m/h.0.attn.qkv.weight"
  DType dtype = DType::f32;
  Shape global_shape;
  int64_t offset = 0, count = 0;
  const void* data = nullptr;
  std::vector<int64_t> box_lo = {}, box_hi = {};  // one bound per dim, or empty: whole tensor
};

// "rank-00003.safetensors"
std::string shard_file_name(int rank);

// Phase 1, every rank (0 <= rank < world): writes this rank's shards into the staging
// directory `<root>/.tmp-<name>-shared/`, replacing this rank's files from an earlier
// attempt. A rank may hold several shards of one tensor, or none of it; shards with
// count 0 are allowed. Errors name the file (and the shard, for invalid input).
Status write_checkpoint_shards(const std::string& root, const std::string& name, int rank,
                               int world, const std::vector<TensorShard>& shards);

// Phase 2, rank 0 only, after the caller confirmed that every rank's phase 1 succeeded:
// checks that rank files 0..world-1 are all there and intact, that the shards of every
// tensor agree on dtype and global shape and together cover every element, writes
// manifest.json (`manifest` must be a JSON object without the reserved keys "files",
// "format", "format_version", "name", "tensors", "world"), publishes `<root>/<name>` and
// rewrites `<root>/latest`. Refuses to replace an existing `<root>/<name>` unless
// `overwrite`. If it fails after the directory was published (fsync of root, writing
// `latest`) the checkpoint is complete under its final name but `latest` may still name the
// previous one; if it fails before, the staging directory is left for a retry.
Status commit_checkpoint_shards(const std::string& root, const std::string& name, int world,
                                const nlohmann::json& manifest, bool overwrite = false);

class ShardedCheckpoint {
 public:
  // `path` is a checkpoint directory or a root with `latest` (see resolve_checkpoint).
  // Reads manifest.json, verifies every file's size and (unless disabled) CRC-32C, and
  // checks that each tensor's shards cover it. Checkpoints written by CheckpointWriter
  // open too: each of their tensors is one shard covering all of it. Tensor data is read
  // lazily, per file, on first use.
  static Result<ShardedCheckpoint> open(const std::string& path, bool verify_checksums = true);

  ShardedCheckpoint(ShardedCheckpoint&&) noexcept;
  ShardedCheckpoint& operator=(ShardedCheckpoint&&) noexcept;
  ~ShardedCheckpoint();

  const std::string& dir() const;
  // The whole manifest.json; the caller's keys are there.
  const nlohmann::json& manifest() const;
  // True for checkpoints written by commit_checkpoint_shards, false for CheckpointWriter's.
  bool is_sharded() const;
  // The world size it was written with (1 for CheckpointWriter checkpoints).
  int world() const;
  std::vector<std::string> tensor_names() const;  // sorted
  bool contains(const std::string& name) const;
  // Errors name the checkpoint and the tensor, with a close match if there is one.
  Result<Shape> global_shape(const std::string& name) const;
  Result<DType> dtype(const std::string& name) const;

  // Copies elements [offset, offset + count) of the flattened tensor into `out` as f32
  // (bf16 and f16 are converted; i32 tensors are an error, use read_raw), assembling the
  // range from whichever shards overlap it (one shard if a single one covers it all).
  Status read(const std::string& name, int64_t offset, int64_t count, float* out) const;
  // The same in the stored dtype: `out` receives count x dtype_size bytes.
  Status read_raw(const std::string& name, int64_t offset, int64_t count, void* out) const;
  // Elements [offset, offset + count) of the flattened box [lo, hi) of the tensor (lo and
  // hi empty: the whole tensor), whatever boxes and ranges it was saved in.
  Status read_box(const std::string& name, const std::vector<int64_t>& lo,
                  const std::vector<int64_t>& hi, int64_t offset, int64_t count, float* out) const;
  Status read_box_raw(const std::string& name, const std::vector<int64_t>& lo,
                      const std::vector<int64_t>& hi, int64_t offset, int64_t count,
                      void* out) const;

 private:
  struct Impl;
  explicit ShardedCheckpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
