// Model configs in checkpoint manifests: round trip, and GPT checkpoints from before the fused
// QKV rows were stored per head are refused rather than loaded with their heads scrambled;
// a padded vocabulary from TOML.
#include "io/model_config.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(ModelConfigJson, RoundTripsEveryFamily) {
  for (const char* name :
       {"gpt-tiny", "llama-tiny", "gpt2-small", "llama2-7b", "vit-tiny", "t5-tiny", "t5-3b"}) {
    ModelConfig c = *find_preset(name);
    Result<ModelConfig> back = model_config_from_json(model_config_to_json(c));
    ASSERT_TRUE(back.ok()) << name << ": " << back.status().to_string();
    EXPECT_EQ(*back, c) << name;
  }
}

TEST(ModelConfigJson, GptWithTheOldQkvRowOrderIsRefused) {
  nlohmann::json j = model_config_to_json(*find_preset("gpt-tiny"));
  EXPECT_EQ(j["qkv_rows"], "per_head");
  j.erase("qkv_rows");
  Result<ModelConfig> c = model_config_from_json(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("(q|k|v, head) order"), std::string::npos)
      << c.status().to_string();
  EXPECT_NE(c.status().hint().find("gpt_qkv_from_standard"), std::string::npos);
  // LLaMA has separate q, k and v: nothing to refuse.
  nlohmann::json l = model_config_to_json(*find_preset("llama-tiny"));
  EXPECT_FALSE(l.contains("qkv_rows"));
  EXPECT_TRUE(model_config_from_json(l).ok());
}

// padded_vocab_size: from a TOML config onto the table rows, through the manifest, and a size
// below the vocabulary refused naming the key.
TEST(ModelConfig, PaddedVocabularySizesTheTableAndRoundTrips) {
  Result<ModelConfig> c = parse_model_config(
      "[model]\npreset = \"gpt-tiny\"\npadded_vocab_size = 50304\n", "padded.toml");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->vocab_size, 50257);
  EXPECT_EQ(c->vocab_rows(), 50304);
  EXPECT_EQ(count_params(*c) - count_params(*find_preset("gpt-tiny")), 47 * c->n_embd);
  Result<ModelConfig> back = model_config_from_json(model_config_to_json(*c));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->padded_vocab_size, 50304);
  Result<ModelConfig> bad =
      parse_model_config("[model]\npreset = \"gpt-tiny\"\npadded_vocab_size = 50000\n", "bad.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'padded_vocab_size' = 50000 is smaller than vocab_size"),
            std::string::npos)
      << bad.status().to_string();
}

// A T5 written without a preset starts from T5's own settings (tied head, relu, 32 buckets up to
// 128, eps 1e-6); its keys are refused for other families, naming them.
TEST(ModelConfig, T5FromTomlTakesT5sDefaults) {
  Result<ModelConfig> c = parse_model_config(
      "[model]\nfamily = \"t5\"\nname = \"my-t5\"\nn_layer = 2\nn_embd = 64\nn_head = 4\n"
      "head_size = 32\nffn_activation = \"gated-gelu\"\nvocab_size = 50358\n",
      "t5.toml");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->name, "my-t5");
  EXPECT_TRUE(c->tied_embeddings);
  EXPECT_EQ(c->relative_buckets, 32);
  EXPECT_EQ(c->relative_max_distance, 128);
  EXPECT_EQ(c->norm_eps, 1e-6);
  EXPECT_EQ(c->head_dim(), 32);
  EXPECT_EQ(c->ffn_activation, "gated-gelu");
  Result<ModelConfig> gpt =
      parse_model_config("[model]\npreset = \"gpt-tiny\"\nrelative_buckets = 32\n", "g.toml");
  ASSERT_FALSE(gpt.ok());
  EXPECT_NE(gpt.status().message().find("relative_buckets"), std::string::npos)
      << gpt.status().to_string();
}

}  // namespace
}  // namespace tessera
