// Training checkpoints: one directory per checkpoint, `<root>/step-00000100/`, holding
// one or more safetensors files and `manifest.json`, plus `<root>/latest` naming the
// newest directory.
//
//   CheckpointWriter w(root, checkpoint_name(step));            // "step-00000100"
//   TS_RETURN_IF_ERROR(w.add_tensors("model.safetensors", {{"wte", {DType::f32, {V, C}, p}}}));
//   TS_RETURN_IF_ERROR(w.add_tensors("optim.safetensors", adam_state));
//   TS_RETURN_IF_ERROR(w.commit({{"step", step}, {"model", cfg_json}, {"rng", rng_state}}));
//   TS_RETURN_IF_ERROR(prune_checkpoints(root, /*keep_last=*/3));
//
//   TS_ASSIGN_OR_RETURN(Checkpoint ckpt, load_checkpoint(root));   // root or step dir
//   int64_t step = ckpt.manifest()["step"];
//   const TensorData& wte = ckpt.get("wte");
//
// manifest.json is the caller's JSON object plus, added by the writer:
//   "format": "tessera-checkpoint", "format_version": 1, "name": "<dir name>",
//   "files": {"model.safetensors": {"bytes": N, "checksum": "<crc32c hex>"}, ...}
//
// Crash safety. Files are written into `<root>/.tmp-<name>-<pid>-<n>/`, each fsynced, then
// the directory; it is renamed to `<root>/<name>`, root is fsynced, and only then is
// `latest` rewritten atomically. A kill at any point leaves the previous checkpoint
// loadable through `latest`, and never a partial directory under a final name (stray
// `.tmp-*` directories are ignored by readers and may be deleted).
//
// Failure behaviour: all functions return Status/Result naming the directory and file.
// commit() refuses to replace an existing `<root>/<name>` unless `overwrite` was set, in
// which case the old directory is swapped out atomically (renameat2 RENAME_EXCHANGE). A
// writer destroyed before commit() removes its temporary directory. load_checkpoint
// verifies every file's size and CRC-32C against the manifest before parsing it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "io/safetensors.h"

namespace tessera {

inline constexpr int kCheckpointFormatVersion = 1;
// The "format" of checkpoints written by commit_checkpoint_shards (sharded_checkpoint.h);
// load_checkpoint refuses them.
inline constexpr const char* kShardedCheckpointFormat = "tessera-sharded-checkpoint";

// "step-00000100"; names sort in step order up to 10^8 steps.
std::string checkpoint_name(int64_t step);

struct CheckpointWriteOptions {
  bool overwrite = false;     // replace an existing checkpoint of the same name
  bool update_latest = true;  // rewrite <root>/latest after the directory is in place
};

class CheckpointWriter {
 public:
  CheckpointWriter(std::string root, std::string name, CheckpointWriteOptions options = {});
  ~CheckpointWriter();  // removes the temporary directory unless committed
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Writes one safetensors file into the temporary directory. `file_name` is a plain file
  // name (no '/', not "manifest.json", not starting with '.'), unique in this checkpoint;
  // tensor names must be unique across all files. The first call creates the root and the
  // temporary directory, and fails early if the checkpoint already exists (no overwrite).
  Status add_tensors(const std::string& file_name, const NamedTensorRefs& tensors,
                     const std::map<std::string, std::string>& metadata = {});

  // Writes manifest.json (`manifest` must be a JSON object without the reserved keys
  // "files", "format", "format_version", "name"), publishes the directory and updates
  // `latest`. Call at most once. A checkpoint with no tensor files is allowed. If it fails
  // after the directory was published (fsync of root, writing `latest`), the checkpoint is
  // complete under its final name but `latest` may still name the previous one.
  Status commit(const nlohmann::json& manifest);

  const std::string& root() const { return root_; }
  const std::string& name() const { return name_; }
  std::string final_dir() const;
  const std::string& temp_dir() const { return temp_dir_; }

 private:
  Status begin();

  std::string root_, name_, temp_dir_;
  CheckpointWriteOptions options_;
  bool started_ = false, committed_ = false, failed_ = false;
  nlohmann::json files_ = nlohmann::json::object();
  std::map<std::string, std::string> tensor_file_;  // tensor name -> file name
};

// `path` is either a checkpoint directory (has manifest.json) -> returned as is, or a root
// with a `latest` file -> `<path>/<contents of latest>`. Errors say which was missing.
Result<std::string> resolve_checkpoint(const std::string& path);

// Names of the committed checkpoints under `root` (directories with manifest.json, not
// starting with '.'), sorted by name.
Result<std::vector<std::string>> list_checkpoints(const std::string& root);

class Checkpoint {
 public:
  const std::string& dir() const { return dir_; }
  const nlohmann::json& manifest() const { return manifest_; }
  // Safetensors file names, sorted; tensors in file order within each file.
  std::vector<std::string> file_names() const;
  std::vector<std::string> tensor_names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }

  const TensorData& get(const std::string& name) const;  // TS_CHECK if absent
  // Error naming the checkpoint and the tensor (with a close match) if absent.
  Result<const TensorData*> find(const std::string& name) const;
  const SafetensorsFile& file(const std::string& file_name) const;  // TS_CHECK if absent

 private:
  friend Result<Checkpoint> load_checkpoint(const std::string& path, bool verify_checksums);
  std::string dir_;
  nlohmann::json manifest_;
  std::map<std::string, SafetensorsFile> files_;
  std::map<std::string, std::string> where_;  // tensor name -> file name
};

// Resolves `path` (see resolve_checkpoint), reads manifest.json, checks every listed
// file's size and (unless disabled) CRC-32C, then loads the tensors. Errors:
//   checkpoint DIR: file X checksum mismatch (expected ..., got ...); HINT: the file is
//   corrupt or truncated — resume from an earlier checkpoint
Result<Checkpoint> load_checkpoint(const std::string& path, bool verify_checksums = true);

// Deletes committed checkpoints under `root` beyond the newest `keep_last` (by name), never
// the newest one and never the one `latest` names. Each is renamed to a `.tmp-` name
// before removal so a crash mid-delete leaves no half-deleted checkpoint under its name.
// keep_last must be >= 1.
Status prune_checkpoints(const std::string& root, int keep_last);

// Building blocks shared with the sharded checkpoints (sharded_checkpoint.h).
namespace detail {

// A plain directory entry name: no '/', not starting with '.', not empty.
bool is_plain_checkpoint_name(const std::string& name);
// "checkpoint DIR already exists; refusing to overwrite it" with a hint.
Status checkpoint_exists_error(const std::string& dir);
// Publishes `staged_dir` (complete, fsynced, manifest.json written) as `<root>/<name>`
// exactly as CheckpointWriter::commit does: rename (or atomic swap when
// options.overwrite), fsync root, then rewrite `latest` if options.update_latest.
// `*published` is set once the directory is in place under its final name; after that
// `staged_dir` must not be touched by the caller.
Status publish_checkpoint_dir(const std::string& root, const std::string& name,
                              const std::string& staged_dir, const CheckpointWriteOptions& options,
                              bool* published);
// Checks `<dir>/<file_name>` against its manifest.json "files" entry `info` ({"bytes",
// "checksum"}): well-formed entry, file present, size, and (if asked) CRC-32C. Errors are
// the ones load_checkpoint gives.
Status verify_checkpoint_file(const std::string& dir, const std::string& file_name,
                              const nlohmann::json& info, bool verify_checksum);

}  // namespace detail

}  // namespace tessera
