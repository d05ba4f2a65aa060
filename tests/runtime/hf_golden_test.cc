// Hugging Face interop against PyTorch: tools/hf_reference.py writes a tiny GPT-2 folder (F32,
// one file, with U8 mask buffers), a tiny LLaMA folder (BF16 over two shards) and tiny T5 v1.0
// and v1.1 folders (F32), and the logits its GPT2LMHeadModel / LlamaForCausalLM /
// T5ForConditionalGeneration reference computes on fixed tokens. Tessera
// imports each folder and must compute the same logits; the export of the import must hold
// the same tensors, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "io/hf_checkpoint.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "io/sharded_checkpoint.h"
#include "runtime/executor.h"

namespace tessera {
namespace {

const std::string kGolden = std::string(TESSERA_SOURCE_DIR) + "/tests/golden/hf/";

struct Scratch {
  std::string path = std::filesystem::temp_directory_path() /
                     ("tessera_hf_golden-" + std::to_string(::getpid()) + "-" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name());
  Scratch() { std::filesystem::remove_all(path); }
  ~Scratch() { std::filesystem::remove_all(path); }
};

// Tessera's logits for the golden tokens (and T5's decoder tokens), from an imported
// checkpoint.
std::vector<float> tessera_logits(const std::string& ckpt, const SafetensorsFile& ref) {
  auto ck = ShardedCheckpoint::open(ckpt);
  EXPECT_TRUE(ck.ok()) << ck.status().to_string();
  ModelConfig cfg = model_config_from_json(ck->manifest().at("model")).value();
  const TensorData& tokens = ref.get("tokens");
  const int64_t B = tokens.shape[0];
  int64_t seq = tokens.shape[1], rows = seq;
  const bool t5 = task_of(cfg) == ModelTask::span_corruption;
  if (t5) {  // the text length whose span corruption has these lengths
    const int64_t td = ref.get("decoder_tokens").shape[1];
    seq = 2;
    while (span_corruption(seq).encoder_len() != tokens.shape[1] ||
           span_corruption(seq).decoder_len() != td)
      ++seq;
    rows = td;
  }
  ModelGraph m = build_model(cfg, B, seq, ModelMode::logits);
  CpuBackend cpu;
  Executor ex(m.graph, cpu);
  for (ValueId p : m.graph.params()) {
    Status s = ck->read(m.graph.name_of(p), 0, m.graph.type(p).shape.numel(), ex.data<float>(p));
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  ex.set_input(kTokensInput, tokens.bytes.data());
  if (t5) ex.set_input(kDecoderTokensInput, ref.get("decoder_tokens").bytes.data());
  ex.run();
  const float* l = ex.data<float>(m.logits);
  return std::vector<float>(l, l + B * rows * cfg.vocab_size);
}

class HfGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(HfGolden, ImportedModelComputesTheReferenceLogits) {
  Scratch dir;
  auto in = import_hf(kGolden + GetParam(), dir.path + "/ckpt");
  ASSERT_TRUE(in.ok()) << in.status().to_string();
  SafetensorsFile ref = load_safetensors(kGolden + GetParam() + "_logits.safetensors").value();
  const TensorData& logits = ref.get("logits");
  std::vector<float> got = tessera_logits(dir.path + "/ckpt", ref);
  const float* want = reinterpret_cast<const float*>(logits.bytes.data());
  ASSERT_EQ(static_cast<int64_t>(got.size()), logits.numel());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  std::printf("%s: max |diff| / max |logit| = %.2e\n", GetParam().c_str(), diff / scale);
  EXPECT_GT(scale, 0.5);  // the reference's logits are not all near zero
  EXPECT_LE(diff / scale, 1e-4) << "max |diff| " << diff << " of max |logit| " << scale;
}

// Every tensor of every file of `a` is in `b` with the same dtype, shape and bytes.
void expect_same_tensors(const std::string& a_dir, const std::string& b_dir) {
  auto tensors = [](const std::string& dir) {
    std::map<std::string, TensorData> all;
    for (const auto& f : std::filesystem::directory_iterator(dir)) {
      if (f.path().extension() != ".safetensors") continue;
      auto r = SafetensorsReader::open(f.path(), /*keep_other_dtypes=*/true).value();
      for (const SafetensorsEntry& e : r.header().entries)
        if (e.other_dtype.empty()) all[e.name] = r.read(e).value();
    }
    return all;
  };
  std::map<std::string, TensorData> a = tensors(a_dir), b = tensors(b_dir);
  EXPECT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_EQ(t.dtype, b[name].dtype) << name;
    EXPECT_EQ(t.shape, b[name].shape) << name;
    EXPECT_TRUE(t.bytes == b[name].bytes) << name;
  }
}

TEST_P(HfGolden, ImportThenExportIsBitExact) {
  Scratch dir;
  auto in = import_hf(kGolden + GetParam(), dir.path + "/ckpt");
  ASSERT_TRUE(in.ok()) << in.status().to_string();
  const bool llama = GetParam() == "llama";
  // The LLaMA folder is BF16 over two shards of 150-160 KB; export it the same way.
  HfExportOptions opt;
  if (llama) opt = {DType::bf16, 160'000};
  auto out = export_hf(dir.path + "/ckpt", dir.path + "/out", opt);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  expect_same_tensors(kGolden + GetParam(), dir.path + "/out");
  EXPECT_EQ(std::filesystem::exists(dir.path + "/out/model.safetensors.index.json"), llama);
  // config.json round-trips to the same model.
  auto again = import_hf(dir.path + "/out", dir.path + "/ckpt2");
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->cfg, in->cfg);
}

INSTANTIATE_TEST_SUITE_P(Models, HfGolden, ::testing::Values("gpt2", "llama", "t5", "t5v11"));

}  // namespace
}  // namespace tessera
