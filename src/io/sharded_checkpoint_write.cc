// Writing sharded checkpoints: every rank's shards (phase 1), rank 0's commit (phase 2).
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "base/log.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "io/safetensors.h"
#include "io/sharded_checkpoint.h"
#include "io/sharded_checkpoint_format.h"
#include "io/toml_config.h"  // closest_match, join_strings

namespace tessera {

using namespace shard_detail;

// ---- Phase 1: every rank -----------------------------------------------------------------

Status write_checkpoint_shards(const std::string& root, const std::string& name, int rank,
                               int world, const std::vector<TensorShard>& shards) {
  TS_RETURN_IF_ERROR(check_name(root, name));
  const std::string final_dir = join_path(root, name);
  if (world < 1 || rank < 0 || rank >= world) {
    return ckpt_error(final_dir,
                      "invalid rank " + std::to_string(rank) + " of world " + std::to_string(world),
                      "pass 0 <= rank < world");
  }
  const std::string dir = staging_dir(root, name);
  const std::string file = shard_file_name(rank);
  auto shard_error = [&](const TensorShard& s, const std::string& what) {
    return ckpt_error(final_dir,
                      "rank " + std::to_string(rank) + " (" + file + "): shard of tensor '" +
                          s.name + "' " + what,
                      "a shard is the flat range [offset, offset + count) of the row-major "
                      "tensor (or of its box [box_lo, box_hi)), with count elements at data");
  };

  // Entry names: the tensor name, or "<name>@<offset>" ("<name>@<box lo>+<offset>" for a
  // box) when this rank holds several shards of one tensor.
  std::map<std::string, int> per_tensor;
  for (const TensorShard& s : shards) ++per_tensor[s.name];
  std::set<std::string> entry_names;
  NamedTensorRefs refs;
  nlohmann::json list = nlohmann::json::array();
  for (const TensorShard& s : shards) {
    if (s.name.empty()) return shard_error(s, "has an empty name");
    if (s.box_lo.size() != s.box_hi.size() ||
        (!s.box_lo.empty() && s.box_lo.size() != s.global_shape.dims().size())) {
      return shard_error(s, "has a box with " + std::to_string(s.box_lo.size()) + " lower and " +
                                std::to_string(s.box_hi.size()) + " upper bounds for shape " +
                                shape_to_string(s.global_shape.dims()));
    }
    // A box that is the whole tensor is written as none (a format-1 shard).
    const bool whole = s.box_lo.empty() || (std::all_of(s.box_lo.begin(), s.box_lo.end(),
                                                        [](int64_t x) { return x == 0; }) &&
                                            s.box_hi == s.global_shape.dims());
    const std::vector<int64_t> lo = whole ? std::vector<int64_t>{} : s.box_lo;
    const std::vector<int64_t> hi = whole ? std::vector<int64_t>{} : s.box_hi;
    std::string bad = check_shard_range(s.global_shape.dims(), lo, hi, s.offset, s.count);
    if (!bad.empty()) return shard_error(s, bad);
    if (s.count > 0 && s.data == nullptr) return shard_error(s, "has null data");
    std::string entry = s.name;
    if (per_tensor[s.name] > 1) {
      entry += "@";
      for (size_t i = 0; i < lo.size(); ++i) entry += (i ? "," : "") + std::to_string(lo[i]);
      entry += (lo.empty() ? "" : "+") + std::to_string(s.offset);
    }
    if (!entry_names.insert(entry).second) {
      std::string box = box_string(lo, hi);
      return shard_error(s, "at offset " + std::to_string(s.offset) +
                                (box.empty() ? "" : " of box " + box) + " is given twice");
    }
    nlohmann::json d = {{"name", s.name},
                        {"entry", entry},
                        {"dtype", dtype_name(s.dtype)},
                        {"shape", s.global_shape.dims()},
                        {"offset", s.offset},
                        {"count", s.count}};
    if (!lo.empty()) d["box"] = {{"lo", lo}, {"hi", hi}};
    refs.push_back({entry, {s.dtype, {s.count}, s.data}});
    list.push_back(std::move(d));
  }

  auto context = [&](const Status& s) {
    return s.with_context("checkpoint " + final_dir + ", rank " + std::to_string(rank));
  };
  // create_directories tolerates EEXIST, so ranks racing to create it all succeed.
  Status made = make_dirs(dir);
  if (!made.ok()) return context(made);
  // Drop this rank's receipt from an earlier attempt first: a receipt is only ever next to
  // the file it describes.
  const std::string receipt = join_path(dir, receipt_name(rank));
  Status removed = remove_all(receipt);
  if (!removed.ok()) return context(removed);
  uint32_t crc = 0;
  int64_t bytes = 0;
  Status saved =
      save_safetensors(join_path(dir, file), refs, {{kShardsKey, list.dump()}}, &crc, &bytes);
  if (!saved.ok()) return context(saved);
  nlohmann::json r = {
      {"rank", rank}, {"world", world}, {"bytes", bytes}, {"checksum", crc32c_hex(crc)}};
  Status wrote = write_file_atomic(receipt, r.dump() + "\n");
  if (!wrote.ok()) return context(wrote);
  return Status();
}

// ---- Phase 2: rank 0 ---------------------------------------------------------------------

Status commit_checkpoint_shards(const std::string& root, const std::string& name, int world,
                                const nlohmann::json& manifest, bool overwrite) {
  TS_RETURN_IF_ERROR(check_name(root, name));
  const std::string final_dir = join_path(root, name);
  if (world < 1) {
    return ckpt_error(final_dir, "invalid world size " + std::to_string(world), "pass world >= 1");
  }
  if (!manifest.is_object()) {
    return ckpt_error(
        final_dir, "the manifest must be a JSON object, got " + std::string(manifest.type_name()),
        "pass e.g. {{\"step\", step}, {\"model\", config}}");
  }
  for (const char* key : {"files", "format", "format_version", "name", "tensors", "world"}) {
    if (manifest.contains(key)) {
      return ckpt_error(final_dir, "manifest key '" + std::string(key) + "' is reserved",
                        "the writer fills it in; rename your key");
    }
  }
  if (path_exists(final_dir) && !overwrite) return detail::checkpoint_exists_error(final_dir);
  const std::string dir = staging_dir(root, name);
  if (!is_directory(dir)) {
    return ckpt_error(final_dir, "no rank has written shards (" + dir + " does not exist)",
                      kBarrierHint);
  }

  nlohmann::json files = nlohmann::json::object();
  std::map<std::string, TensorInfo> tensors;
  std::map<std::string, std::string> first_file;
  std::set<std::string> keep;
  for (int rank = 0; rank < world; ++rank) {
    const std::string file = shard_file_name(rank), receipt = receipt_name(rank);
    const std::string rank_of = "rank " + std::to_string(rank) + " of " + std::to_string(world);
    if (!is_regular_file(join_path(dir, file))) {
      return ckpt_error(final_dir,
                        rank_of + " wrote no shard file (" + join_path(dir, file) + " is missing)",
                        kBarrierHint);
    }
    if (!is_regular_file(join_path(dir, receipt))) {
      return ckpt_error(final_dir,
                        rank_of + " did not finish writing " + file + " (" +
                            join_path(dir, receipt) + " is missing)",
                        kBarrierHint);
    }
    TS_ASSIGN_OR_RETURN(std::string text, read_file(join_path(dir, receipt)));
    nlohmann::json r = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!r.is_object() || !r.contains("rank") || r["rank"] != rank || !r.contains("world") ||
        !r["world"].is_number_integer() || !r.contains("bytes") ||
        !r["bytes"].is_number_integer() || !r.contains("checksum") || !r["checksum"].is_string()) {
      return ckpt_error(final_dir, "receipt " + join_path(dir, receipt) + " is malformed",
                        "delete " + dir + " and save again");
    }
    if (r["world"] != world) {
      return ckpt_error(final_dir,
                        file + " was written for world " + r["world"].dump() + ", not " +
                            std::to_string(world) + " (left by an earlier attempt?)",
                        kBarrierHint);
    }
    TS_ASSIGN_OR_RETURN(int64_t size, file_size(join_path(dir, file)));
    if (size != r["bytes"].get<int64_t>()) {
      return ckpt_error(final_dir,
                        file + " has " + std::to_string(size) + " bytes, its writer recorded " +
                            r["bytes"].dump() + " (overwritten or truncated since?)",
                        "save the checkpoint again");
    }
    Result<SafetensorsHeader> header = load_safetensors_header(join_path(dir, file));
    if (!header.ok()) return header.status().with_context("checkpoint " + final_dir);
    TS_RETURN_IF_ERROR(add_rank_file_shards(final_dir, file, *header, tensors, first_file));
    files[file] = {{"bytes", size}, {"checksum", r["checksum"]}};
    keep.insert(file);
  }

  nlohmann::json tensors_json = nlohmann::json::object();
  bool any_box = false;
  for (auto& [tname, t] : tensors) {
    int64_t missing = build_cover(t);
    if (missing >= 0) return coverage_error(final_dir, tname, t, missing);
    nlohmann::json list = nlohmann::json::array();
    for (const ShardDesc& s : t.shards) {
      any_box = any_box || !s.lo.empty();
      list.push_back(shard_json(s));
    }
    tensors_json[tname] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"shards", list}};
  }

  // Everything else in the staging directory goes: files of an attempt with a larger world,
  // temporary files of crashed writes, an old manifest. The receipts stay until the
  // directory is published, so that a failed commit can be retried.
  TS_ASSIGN_OR_RETURN(std::vector<std::string> present, list_dir(dir));
  std::vector<std::string> receipts;
  for (const std::string& entry : present) {
    if (keep.count(entry)) continue;
    bool is_receipt = false;
    for (int rank = 0; rank < world && !is_receipt; ++rank)
      is_receipt = entry == receipt_name(rank);
    if (is_receipt) {
      receipts.push_back(entry);
      continue;
    }
    TS_RETURN_IF_ERROR(remove_all(join_path(dir, entry)));
  }

  nlohmann::json m = manifest;
  m["format"] = kShardedCheckpointFormat;
  // Version 1 readers know flat ranges only; boxes need version 2.
  m["format_version"] = any_box ? kShardedCheckpointFormatVersion : 1;
  m["name"] = name;
  m["world"] = world;
  m["files"] = files;
  m["tensors"] = tensors_json;
  // write_file_atomic fsyncs the file and the staging directory; the rank files were fsynced
  // by their writers.
  TS_RETURN_IF_ERROR(write_file_atomic(join_path(dir, kManifest), m.dump(2) + "\n"));

  CheckpointWriteOptions options;
  options.overwrite = overwrite;
  bool published = false;
  Status s = detail::publish_checkpoint_dir(root, name, dir, options, &published);
  if (published) {
    // The receipts are not part of the checkpoint (readers only open what the manifest
    // lists); leaving one behind after a failure here is harmless.
    for (const std::string& r : receipts) {
      Status gone = remove_all(join_path(final_dir, r));
      if (!gone.ok()) {
        TS_LOG(warn) << gone.to_string();
      }
    }
  }
  return s;
}

}  // namespace tessera
