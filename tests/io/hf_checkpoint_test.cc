// `import hf` / `export hf` on bad and unusual folders: each gets one error naming the file
// and the key or tensor, and leaves nothing behind. (The golden equivalence with PyTorch is
// tests/runtime/hf_golden_test.cc.)
#include "io/hf_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "models/hf_format.h"
#include "test_util.h"

namespace tessera {
namespace {

using testing::contains;
using testing::TempDir;
namespace fs = std::filesystem;

const std::string kGolden = std::string(TESSERA_SOURCE_DIR) + "/tests/golden/hf/";

// A copy of a golden folder to break.
std::string copy_golden(const TempDir& tmp, const std::string& name) {
  const std::string dir = tmp / name;
  fs::copy(kGolden + name, dir, fs::copy_options::recursive);
  return dir;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump(2);
}

// The F32 tensors of a golden file, in file order (the U8 mask buffers left out).
std::vector<std::pair<std::string, TensorData>> f32_tensors(const std::string& path) {
  SafetensorsReader r = SafetensorsReader::open(path, /*keep_other_dtypes=*/true).value();
  std::vector<std::pair<std::string, TensorData>> out;
  for (const SafetensorsEntry& e : r.header().entries)
    if (e.other_dtype.empty()) out.emplace_back(e.name, r.read(e).value());
  return out;
}

Status import_error(const std::string& dir, const TempDir& tmp) {
  Result<HfImport> r = import_hf(dir, tmp / "ckpt");
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(fs::exists(tmp / "ckpt/step-00000000")) << "a failed import left a checkpoint";
  return r.ok() ? Status() : r.status();
}

TEST(HfCheckpoint, MissingFolderConfigOrWeightsAreNamed) {
  TempDir tmp;
  EXPECT_TRUE(contains(import_error(tmp / "nope", tmp), "does not exist"));
  fs::create_directories(tmp / "empty");
  EXPECT_TRUE(contains(import_error(tmp / "empty", tmp), "has no config.json"));
  const std::string dir = copy_golden(tmp, "gpt2");
  fs::rename(dir + "/model.safetensors", dir + "/pytorch_model.bin");
  Status s = import_error(dir, tmp);
  EXPECT_TRUE(contains(s, "no model.safetensors")) << s.to_string();
  EXPECT_TRUE(s.to_string().find("safe_serialization") != std::string::npos);
  std::ofstream(dir + "/config.json") << "{not json";
  EXPECT_TRUE(contains(import_error(dir, tmp), "not valid JSON"));
}

TEST(HfCheckpoint, ConfigThatDoesNotMatchTheWeightsIsRefused) {
  TempDir tmp;
  const std::string dir = copy_golden(tmp, "gpt2");
  nlohmann::json cfg = read_json(dir + "/config.json");
  cfg["vocab_size"] = 500;
  write_json(dir + "/config.json", cfg);
  Status s = import_error(dir, tmp);
  EXPECT_TRUE(contains(s, "transformer.wte.weight has shape (512, 64), expected (500, 64)"))
      << s.to_string();
  cfg["vocab_size"] = 512;
  cfg["n_layer"] = 3;
  write_json(dir + "/config.json", cfg);
  s = import_error(dir, tmp);
  EXPECT_TRUE(contains(s, "lacks 12 parameter tensor(s), e.g. transformer.h.2.ln_1.weight"))
      << s.to_string();
  cfg["n_layer"] = 1;
  write_json(dir + "/config.json", cfg);
  s = import_error(dir, tmp);
  EXPECT_TRUE(contains(s, "transformer.h.1.ln_1.weight is not a parameter")) << s.to_string();
  cfg["n_layer"] = 2;
  cfg["activation_function"] = "relu";
  write_json(dir + "/config.json", cfg);
  EXPECT_TRUE(contains(import_error(dir, tmp), "activation_function"));
}

TEST(HfCheckpoint, TruncatedAndIntegerTensorsAreRefused) {
  TempDir tmp;
  const std::string dir = copy_golden(tmp, "llama");
  const std::string shard = dir + "/model-00002-of-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  Status s = import_error(dir, tmp);
  EXPECT_TRUE(contains(s, "run past the end of the data")) << s.to_string();
  EXPECT_TRUE(contains(s, "model-00002-of-00002.safetensors")) << s.to_string();

  const std::string gpt = copy_golden(tmp, "gpt2");
  auto tensors = f32_tensors(gpt + "/model.safetensors");
  NamedTensorRefs refs;
  std::vector<int32_t> ints(64, 1);
  for (const auto& [name, t] : tensors)
    if (name != "transformer.ln_f.bias") refs.push_back({name, t.ref()});
  refs.push_back({"transformer.ln_f.bias", TensorRef{DType::i32, {64}, ints.data()}});
  ASSERT_TRUE(save_safetensors(gpt + "/model.safetensors", refs).ok());
  s = import_error(gpt, tmp);
  EXPECT_TRUE(contains(s, "transformer.ln_f.bias holds integers")) << s.to_string();
}

// A tensor holding NaN or infinity is refused by name, and nothing is written (an import of
// NaN weights used to succeed and `sample` printed garbage: bad-inputs-7d08d5e N5).
TEST(HfCheckpoint, NonFiniteWeightsAreRefusedByName) {
  TempDir tmp;
  const std::string gpt = copy_golden(tmp, "gpt2");
  auto tensors = f32_tensors(gpt + "/model.safetensors");
  NamedTensorRefs refs;
  std::vector<float> bad;
  for (const auto& [name, t] : tensors) {
    if (name != "transformer.h.0.mlp.c_fc.weight") {
      refs.push_back({name, t.ref()});
      continue;
    }
    const float* x = reinterpret_cast<const float*>(t.bytes.data());
    bad.assign(x, x + t.numel());
    bad[5] = std::nanf("");
    bad[9] = INFINITY;
    refs.push_back({name, TensorRef{DType::f32, t.shape, bad.data()}});
  }
  ASSERT_TRUE(save_safetensors(gpt + "/model.safetensors", refs).ok());
  Status s = import_error(gpt, tmp);
  EXPECT_TRUE(contains(s,
                       "tensor transformer.h.0.mlp.c_fc.weight holds 2 values that are not "
                       "finite (NaN or infinity), the first at element 5"))
      << s.to_string();
}

// A root holding other checkpoints (a run's checkpoints/) is refused: the import would re-point
// its `latest` (N4). Its contents stay as they were.
TEST(HfCheckpoint, ARootHoldingOtherCheckpointsIsRefused) {
  TempDir tmp;
  const std::string run = tmp / "run/checkpoints";
  fs::create_directories(run + "/step-00000004");
  std::ofstream(run + "/latest") << "step-00000004";
  Result<HfImport> r = import_hf(kGolden + "gpt2", run);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status(), "already exists and is not an empty directory"))
      << r.status().to_string();
  EXPECT_FALSE(fs::exists(run + "/step-00000000"));
  std::ifstream latest(run + "/latest");
  std::string named;
  latest >> named;
  EXPECT_EQ(named, "step-00000004");
  fs::create_directories(tmp / "empty");  // an empty directory is a fine root
  EXPECT_TRUE(import_hf(kGolden + "gpt2", tmp / "empty").ok());
}

// F16 weights (and a file saved from GPT2Model, without "transformer.") convert exactly.
TEST(HfCheckpoint, HalfPrecisionAndUnprefixedNamesAreConverted) {
  TempDir tmp;
  const std::string dir = copy_golden(tmp, "gpt2");
  auto tensors = f32_tensors(dir + "/model.safetensors");
  std::vector<std::vector<uint16_t>> halves;
  NamedTensorRefs refs;
  for (const auto& [name, t] : tensors) {
    const float* x = reinterpret_cast<const float*>(t.bytes.data());
    halves.emplace_back(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) halves.back()[i] = f32_to_f16(x[i]);
    refs.push_back({name.substr(std::string("transformer.").size()),
                    TensorRef{DType::f16, t.shape, halves.back().data()}});
  }
  ASSERT_TRUE(save_safetensors(dir + "/model.safetensors", refs).ok());
  Result<HfImport> r = import_hf(dir, tmp / "ckpt");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->converted.at("F16"), 28);
  Checkpoint ck = load_checkpoint(tmp / "ckpt").value();
  const TensorData& bias = ck.get("h.1.attn.proj.bias");
  const TensorData* want_ptr = nullptr;
  for (const auto& [name, t] : tensors)
    if (name == "transformer.h.1.attn.c_proj.bias") want_ptr = &t;
  ASSERT_NE(want_ptr, nullptr);
  const TensorData& want = *want_ptr;
  for (int64_t i = 0; i < bias.numel(); ++i) {
    const float w = reinterpret_cast<const float*>(want.bytes.data())[i];
    EXPECT_EQ(reinterpret_cast<const float*>(bias.bytes.data())[i], f16_to_f32(f32_to_f16(w)));
  }
}

TEST(HfCheckpoint, NothingIsOverwrittenOrLeftBehind) {
  TempDir tmp;
  ASSERT_TRUE(import_hf(kGolden + "gpt2", tmp / "ckpt").ok());
  Result<HfImport> again = import_hf(kGolden + "gpt2", tmp / "ckpt");
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(contains(again.status(), "already exists")) << again.status().to_string();

  fs::create_directories(tmp / "out");
  std::ofstream(tmp / "out/notes.txt") << "mine";
  Result<HfExport> e = export_hf(tmp / "ckpt", tmp / "out");
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(contains(e.status(), "not an empty directory")) << e.status().to_string();
  EXPECT_TRUE(fs::exists(tmp / "out/notes.txt"));
  std::ofstream(tmp / "afile") << "mine";  // a file: said so, not "cannot list directory"
  Result<HfExport> f = export_hf(tmp / "ckpt", tmp / "afile");
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(contains(f.status(), "is a file; export writes a folder")) << f.status().to_string();
  EXPECT_FALSE(export_hf(tmp / "ckpt", tmp / "x", {DType::i32}).ok());
  EXPECT_FALSE(export_hf(tmp / "nope", tmp / "y").ok());
  for (const auto& entry : fs::directory_iterator(tmp.path()))
    EXPECT_NE(entry.path().filename().string().rfind(".tmp-", 0), 0u) << entry.path();
  // An empty directory is a fine destination.
  fs::create_directories(tmp / "empty");
  Result<HfExport> ok = export_hf(tmp / "ckpt", tmp / "empty");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_TRUE(fs::exists(tmp / "empty/config.json"));
}

// A tiny Mixtral folder: each expert's w1/w3/w2 HF tensor becomes its rows of Tessera's
// stacked experts (whichever file holds it), and an export writes them back as they were.
TEST(HfCheckpoint, MixtralExpertsStackOnImportAndSplitOnExport) {
  TempDir tmp;
  ModelConfig c = *find_preset("moe-tiny");
  c.vocab_size = 97;
  c.n_embd = 16;
  c.n_head = 2;
  c.n_kv_head = 1;
  c.ffn_hidden = 8;
  c.n_experts = 4;
  c.capacity_factor = 2.0;  // 4 experts / 2 per token: drops nothing, as HF's Mixtral
  ASSERT_TRUE(validate(c).ok()) << validate(c).to_string();
  const std::string dir = tmp / "hf";
  fs::create_directories(dir);
  write_json(dir + "/config.json", model_config_to_hf(c).value());
  std::map<std::string, std::vector<float>> values;  // by HF name
  NamedTensorRefs first, second;                     // the tensors over two files: stacks span both
  int k = 0;
  for (const HfTensor& t : hf_tensors(c)) {
    std::vector<float>& v = values[t.hf_name];
    int64_t n = 1;
    for (int64_t d : t.hf_shape) n *= d;
    for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<float>(k * 1000 + i) * 1e-3f);
    (k++ % 2 ? second : first).push_back({t.hf_name, TensorRef{DType::f32, t.hf_shape, v.data()}});
  }
  Status saved = save_safetensors(dir + "/model-00001-of-00002.safetensors", first);
  ASSERT_TRUE(saved.ok()) << saved.to_string();
  saved = save_safetensors(dir + "/model-00002-of-00002.safetensors", second);
  ASSERT_TRUE(saved.ok()) << saved.to_string();
  nlohmann::json map;
  for (const auto& [refs, file] : {std::pair{&first, "model-00001-of-00002.safetensors"},
                                   std::pair{&second, "model-00002-of-00002.safetensors"}})
    for (const auto& [name, ref] : *refs) map[name] = file;
  write_json(dir + "/model.safetensors.index.json", {{"weight_map", map}});
  Result<HfImport> r = import_hf(dir, tmp / "ckpt");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->cfg.n_experts, 4);
  Checkpoint ck = load_checkpoint(tmp / "ckpt").value();
  const TensorData& down = ck.get("h.1.moe.experts.down");
  ASSERT_EQ(down.shape, (std::vector<int64_t>{4, 16, 8}));
  const std::vector<float>& w2 = values.at("model.layers.1.block_sparse_moe.experts.2.w2.weight");
  const float* stacked = reinterpret_cast<const float*>(down.bytes.data());
  for (size_t i = 0; i < w2.size(); ++i) ASSERT_EQ(stacked[2 * 16 * 8 + i], w2[i]) << i;
  Result<HfExport> e = export_hf(tmp / "ckpt", tmp / "out", {DType::f32, 4096});
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ(read_json(tmp / "out/config.json")["model_type"], "mixtral");
  std::map<std::string, std::vector<float>> back;
  for (const auto& entry : fs::directory_iterator(tmp / "out"))
    if (entry.path().extension() == ".safetensors")
      for (auto& [name, t] : f32_tensors(entry.path().string())) {
        const float* x = reinterpret_cast<const float*>(t.bytes.data());
        back[name].assign(x, x + t.numel());
      }
  EXPECT_EQ(back, values);
}

}  // namespace
}  // namespace tessera
