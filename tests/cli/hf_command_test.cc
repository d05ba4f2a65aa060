// `tessera import hf` / `export hf` and `train --init-from`: a trained checkpoint goes out as
// a Hugging Face folder and comes back as the same model. (Layouts against PyTorch:
// tests/runtime/hf_golden_test.cc; bad folders: tests/io/hf_checkpoint_test.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "train_fixture.h"

namespace tessera {
namespace {

class HfCommand : public TrainDirTest {
 protected:
  std::string tessera(const std::string& args, int want_rc) {
    std::string out;
    EXPECT_EQ(run_command(std::string(TESSERA_BINARY) + " " + args, &out), want_rc) << args << "\n"
                                                                                    << out;
    return out;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
};

TEST_F(HfCommand, TrainedModelGoesOutAndComesBackAsTheSameModel) {
  TrainOptions o = tiny_options("first");
  o.steps = 20;
  o.warmup = 2;
  o.eval_every = 20;
  ASSERT_TRUE(run_train(o).ok());
  const double trained = last_val_loss(dir_ / "first/metrics.jsonl");
  ASSERT_GT(trained, 0);

  tessera("export hf " + path("first/checkpoints") + " --out " + path("hf"), 0);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "hf/config.json"));
  std::string out = tessera("import hf " + path("hf") + " --out " + path("imported"), 0);
  EXPECT_NE(out.find("28 tensors"), std::string::npos) << out;
  tessera("sample --checkpoint " + path("imported") + " --tokens 3", 0);

  // A new run from the imported parameters starts where the first one ended: with a learning
  // rate too small to move them, its validation loss is the first run's.
  TrainOptions again = tiny_options("second");
  again.init_from = path("imported");
  again.steps = 1;
  again.warmup = 0;
  again.lr = 1e-12;
  again.eval_every = 1;
  Status s = run_train(again);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_NEAR(last_val_loss(dir_ / "second/metrics.jsonl"), trained, 1e-5 * trained);
  // Without --init-from the same run starts from random weights, far from there.
  TrainOptions fresh = again;
  fresh.init_from.clear();
  fresh.out = path("third");
  ASSERT_TRUE(run_train(fresh).ok());
  EXPECT_GT(std::abs(last_val_loss(dir_ / "third/metrics.jsonl") - trained), 0.1);
}

// A checkpoint whose weights hold a NaN: `sample` says the logits are not finite, rc 1, rather
// than printing tokens drawn from them, and `train --init-from` refuses it before step 1
// (bad-inputs-7d08d5e N5).
TEST_F(HfCommand, SampleAndInitFromRefuseNonFiniteWeights) {
  TrainOptions o = tiny_options("run");
  o.steps = 1;
  o.warmup = 0;
  o.sample_tokens = 0;
  ASSERT_TRUE(run_train(o).ok());
  const std::string file = path("run/checkpoints/step-00000001/model.safetensors");
  SafetensorsReader r = SafetensorsReader::open(file).value();
  std::vector<TensorData> data;
  for (const SafetensorsEntry& e : r.header().entries) data.push_back(r.read(e).value());
  NamedTensorRefs refs;
  for (size_t i = 0; i < data.size(); ++i) {
    if (r.header().entries[i].name == "h.0.mlp.fc.weight")
      reinterpret_cast<float*>(data[i].bytes.data())[3] = std::nanf("");
    refs.push_back({r.header().entries[i].name, data[i].ref()});
  }
  // Written as a checkpoint of its own (checksums and all): a damaged file would be caught
  // earlier, by its checksum.
  std::ifstream m(path("run/checkpoints/step-00000001/manifest.json"));
  CheckpointWriter w(path("nan"), checkpoint_name(1));
  ASSERT_TRUE(w.add_tensors("model.safetensors", refs).ok());
  nlohmann::json manifest = nlohmann::json::parse(m);
  for (const char* key : {"files", "format", "format_version", "name"}) manifest.erase(key);
  ASSERT_TRUE(w.commit(manifest).ok());
  const std::string out = tessera("sample --checkpoint " + path("nan") + " --tokens 3", 1);
  EXPECT_NE(out.find("error: the model's logits for new token 1 are not finite"), std::string::npos)
      << out;
  // A run started from it says so before step 1 (its divergence hint blamed --lr).
  TrainOptions again = tiny_options("again");
  again.init_from = path("nan");
  Status s = run_train(again);
  EXPECT_NE(s.message().find("the checkpoint's parameters hold values that are not finite"),
            std::string::npos)
      << s.to_string();
}

// A trained t5-tiny goes out as a T5ForConditionalGeneration folder and comes back bit-exact:
// exporting the imported checkpoint writes the same bytes.
TEST_F(HfCommand, T5GoesOutAndComesBackBitExact) {
  tessera(
      "train --model t5-tiny --batch 2 --seq 32 --steps 2 --eval-every 0 --eval-batches 1 "
      "--out " +
          path("t5"),
      0);
  tessera("export hf " + path("t5/checkpoints") + " --out " + path("hf"), 0);
  std::string out = tessera("import hf " + path("hf") + " --out " + path("imported"), 0);
  EXPECT_NE(out.find("(t5, 2 layers)"), std::string::npos) << out;
  EXPECT_EQ(out.find("sample:"), std::string::npos) << out;
  tessera("export hf " + path("imported") + " --out " + path("again"), 0);
  auto bytes = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  const std::string first = bytes(dir_ / "hf/model.safetensors");
  EXPECT_GT(first.size(), 13u << 20);  // 3.45 M f32 parameters
  EXPECT_TRUE(first == bytes(dir_ / "again/model.safetensors"));
  EXPECT_EQ(bytes(dir_ / "hf/config.json"), bytes(dir_ / "again/config.json"));
}

// A LLaMA folder with Llama 2's tokenizer.json: import copies the tokenizer beside the
// checkpoint, sample encodes and decodes with it, export takes it along.
TEST_F(HfCommand, ALlamaFolderWithATokenizerSamplesWithIt) {
  const std::string tok = std::string(TESSERA_BINARY_DIR) + "/tokenizers/llama2";
  if (!std::filesystem::exists(tok + "/tokenizer.json"))
    GTEST_SKIP() << "Llama 2's tokenizer.json is not in " << tok
                 << " (scripts/make_tokenizers.sh writes it from the npm packages)";
  TrainOptions o = tiny_options("llama");
  o.model = "llama-tiny";
  o.steps = 2;
  o.warmup = 0;
  ASSERT_TRUE(run_train(o).ok());
  tessera("export hf " + path("llama/checkpoints") + " --out " + path("hf"), 0);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(tok + "/" + f, dir_ / "hf" / f);
  std::string out = tessera("import hf " + path("hf") + " --out " + path("imported"), 0);
  EXPECT_NE(out.find("tokenizer: 32000 tokens, copied to"), std::string::npos) << out;
  out = tessera("sample --checkpoint " + path("imported") +
                    " --prompt 'The whale said' --tokens 8 --temperature 0",
                0);
  EXPECT_EQ(out.rfind("The whale said", 0), 0u) << out;
  EXPECT_EQ(out.find("note:"), std::string::npos) << out;  // its own tokenizer, no GPT-2
  tessera("export hf " + path("imported") + " --out " + path("again"), 0);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "again/tokenizer.json"));
}

TEST_F(HfCommand, BadUsesAreOneError) {
  std::string out = tessera("import safetensors " + path("x") + " --out " + path("y"), 1);
  EXPECT_NE(out.find("unknown checkpoint format \"safetensors\""), std::string::npos) << out;
  const std::string golden = std::string(TESSERA_SOURCE_DIR) + "/tests/golden/hf/gpt2";
  tessera("import hf " + golden + " --out " + path("ck"), 0);
  // Its vocabulary is 512 tokens: a prompt beyond it is refused, not an abort.
  out = tessera("sample --checkpoint " + path("ck") + " --prompt 'Hello world' --tokens 2", 1);
  EXPECT_NE(out.find("beyond the model's vocabulary of 512"), std::string::npos) << out;
  out = tessera("export hf " + path("ck") + " --out " + path("ck") + " --dtype f8", 1);
  EXPECT_NE(out.find("--dtype must be f32 (fp32), bf16 or f16 (fp16)"), std::string::npos) << out;
  out = tessera("export hf " + path("ck") + " --out " + path("ck"), 1);  // not empty
  EXPECT_NE(out.find("refusing to overwrite"), std::string::npos) << out;
  TrainOptions o = tiny_options("run");
  o.init_from = path("ck");
  o.resume = true;
  Status s = run_train(o);
  EXPECT_NE(s.message().find("pass one of them"), std::string::npos) << s.to_string();
  o.resume = false;
  o.model_given = true;  // gpt-tiny is not the checkpoint's model
  s = run_train(o);
  EXPECT_NE(s.message().find("is not the model of --init-from"), std::string::npos)
      << s.to_string();
}

}  // namespace
}  // namespace tessera
