#include "io/hf_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "io/checkpoint.h"
#include "io/fs.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "io/sharded_checkpoint.h"
#include "models/hf_format.h"

namespace tessera {

namespace {

using json = nlohmann::json;

Result<json> read_json(const std::string& path) {
  TS_ASSIGN_OR_RETURN(std::string text, read_file(path));
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    return error(path + " is not valid JSON: " + e.what());
  }
}

// The safetensors files of a model folder, as from_pretrained finds them.
Result<std::vector<std::string>> model_files(const std::string& dir) {
  const std::string index = join_path(dir, "model.safetensors.index.json");
  if (path_exists(index)) {
    TS_ASSIGN_OR_RETURN(json j, read_json(index));
    auto map = j.is_object() ? j.find("weight_map") : j.end();
    if (!j.is_object() || map == j.end() || !map->is_object())
      return error(index + ": no \"weight_map\" object",
                   "the index of a sharded checkpoint maps tensor names to files");
    std::set<std::string> files;
    for (auto it = map->begin(); it != map->end(); ++it) {
      if (!it->is_string() || it->get<std::string>().find('/') != std::string::npos)
        return error(index + ": tensor " + it.key() + " maps to " + it->dump() +
                     ", not a file name in the folder");
      files.insert(it->get<std::string>());
    }
    return std::vector<std::string>(files.begin(), files.end());
  }
  if (path_exists(join_path(dir, "model.safetensors")))
    return std::vector<std::string>{"model.safetensors"};
  return error(
      "Hugging Face folder " + dir + " has no model.safetensors or model.safetensors.index.json",
      "Tessera reads safetensors files; convert a pytorch_model.bin with "
      "save_pretrained(..., safe_serialization=True)");
}

// F32 values of a tensor stored as F32, BF16 or F16.
Result<std::vector<float>> as_f32(const std::string& file, const std::string& name,
                                  const TensorData& t) {
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  const uint8_t* b = t.bytes.data();
  switch (t.dtype) {
    case DType::f32:
      std::memcpy(out.data(), b, static_cast<size_t>(n) * 4);
      return out;
    case DType::bf16:
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, b + 2 * i, 2);
        out[i] = t.dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
      return out;
    case DType::i32:
      break;
  }
  return error(file + ": tensor " + name + " holds integers (I32), not weights",
               "the file is not a model of this architecture");
}

}  // namespace

Result<HfImport> import_hf(const std::string& hf_dir, const std::string& checkpoint_root) {
  if (!is_directory(hf_dir))
    return error("Hugging Face folder " + hf_dir + " does not exist or is not a directory",
                 "pass the folder holding config.json and model.safetensors");
  const std::string config_path = join_path(hf_dir, "config.json");
  if (!path_exists(config_path))
    return error("Hugging Face folder " + hf_dir + " has no config.json",
                 "pass the folder save_pretrained wrote (config.json and model.safetensors)");
  TS_ASSIGN_OR_RETURN(json config, read_json(config_path));
  Result<HfConfig> hc = model_config_from_hf(config);
  if (!hc.ok()) return hc.status().with_context(hf_dir);
  HfImport out;
  out.cfg = hc->cfg;
  out.unknown_keys = hc->unknown_keys;

  // Which parameter each HF key (or alias) is.
  const std::vector<HfTensor> want = hf_tensors(out.cfg);
  std::map<std::string, size_t> by_hf_name;
  for (size_t i = 0; i < want.size(); ++i) {
    by_hf_name[want[i].hf_name] = i;
    for (const std::string& a : hf_name_aliases(want[i].hf_name)) by_hf_name[a] = i;
  }
  std::vector<std::string> found_in(want.size());
  // Expert-stacked parameters (Mixtral's experts): the slices read so far, by parameter.
  std::map<std::string, std::pair<std::vector<float>, int64_t>> stacking;

  TS_ASSIGN_OR_RETURN(std::vector<std::string> files, model_files(hf_dir));
  if (path_exists(join_path(checkpoint_root, checkpoint_name(0))))
    return error("checkpoint " + join_path(checkpoint_root, checkpoint_name(0)) +
                     " already exists; refusing to overwrite it",
                 "import into a new --out, or delete the old one first");
  // A root holding anything else (a run's checkpoints/, whose `latest` the import would
  // re-point) is refused too, as export refuses a non-empty folder.
  if (path_exists(checkpoint_root)) {
    if (!is_directory(checkpoint_root))
      return error("--out " + checkpoint_root + " exists and is not a directory",
                   "import into a new --out");
    std::error_code ec;
    if (!std::filesystem::is_empty(checkpoint_root, ec))
      return error("--out " + checkpoint_root +
                       " already exists and is not an empty directory (a run's checkpoints/ "
                       "would have its `latest` re-pointed); refusing to import into it",
                   "import into a new --out, e.g. " + checkpoint_root + "-hf");
  }
  CheckpointWriter writer(checkpoint_root, checkpoint_name(0));
  for (const std::string& file : files) {
    const std::string path = join_path(hf_dir, file);
    TS_ASSIGN_OR_RETURN(SafetensorsReader reader,
                        SafetensorsReader::open(path, /*keep_other_dtypes=*/true));
    std::vector<std::pair<size_t, std::vector<float>>> converted;  // want index, data
    for (const SafetensorsEntry& e : reader.header().entries) {
      auto it = by_hf_name.find(e.name);
      if (it == by_hf_name.end()) {
        if (hf_tensor_is_skipped(out.cfg, e.name)) {
          ++out.skipped_tensors;
          continue;
        }
        return error(path + ": tensor " + e.name + " is not a parameter of " +
                         config.value("model_type", std::string("this model")) +
                         " with this config.json",
                     "Tessera's GPT-2 and LLaMA have no other parameters (no biases in "
                     "LLaMA, no extra heads); check that config.json belongs to these weights");
      }
      const HfTensor& t = want[it->second];
      if (!found_in[it->second].empty())
        return error(path + ": tensor " + e.name + " is stored twice (also in " +
                     found_in[it->second] + ")");
      found_in[it->second] = file;
      if (e.shape != t.hf_shape)
        return error(path + ": tensor " + e.name + " has shape " + shape_to_string(e.shape) +
                         ", expected " + shape_to_string(t.hf_shape) + " from config.json",
                     "check that config.json belongs to these weights");
      TS_ASSIGN_OR_RETURN(TensorData data, reader.read(e));
      TS_ASSIGN_OR_RETURN(std::vector<float> values, as_f32(path, e.name, data));
      const auto bad =
          std::find_if(values.begin(), values.end(), [](float v) { return !std::isfinite(v); });
      if (bad != values.end())
        return error(path + ": tensor " + e.name + " holds " +
                         std::to_string(std::count_if(values.begin(), values.end(),
                                                      [](float v) { return !std::isfinite(v); })) +
                         " values that are not finite (NaN or infinity), the first at element " +
                         std::to_string(bad - values.begin()),
                     "the weights are damaged; nothing was written (export them again from "
                     "the model that made them)");
      if (data.dtype != DType::f32) ++out.converted[safetensors_dtype_name(data.dtype)];
      std::vector<float> mine = hf_to_tessera(out.cfg, t, values.data());
      out.params += static_cast<int64_t>(mine.size());
      ++out.tensors;
      if (t.expert >= 0) {  // into its place in the stack; the stack is written once whole
        auto& [stack, have] = stacking[t.name];
        stack.resize(static_cast<size_t>(shape_numel(t.shape)));
        std::copy(mine.begin(), mine.end(), stack.begin() + t.expert * shape_numel(t.hf_shape));
        if (++have < t.shape[0]) continue;
        mine = std::move(stack);
        stacking.erase(t.name);
      }
      converted.emplace_back(it->second, std::move(mine));
    }
    NamedTensorRefs refs;
    for (const auto& [i, values] : converted)
      refs.push_back({want[i].name, TensorRef{DType::f32, want[i].shape, values.data()}});
    if (!refs.empty()) TS_RETURN_IF_ERROR(writer.add_tensors(file, refs));
  }
  std::vector<std::string> missing;
  for (size_t i = 0; i < want.size(); ++i)
    if (found_in[i].empty()) missing.push_back(want[i].hf_name);
  if (!missing.empty())
    return error("Hugging Face folder " + hf_dir + " lacks " + std::to_string(missing.size()) +
                     " parameter tensor(s), e.g. " + missing.front(),
                 "the weights are incomplete or belong to another config.json");
  json manifest = {{"step", 0},
                   {"model", model_config_to_json(out.cfg)},
                   {"source", {{"format", "hugging-face"}, {"dir", hf_dir}}}};
  TS_RETURN_IF_ERROR(writer.commit(manifest));
  out.checkpoint_dir = writer.final_dir();
  return out;
}

namespace {

const char* torch_dtype_name(DType d) {
  return d == DType::bf16 ? "bfloat16" : d == DType::f16 ? "float16" : "float32";
}

// `values` in `dtype`, as little-endian bytes.
std::vector<uint8_t> encode(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> out(values.size() * static_cast<size_t>(dtype_size(dtype)));
  if (dtype == DType::f32) {
    std::memcpy(out.data(), values.data(), out.size());
    return out;
  }
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t h = dtype == DType::bf16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

Status write_json(const std::string& path, const json& j) {
  TS_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::open(path));
  TS_RETURN_IF_ERROR(w.append(j.dump(2) + "\n"));
  return w.commit();
}

// Writes the folder's files into `staging`; `files` receives their names.
Status write_hf_folder(const ShardedCheckpoint& ck, const ModelConfig& cfg,
                       const HfExportOptions& opt, const std::string& staging, HfExport* out) {
  TS_ASSIGN_OR_RETURN(json config, model_config_to_hf(cfg));
  config["torch_dtype"] = torch_dtype_name(opt.dtype);
  const std::vector<HfTensor> tensors = hf_tensors(cfg);
  // Shards in parameter order, each at most max_shard_bytes (a larger tensor alone).
  std::vector<std::vector<size_t>> shards;
  int64_t in_shard = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TS_ASSIGN_OR_RETURN(Shape shape, ck.global_shape(tensors[i].name));
    if (shape.dims() != tensors[i].shape)
      return error("checkpoint " + ck.dir() + ": tensor " + tensors[i].name + " has shape " +
                   shape.to_string() + ", expected " + shape_to_string(tensors[i].shape) +
                   " for its model config");
    const int64_t bytes = shape_numel(tensors[i].hf_shape) * dtype_size(opt.dtype);
    if (shards.empty() || (in_shard > 0 && in_shard + bytes > opt.max_shard_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
  }
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    const std::string file = shards.size() == 1 ? "model.safetensors" : name;
    std::vector<std::vector<uint8_t>> data;
    NamedTensorRefs refs;
    for (size_t i : shards[s]) {
      const HfTensor& t = tensors[i];
      // (An expert's slice of an expert-stacked parameter: its rows [expert] of the stack.)
      const int64_t count = shape_numel(t.expert >= 0 ? t.hf_shape : t.shape);
      std::vector<float> whole(static_cast<size_t>(count));
      TS_RETURN_IF_ERROR(
          ck.read(t.name, std::max<int64_t>(t.expert, 0) * count, count, whole.data()));
      data.push_back(encode(tessera_to_hf(cfg, t, whole.data()), opt.dtype));
      refs.push_back({t.hf_name, TensorRef{opt.dtype, t.hf_shape, data.back().data()}});
      weight_map[t.hf_name] = file;
      out->bytes += static_cast<int64_t>(data.back().size());
      ++out->tensors;
    }
    // from_pretrained refuses safetensors files without format "pt".
    TS_RETURN_IF_ERROR(save_safetensors(join_path(staging, file), refs, {{"format", "pt"}}));
    out->files.push_back(file);
  }
  if (shards.size() > 1) {
    TS_RETURN_IF_ERROR(
        write_json(join_path(staging, "model.safetensors.index.json"),
                   {{"metadata", {{"total_size", out->bytes}}}, {"weight_map", weight_map}}));
    out->files.push_back("model.safetensors.index.json");
  }
  TS_RETURN_IF_ERROR(write_json(join_path(staging, "config.json"), config));
  out->files.push_back("config.json");
  return fsync_dir(staging);
}

}  // namespace

Result<HfExport> export_hf(const std::string& checkpoint, const std::string& hf_dir,
                           const HfExportOptions& opt) {
  if (opt.dtype == DType::i32) return error("--dtype must be f32, bf16 or f16");
  if (opt.max_shard_bytes <= 0) return error("--max-shard-bytes must be positive");
  if (path_exists(hf_dir) && !is_directory(hf_dir))
    return error("--out " + hf_dir + " is a file; export writes a folder there",
                 "pass a new --out (a folder to create)");
  if (path_exists(hf_dir)) {
    TS_ASSIGN_OR_RETURN(std::vector<std::string> entries, list_dir(hf_dir));
    if (!is_directory(hf_dir) || !entries.empty())
      return error(hf_dir +
                       " already exists and is not an empty directory; refusing to "
                       "overwrite it",
                   "pass a new --out, or remove the old one first");
  }
  TS_ASSIGN_OR_RETURN(ShardedCheckpoint ck, ShardedCheckpoint::open(checkpoint));
  if (!ck.manifest().contains("model"))
    return error("checkpoint " + ck.dir() + ": manifest.json has no model config");
  TS_ASSIGN_OR_RETURN(ModelConfig cfg, model_config_from_json(ck.manifest().at("model")));
  HfExport out;
  out.cfg = cfg;
  // Staged beside the destination, then renamed into place: a failure leaves nothing.
  const std::string staging =
      join_path(parent_dir(hf_dir), ".tmp-" + base_name(hf_dir) + "-" + std::to_string(::getpid()));
  TS_RETURN_IF_ERROR(remove_all(staging));
  TS_RETURN_IF_ERROR(make_dirs(staging));
  Status s = write_hf_folder(ck, cfg, opt, staging, &out);
  if (s.ok()) s = rename_path(staging, hf_dir);  // replaces an empty directory
  if (s.ok()) s = fsync_dir(parent_dir(hf_dir));
  if (!s.ok()) {
    (void)remove_all(staging);
    return s;
  }
  return out;
}

}  // namespace tessera
