// Model graphs: parameter counts against published figures (GPT, LLaMA, ViT), build time of the
// largest presets, training FLOPs against the standard estimate, ViT's inputs, and config
// validation.
#include "models/model.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "preset_util.h"

namespace tessera {
namespace {

// Published sizes: GPT-2 small (HF transformers gpt2, tied head) and LLaMA-2 7B (Meta).
TEST(Models, ExactParameterCountsOfKnownModels) {
  ModelGraph gpt = build_model(preset("gpt2-small"), 1, 1, ModelMode::logits);
  EXPECT_EQ(gpt.graph.param_count(), 124439808);
  ModelGraph llama = build_model(preset("llama2-7b"), 1, 1, ModelMode::logits);
  EXPECT_EQ(llama.graph.param_count(), 6738415616);
}

TEST(Models, CountParamsMatchesTheGraphForEveryPreset) {
  std::vector<std::string> names = preset_names();
  EXPECT_GE(names.size(), 21u);
  for (const std::string& name : names) {
    ModelConfig c = preset(name);
    EXPECT_EQ(c.name, name);
    Status s = validate(c);
    ASSERT_TRUE(s.ok()) << name << ": " << s.to_string();
    ModelGraph m = build_model(c, 1, 2, ModelMode::logits);
    EXPECT_EQ(count_params(c), m.graph.param_count()) << name;
  }
  EXPECT_FALSE(find_preset("gpt5").has_value());
}

// Graph building is metadata only, so even the largest models build quickly.
TEST(Models, LargestPresetsBuildTrainingGraphsQuickly) {
  for (const char* name : {"gpt3-175b", "llama3-405b"}) {
    ModelConfig c = preset(name);
    auto t0 = std::chrono::steady_clock::now();
    ModelGraph m = build_model(c, 1, c.max_seq_len, ModelMode::train);
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("build_model(%s, B=1, T=%lld, train): %.3f s, %zu nodes, %.4g params\n", name,
                static_cast<long long>(c.max_seq_len), sec, m.graph.nodes().size(),
                static_cast<double>(m.graph.param_count()));
    EXPECT_LT(sec, 30.0) << name;  // well under 1 s quiet; catches a blow-up, not load
    EXPECT_EQ(m.graph.param_grads().size(), m.graph.params().size());
    EXPECT_GE(m.loss, 0);
  }
}

// Training FLOPs per token ~ 6 N + 12 L C T (Kaplan et al. 2020 / Chinchilla: 2N forward and 4N
// backward for the weight matmuls, plus attention scores and weighted sum counted non-causally:
// 4 L C T forward, 8 L C T backward). N is the full parameter count.
TEST(Models, TrainingFlopsPerTokenOfGpt2Small) {
  ModelConfig c = preset("gpt2-small");
  const int64_t T = 1024, B = 1;
  ModelGraph m = build_model(c, B, T, ModelMode::train);
  const double tokens = static_cast<double>(B * T);
  const double per_token = m.graph.total_flops() / tokens;
  const double N = static_cast<double>(count_params(c));
  const double L = static_cast<double>(c.n_layer), C = static_cast<double>(c.n_embd);
  const double want = 6 * N + 12 * L * C * static_cast<double>(T);
  std::printf("gpt2-small T=1024: %.4g FLOP/token from the graph, 6N + 12LCT = %.4g (ratio %.4f)\n",
              per_token, want, per_token / want);
  EXPECT_NEAR(per_token / want, 1.0, 0.02);
  // Forward alone ~ 2N + 4LCT.
  const double fwd = m.graph.forward_flops() / tokens;
  EXPECT_NEAR(fwd / (2 * N + 4 * L * C * static_cast<double>(T)), 1.0, 0.02);
}

TEST(Models, ValidateRejectsBadConfigsNamingTheKey) {
  ModelConfig c = preset("gpt-tiny");
  ASSERT_TRUE(validate(c).ok());

  ModelConfig heads = c;
  heads.n_head = 5;  // 64 % 5 != 0
  Status s = validate(heads);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("n_head"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("n_embd"), std::string::npos) << s.message();

  ModelConfig kv = preset("llama-tiny");
  ASSERT_TRUE(validate(kv).ok());
  kv.n_kv_head = 3;  // 4 % 3 != 0
  s = validate(kv);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("n_kv_head"), std::string::npos) << s.message();

  ModelConfig fam = c;
  fam.family = "bert";
  s = validate(fam);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("family"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("bert"), std::string::npos) << s.message();

  ModelConfig neg = c;
  neg.n_layer = 0;
  s = validate(neg);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("n_layer"), std::string::npos) << s.message();
  ModelConfig deep = c;  // 100,000 blocks would take minutes to build before any check
  deep.n_layer = 100000;
  s = validate(deep);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'n_layer' = 100000 is over 10000"), std::string::npos) << s.message();
}

// timm's vit_base_patch16_224 (86,567,656) and vit_large_patch16_224 (304,326,632), and
// vit_huge_patch14_224 with its 1000-class head (632.05 M); HF's ViTForImageClassification
// has the same tensors.
TEST(Vit, ExactParameterCountsOfThePublicModels) {
  EXPECT_EQ(build_model(preset("vit-b16"), 1, 0, ModelMode::logits).graph.param_count(), 86567656);
  EXPECT_EQ(build_model(preset("vit-l16"), 1, 0, ModelMode::logits).graph.param_count(), 304326632);
  EXPECT_EQ(count_params(preset("vit-h14")), 632045800);
}

TEST(Vit, TakesImagesAndLabelsAndGivesClassLogits) {
  ModelConfig c = preset("vit-tiny");
  EXPECT_EQ(task_of(c), ModelTask::image_classes);
  EXPECT_EQ(task_of(preset("gpt-tiny")), ModelTask::language_model);
  ModelGraph m = build_model(c, 3, 0, ModelMode::train);
  ASSERT_EQ(m.inputs.size(), 2u);
  EXPECT_EQ(m.inputs[0].name, kImagesInput);
  EXPECT_EQ(m.graph.type(m.inputs[0].value).shape, (Shape{3, 1, 28, 28}));
  EXPECT_FALSE(m.inputs[0].target);
  EXPECT_EQ(m.inputs[1].name, kLabelsInput);
  EXPECT_EQ(m.graph.type(m.inputs[1].value).shape, (Shape{3}));
  EXPECT_TRUE(m.inputs[1].target);
  EXPECT_EQ(m.graph.type(m.logits).shape, (Shape{3, 10}));
  EXPECT_EQ(m.seq, 17);  // the class token and 4 x 4 patches
  EXPECT_EQ(m.graph.param_grads().size(), m.graph.params().size());
}

TEST(Vit, ValidateNamesTheImageKeys) {
  ModelConfig c = preset("vit-tiny");
  ASSERT_TRUE(validate(c).ok());
  ModelConfig patch = c;
  patch.patch_size = 5;  // 28 % 5 != 0
  Status s = validate(patch);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("patch_size"), std::string::npos) << s.message();
  ModelConfig seq = c;
  seq.max_seq_len = 64;
  s = validate(seq);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("17"), std::string::npos) << s.message();
  ModelConfig gpt = preset("gpt-tiny");
  gpt.image_size = 28;
  s = validate(gpt);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("image_size"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tessera
