#include "io/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "base/check.h"
#include "base/log.h"
#include "io/fs.h"
#include "io/toml_config.h"  // closest_match, join_strings

namespace tessera {
namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kLatest = "latest";
constexpr const char* kFormat = "tessera-checkpoint";
constexpr const char* kResumeHint =
    "the file is corrupt or truncated — resume from an earlier checkpoint";

// A plain name inside a directory: no separators, no hidden/temporary names.
bool is_plain_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name[0] != '.' &&
         name.find('\0') == std::string::npos;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

Status ckpt_error(const std::string& dir, const std::string& what, const std::string& hint) {
  return error("checkpoint " + dir + ": " + what, hint);
}

// " (the newest is step-N)" for the newest checkpoint under root, or "" when none.
std::string newest_note(const std::string& root) {
  Result<std::vector<std::string>> names = list_checkpoints(root);
  if (!names.ok() || names->empty()) return "";
  return " (the newest is " + *std::max_element(names->begin(), names->end()) + ")";
}

// The name in <root>/latest, or "" if there is no such file.
Result<std::string> read_latest(const std::string& root) {
  const std::string path = join_path(root, kLatest);
  if (!path_exists(path)) return std::string();
  TS_ASSIGN_OR_RETURN(std::string text, read_file(path));
  std::string name = trim(text);
  if (!is_plain_name(name)) {
    // Shown escaped and cut short: the file may hold anything.
    std::string shown;
    for (unsigned char c : name.substr(0, 64)) {
      if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
        shown += static_cast<char>(c);
      } else {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02x", c);
        shown += hex;
      }
    }
    if (name.size() > 64) shown += "...";
    return error("'" + path + "' holds \"" + shown +
                     "\", not the name of a checkpoint directory under " + root,
                 "write the name of one of its checkpoints into it" + newest_note(root));
  }
  return name;
}

Status exists_error(const std::string& dir) {
  return error("checkpoint " + dir + " already exists; refusing to overwrite it",
               "saved checkpoints are never replaced: if the run's 'latest' names an older "
               "checkpoint than this one, point it at the newest, or delete this one to redo "
               "its steps");
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

// ---- Writer ------------------------------------------------------------------------------

CheckpointWriter::CheckpointWriter(std::string root, std::string name,
                                   CheckpointWriteOptions options)
    : root_(std::move(root)), name_(std::move(name)), options_(options) {}

CheckpointWriter::~CheckpointWriter() {
  if (started_ && !committed_) {
    Status s = remove_all(temp_dir_);
    if (!s.ok()) {
      TS_LOG(warn) << "abandoned checkpoint: " << s.to_string();
    }
  }
}

std::string CheckpointWriter::final_dir() const { return join_path(root_, name_); }

Status CheckpointWriter::begin() {
  if (started_) return Status();
  if (!is_plain_name(name_) || name_ == kLatest) {
    return error("invalid checkpoint name '" + name_ + "' under " + root_,
                 "use a plain directory name such as checkpoint_name(step) = \"step-00000100\"");
  }
  if (path_exists(final_dir()) && !options_.overwrite) return exists_error(final_dir());
  TS_RETURN_IF_ERROR(make_dirs(root_));
  static std::atomic<int> counter{0};
  temp_dir_ = join_path(
      root_, ".tmp-" + name_ + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  TS_RETURN_IF_ERROR(remove_all(temp_dir_));  // a leftover from a crashed run with our pid
  TS_RETURN_IF_ERROR(make_dirs(temp_dir_));
  started_ = true;
  return Status();
}

Status CheckpointWriter::add_tensors(const std::string& file_name, const NamedTensorRefs& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  TS_CHECK(!committed_) << "add_tensors after commit: " << final_dir();
  if (!is_plain_name(file_name) || file_name == kManifest) {
    return error("checkpoint " + final_dir() + ": invalid file name '" + file_name + "'",
                 "use a plain file name such as \"model.safetensors\"");
  }
  if (files_.contains(file_name)) {
    return error("checkpoint " + final_dir() + ": file '" + file_name + "' added twice",
                 "put all tensors of one file in a single add_tensors call");
  }
  for (const auto& [name, t] : tensors) {
    auto it = tensor_file_.find(name);
    if (it != tensor_file_.end()) {
      return error("checkpoint " + final_dir() + ": tensor '" + name + "' in '" + file_name +
                       "' was already saved in '" + it->second + "'",
                   "tensor names must be unique across the files of a checkpoint");
    }
  }
  TS_RETURN_IF_ERROR(begin());
  uint32_t crc = 0;
  int64_t bytes = 0;
  TS_RETURN_IF_ERROR(
      save_safetensors(join_path(temp_dir_, file_name), tensors, metadata, &crc, &bytes));
  files_[file_name] = {{"bytes", bytes}, {"checksum", crc32c_hex(crc)}};
  for (const auto& [name, t] : tensors) tensor_file_[name] = file_name;
  return Status();
}

Status CheckpointWriter::commit(const nlohmann::json& manifest) {
  TS_CHECK(!committed_) << "commit twice: " << final_dir();
  if (!manifest.is_object()) {
    return error("checkpoint " + final_dir() + ": the manifest must be a JSON object, got " +
                     std::string(manifest.type_name()),
                 "pass e.g. {{\"step\", step}, {\"model\", config}}");
  }
  for (const char* key : {"files", "format", "format_version", "name"}) {
    if (manifest.contains(key)) {
      return error("checkpoint " + final_dir() + ": manifest key '" + key + "' is reserved",
                   "the writer fills it in; rename your key");
    }
  }
  TS_RETURN_IF_ERROR(begin());
  const std::string final_path = final_dir();
  if (path_exists(final_path) && !options_.overwrite) return exists_error(final_path);
  nlohmann::json m = manifest;
  m["format"] = kFormat;
  m["format_version"] = kCheckpointFormatVersion;
  m["name"] = name_;
  m["files"] = files_;
  // write_file_atomic fsyncs the file and the temporary directory.
  TS_RETURN_IF_ERROR(write_file_atomic(join_path(temp_dir_, kManifest), m.dump(2) + "\n"));

  bool published = false;
  Status s = detail::publish_checkpoint_dir(root_, name_, temp_dir_, options_, &published);
  // Once published the destructor must not touch temp_dir_ (it may hold the old checkpoint,
  // which publish_checkpoint_dir removes itself).
  if (published) committed_ = true;
  return s;
}

namespace detail {

bool is_plain_checkpoint_name(const std::string& name) { return is_plain_name(name); }

Status checkpoint_exists_error(const std::string& dir) { return exists_error(dir); }

Status publish_checkpoint_dir(const std::string& root, const std::string& name,
                              const std::string& staged_dir, const CheckpointWriteOptions& options,
                              bool* published) {
  *published = false;
  const std::string final_path = join_path(root, name);
  bool replaced = false;
  if (path_exists(final_path)) {
    if (!options.overwrite) return exists_error(final_path);
    // After the swap the old checkpoint sits at staged_dir and is deleted below.
    Status swapped = exchange_paths(staged_dir, final_path);
    if (!swapped.ok()) {
      // No RENAME_EXCHANGE on this file system: two renames. A crash between them leaves
      // the old checkpoint under staged_dir and none under the final name.
      TS_LOG(warn) << swapped.message() << "; replacing " << final_path << " in two steps";
      const std::string old_dir = staged_dir + "-old";
      TS_RETURN_IF_ERROR(remove_all(old_dir));
      TS_RETURN_IF_ERROR(rename_path(final_path, old_dir));
      Status moved = rename_no_replace(staged_dir, final_path);
      if (!moved.ok()) {
        Status restored = rename_path(old_dir, final_path);  // put the old one back
        if (!restored.ok()) {
          TS_LOG(error) << restored.to_string();
        }
        return moved;
      }
      *published = true;
      TS_RETURN_IF_ERROR(rename_path(old_dir, staged_dir));
    }
    replaced = true;
  } else {
    TS_RETURN_IF_ERROR(rename_no_replace(staged_dir, final_path));
  }
  *published = true;
  TS_RETURN_IF_ERROR(fsync_dir(root));
  if (options.update_latest) {
    TS_RETURN_IF_ERROR(write_file_atomic(join_path(root, kLatest), name + "\n"));
  }
  if (replaced) TS_RETURN_IF_ERROR(remove_all(staged_dir));
  return Status();
}

Status verify_checkpoint_file(const std::string& dir, const std::string& file_name,
                              const nlohmann::json& info, bool verify_checksum) {
  if (!is_plain_name(file_name) || file_name == kManifest || !info.is_object() ||
      !info.contains("bytes") || !info["bytes"].is_number_integer() || !info.contains("checksum") ||
      !info["checksum"].is_string()) {
    return ckpt_error(dir, "manifest.json entry for file '" + file_name + "' is malformed",
                      "expected {\"bytes\": N, \"checksum\": \"<crc32c hex>\"}");
  }
  const std::string file_path = join_path(dir, file_name);
  if (!is_regular_file(file_path)) {
    return ckpt_error(dir, "file " + file_name + " listed in manifest.json is missing",
                      "the checkpoint is incomplete — resume from an earlier checkpoint");
  }
  TS_ASSIGN_OR_RETURN(int64_t size, file_size(file_path));
  const int64_t want_size = info["bytes"].get<int64_t>();
  if (size != want_size) {
    return ckpt_error(dir,
                      "file " + file_name + " size mismatch (expected " +
                          std::to_string(want_size) + " bytes, got " + std::to_string(size) + ")",
                      kResumeHint);
  }
  if (verify_checksum) {
    TS_ASSIGN_OR_RETURN(std::string crc, file_checksum(file_path));
    const std::string want_crc = info["checksum"].get<std::string>();
    if (crc != want_crc) {
      return ckpt_error(
          dir,
          "file " + file_name + " checksum mismatch (expected " + want_crc + ", got " + crc + ")",
          kResumeHint);
    }
  }
  return Status();
}

}  // namespace detail

// ---- Finding checkpoints -----------------------------------------------------------------

Result<std::vector<std::string>> list_checkpoints(const std::string& root) {
  TS_ASSIGN_OR_RETURN(std::vector<std::string> names, list_dir(root));
  std::vector<std::string> out;
  for (const std::string& n : names) {
    if (is_plain_name(n) && is_regular_file(join_path(join_path(root, n), kManifest))) {
      out.push_back(n);
    }
  }
  return out;
}

Result<std::string> resolve_checkpoint(const std::string& path) {
  if (!path_exists(path)) {
    return error("checkpoint path '" + path + "' does not exist",
                 "pass a checkpoint root (with a 'latest' file) or a step directory");
  }
  if (is_regular_file(join_path(path, kManifest))) return path;
  TS_ASSIGN_OR_RETURN(std::string latest, read_latest(path));
  if (!latest.empty()) {
    std::string dir = join_path(path, latest);
    if (!is_regular_file(join_path(dir, kManifest))) {
      return error("'" + join_path(path, kLatest) + "' names '" + latest + "' but " + dir +
                       " has no manifest.json",
                   "the checkpoint was deleted or moved; write the name of one that is there "
                   "into 'latest'" +
                       newest_note(path));
    }
    return dir;
  }
  std::string hint = "pass a run's checkpoints/ directory or one of its step-N directories";
  Result<std::vector<std::string>> found = list_checkpoints(path);
  if (found.ok() && !found->empty()) {
    hint = "checkpoints found under it: " + join_strings(found.value()) + "; pass one of them";
  }
  return error("'" + path +
                   "' is neither a checkpoint directory (no manifest.json) nor a checkpoint "
                   "root (no 'latest' file)",
               hint);
}

// ---- Loading -----------------------------------------------------------------------------

std::vector<std::string> Checkpoint::file_names() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : files_) out.push_back(name);
  return out;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : files_) out.insert(out.end(), f.names().begin(), f.names().end());
  return out;
}

const TensorData& Checkpoint::get(const std::string& name) const {
  auto it = where_.find(name);
  TS_CHECK(it != where_.end()) << "no tensor '" << name << "' in checkpoint " << dir_;
  return files_.at(it->second).get(name);
}

Result<const TensorData*> Checkpoint::find(const std::string& name) const {
  auto it = where_.find(name);
  if (it != where_.end()) return &files_.at(it->second).get(name);
  std::string near = closest_match(name, tensor_names());
  return ckpt_error(
      dir_,
      "no tensor named '" + name + "'" + (near.empty() ? "" : " (did you mean '" + near + "'?)"),
      "the checkpoint holds " + std::to_string(where_.size()) +
          " tensors; check that it was written by the same model configuration");
}

const SafetensorsFile& Checkpoint::file(const std::string& file_name) const {
  auto it = files_.find(file_name);
  TS_CHECK(it != files_.end()) << "no file '" << file_name << "' in checkpoint " << dir_;
  return it->second;
}

Result<Checkpoint> load_checkpoint(const std::string& path, bool verify_checksums) {
  TS_ASSIGN_OR_RETURN(std::string dir, resolve_checkpoint(path));
  const std::string manifest_path = join_path(dir, kManifest);
  TS_ASSIGN_OR_RETURN(std::string text, read_file(manifest_path));
  Checkpoint ck;
  ck.dir_ = dir;
  try {
    ck.manifest_ = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return ckpt_error(dir, "manifest.json is not valid JSON: " + std::string(e.what()),
                      kResumeHint);
  }
  const nlohmann::json& m = ck.manifest_;
  if (!m.is_object() || !m.contains("format_version") || !m["format_version"].is_number_integer() ||
      !m.contains("files") || !m["files"].is_object()) {
    return ckpt_error(dir,
                      "manifest.json lacks an integer \"format_version\" or a \"files\" "
                      "object",
                      "this is not a Tessera checkpoint, or its manifest was edited");
  }
  if (m.contains("format") && m["format"] == kShardedCheckpointFormat) {
    return ckpt_error(
        dir, "is a sharded checkpoint (format \"" + std::string(kShardedCheckpointFormat) + "\")",
        "open it with ShardedCheckpoint::open (io/sharded_checkpoint.h)");
  }
  const int64_t version = m["format_version"].get<int64_t>();
  if (version > kCheckpointFormatVersion || version < 1) {
    return ckpt_error(dir,
                      "format_version " + std::to_string(version) +
                          " is not supported (this "
                          "build reads up to " +
                          std::to_string(kCheckpointFormatVersion) + ")",
                      "load it with the Tessera version that wrote it");
  }

  for (const auto& [file_name, info] : m["files"].items()) {
    TS_RETURN_IF_ERROR(detail::verify_checkpoint_file(dir, file_name, info, verify_checksums));
    const std::string file_path = join_path(dir, file_name);
    Result<SafetensorsFile> f = load_safetensors(file_path);
    if (!f.ok()) return f.status().with_context("checkpoint " + dir);
    for (const std::string& t : f->names()) {
      auto [it, inserted] = ck.where_.emplace(t, file_name);
      if (!inserted) {
        return ckpt_error(dir,
                          "tensor '" + t + "' appears in both " + it->second + " and " + file_name,
                          "tensor names must be unique across the files of a checkpoint");
      }
    }
    ck.files_.emplace(file_name, std::move(f).value());
  }
  return ck;
}

// ---- Pruning -----------------------------------------------------------------------------

Status prune_checkpoints(const std::string& root, int keep_last) {
  if (keep_last < 1) {
    return error("prune_checkpoints(" + root + "): keep_last is " + std::to_string(keep_last),
                 "keep at least the newest checkpoint: keep_last >= 1");
  }
  TS_ASSIGN_OR_RETURN(std::vector<std::string> names, list_checkpoints(root));
  TS_ASSIGN_OR_RETURN(std::string latest, read_latest(root));
  if (names.size() <= static_cast<size_t>(keep_last)) return Status();
  const size_t n_old = names.size() - static_cast<size_t>(keep_last);
  bool removed = false;
  for (size_t i = 0; i < n_old; ++i) {
    if (names[i] == latest) continue;
    const std::string dir = join_path(root, names[i]);
    const std::string doomed =
        join_path(root, ".tmp-prune-" + names[i] + "-" + std::to_string(::getpid()));
    TS_RETURN_IF_ERROR(remove_all(doomed));
    TS_RETURN_IF_ERROR(rename_path(dir, doomed));
    TS_RETURN_IF_ERROR(remove_all(doomed));
    removed = true;
  }
  if (removed) TS_RETURN_IF_ERROR(fsync_dir(root));
  return Status();
}

}  // namespace tessera
