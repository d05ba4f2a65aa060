// Hugging Face names, layouts and configs of the GPT, LLaMA and T5 families.
#include "models/hf_format.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <set>

namespace tessera {
namespace {

bool mentions(const Status& s, const std::string& text) {
  return s.to_string().find(text) != std::string::npos;
}

// One entry per parameter, in the graph's order and with its shapes, for every preset.
TEST(HfFormat, EveryParameterOfEveryPresetHasOneHfTensor) {
  for (const std::string& name : preset_names()) {
    ModelConfig c = *find_preset(name);
    if (c.family == "vit") {  // no Hugging Face mapping yet: export refuses it by name
      EXPECT_NE(model_config_to_hf(c).status().message().find("\"vit\""), std::string::npos);
      continue;
    }
    ModelGraph m = build_model(c, 1, 1, ModelMode::logits);
    std::vector<HfTensor> t = hf_tensors(c);
    // A parameter of stacked experts (Mixtral's) is one entry per expert, in expert order.
    std::vector<HfTensor> per_param;
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i].expert > 0) {
        EXPECT_EQ(t[i].name, t[i - 1].name) << name;
        EXPECT_EQ(t[i].expert, t[i - 1].expert + 1) << name << " " << t[i].hf_name;
        continue;
      }
      per_param.push_back(t[i]);
    }
    ASSERT_EQ(per_param.size(), m.graph.params().size()) << name;
    std::set<std::string> hf_names;
    for (size_t i = 0; i < per_param.size(); ++i) {
      ValueId p = m.graph.params()[i];
      EXPECT_EQ(per_param[i].name, m.graph.name_of(p)) << name;
      EXPECT_EQ(per_param[i].shape, m.graph.type(p).shape.dims())
          << name << " " << per_param[i].name;
    }
    for (const HfTensor& x : t)
      EXPECT_TRUE(hf_names.insert(x.hf_name).second) << name << " " << x.hf_name;
  }
}

// GPT-2 small's keys and shapes as the published gpt2 checkpoint has them.
TEST(HfFormat, Gpt2KeysAndShapesAreTheTransformersOnes) {
  std::vector<HfTensor> t = hf_tensors(*find_preset("gpt2-small"));
  auto find = [&](const std::string& hf) {
    for (const HfTensor& x : t)
      if (x.hf_name == hf) return x;
    ADD_FAILURE() << "no " << hf;
    return HfTensor{};
  };
  // 50257 rows in the file even though the preset pads the vocabulary for tensor parallelism.
  EXPECT_EQ(find("transformer.wte.weight").hf_shape, (std::vector<int64_t>{50257, 768}));
  EXPECT_EQ(find("transformer.h.0.attn.c_attn.weight").hf_shape, (std::vector<int64_t>{768, 2304}));
  EXPECT_EQ(find("transformer.h.11.mlp.c_fc.weight").hf_shape, (std::vector<int64_t>{768, 3072}));
  EXPECT_EQ(find("transformer.h.11.mlp.c_proj.weight").hf_shape, (std::vector<int64_t>{3072, 768}));
  EXPECT_EQ(hf_name_aliases("transformer.h.0.ln_1.weight"),
            std::vector<std::string>{"h.0.ln_1.weight"});
  ModelConfig c = *find_preset("gpt2-small");
  EXPECT_TRUE(hf_tensor_is_skipped(c, "h.3.attn.bias"));
  EXPECT_TRUE(hf_tensor_is_skipped(c, "transformer.h.3.attn.masked_bias"));
  EXPECT_TRUE(hf_tensor_is_skipped(c, "lm_head.weight"));  // tied
  EXPECT_FALSE(hf_tensor_is_skipped(c, "transformer.h.3.attn.c_proj.bias"));
}

// T5's keys as the published t5-small and google/t5-v1_1-small checkpoints have them, and its
// config keys that Tessera cannot compute refused by name.
TEST(HfFormat, T5KeysAndConfigAreTheTransformersOnes) {
  ModelConfig c = *find_preset("t5-small");
  std::set<std::string> keys;
  for (const HfTensor& t : hf_tensors(c)) keys.insert(t.hf_name);
  for (const char* k :
       {"shared.weight", "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        "encoder.block.5.layer.1.DenseReluDense.wo.weight",
        "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        "decoder.block.3.layer.1.EncDecAttention.k.weight",
        "decoder.block.3.layer.2.layer_norm.weight", "decoder.final_layer_norm.weight"})
    EXPECT_TRUE(keys.count(k)) << k;
  EXPECT_EQ(keys.size(), 131u);  // t5-small's state dict less the three embedding copies
  EXPECT_TRUE(hf_tensor_is_skipped(c, "encoder.embed_tokens.weight"));
  EXPECT_TRUE(hf_tensor_is_skipped(c, "lm_head.weight"));  // tied
  nlohmann::json v11 = {{"model_type", "t5"},
                        {"vocab_size", 32128},
                        {"d_model", 512},
                        {"d_kv", 64},
                        {"d_ff", 1024},
                        {"num_layers", 8},
                        {"num_decoder_layers", 8},
                        {"num_heads", 6},
                        {"feed_forward_proj", "gated-gelu"},
                        {"tie_word_embeddings", false},
                        {"dense_act_fn", "gelu_new"},
                        {"is_gated_act", true},
                        {"dropout_rate", 0.1}};
  auto r = model_config_from_hf(v11);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->unknown_keys.empty());
  EXPECT_EQ(count_params(r->cfg), 76961152);
  keys.clear();
  for (const HfTensor& t : hf_tensors(r->cfg)) keys.insert(t.hf_name);
  EXPECT_TRUE(keys.count("encoder.block.7.layer.1.DenseReluDense.wi_1.weight"));
  EXPECT_TRUE(keys.count("lm_head.weight"));
  for (auto [key, value] :
       {std::pair<const char*, nlohmann::json>{"feed_forward_proj", "gated-silu"},
        {"num_decoder_layers", 4}}) {
    nlohmann::json j = v11;
    j[key] = value;
    auto bad = model_config_from_hf(j);
    ASSERT_FALSE(bad.ok()) << key;
    EXPECT_TRUE(mentions(bad.status(), key)) << bad.status().to_string();
  }
}

// Conversions are inverse to each other, and GPT's fused QKV lands where the model reads it:
// HF column (q|k|v, head, d) of c_attn is Tessera's row (head, q|k|v, d).
TEST(HfFormat, LayoutsRoundTripAndPlaceQkvPerHead) {
  ModelConfig c = *find_preset("gpt-tiny");  // C 64, 4 heads of 16
  for (const HfTensor& t : hf_tensors(c)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::vector<float> x(static_cast<size_t>(n));
    std::iota(x.begin(), x.end(), 0.0f);
    if (t.hf_shape != t.shape && t.layout == HfLayout::same) continue;  // padded vocabulary
    std::vector<float> hf = tessera_to_hf(c, t, x.data());
    EXPECT_EQ(hf_to_tessera(c, t, hf.data()), x) << t.name;
    if (t.layout == HfLayout::gpt_qkv_weight) {
      const int64_t C = 64, D = 16;
      // HF element [in i][out j]: j = which * C + head * D + d.
      for (int64_t j : {0L, 17L, 64 + 5L, 2 * 64 + 63L}) {
        const int64_t which = j / C, head = (j % C) / D, d = j % D, i = 3;
        const int64_t row = (head * 3 + which) * D + d;
        EXPECT_EQ(hf[i * 3 * C + j], x[row * C + i]) << j;
      }
    }
  }
}

TEST(HfFormat, ConfigsRoundTripThroughConfigJson) {
  for (const char* name :
       {"gpt2-small", "gpt-tiny", "llama-tiny", "llama3-8b", "llama2-70b", "t5-tiny", "t5-11b"}) {
    ModelConfig c = *find_preset(name);
    auto j = model_config_to_hf(c);
    ASSERT_TRUE(j.ok()) << j.status().to_string();
    auto back = model_config_from_hf(*j);
    ASSERT_TRUE(back.ok()) << name << ": " << back.status().to_string();
    EXPECT_TRUE(back->unknown_keys.empty()) << name;
    ModelConfig want = c;
    want.name = back->cfg.name;
    want.padded_vocab_size = 0;  // HF files hold vocab_size rows
    EXPECT_EQ(back->cfg, want) << name;
  }
}

// Mixtral: one HF tensor per expert (w1 the gate, w3 the up, w2 the down projection) and the
// router as block_sparse_moe.gate; HF's Mixtral drops no token, so an import takes the
// capacity that drops none and an export of a capacity that drops is refused.
TEST(HfFormat, MixtralNamesEachExpertAndDropsNoToken) {
  ModelConfig c = *find_preset("mixtral-8x7b");
  EXPECT_NE(model_config_to_hf(c).status().message().find("drops tokens"), std::string::npos);
  c.capacity_factor = 4.0;  // 8 experts / 2 per token
  auto j = model_config_to_hf(c);
  ASSERT_TRUE(j.ok()) << j.status().to_string();
  EXPECT_EQ((*j)["model_type"], "mixtral");
  EXPECT_EQ((*j)["num_local_experts"], 8);
  EXPECT_EQ((*j)["num_experts_per_tok"], 2);
  auto back = model_config_from_hf(*j);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(back->unknown_keys.empty());
  ModelConfig want = c;
  want.name = back->cfg.name;
  EXPECT_EQ(back->cfg, want);
  std::map<std::string, HfTensor> by_hf;
  for (const HfTensor& t : hf_tensors(c)) by_hf[t.hf_name] = t;
  const HfTensor& w2 = by_hf.at("model.layers.31.block_sparse_moe.experts.7.w2.weight");
  EXPECT_EQ(w2.name, "h.31.moe.experts.down");
  EXPECT_EQ(w2.expert, 7);
  EXPECT_EQ(w2.hf_shape, (std::vector<int64_t>{4096, 14336}));
  EXPECT_EQ(w2.shape, (std::vector<int64_t>{8, 4096, 14336}));
  EXPECT_EQ(by_hf.at("model.layers.0.block_sparse_moe.experts.0.w1.weight").name,
            "h.0.moe.experts.gate");
  EXPECT_EQ(by_hf.at("model.layers.0.block_sparse_moe.experts.3.w3.weight").name,
            "h.0.moe.experts.up");
  EXPECT_EQ(by_hf.at("model.layers.5.block_sparse_moe.gate.weight").hf_shape,
            (std::vector<int64_t>{8, 4096}));
  nlohmann::json windowed = *j;
  windowed["sliding_window"] = 4096;
  EXPECT_NE(model_config_from_hf(windowed).status().message().find("sliding_window"),
            std::string::npos);
}

TEST(HfFormat, ConfigKeysTesseraCannotComputeAreRefusedByName) {
  nlohmann::json llama = *model_config_to_hf(*find_preset("llama-tiny"));
  auto refused = [](nlohmann::json j, const std::string& key, const nlohmann::json& value,
                    const std::string& text) {
    if (value.is_discarded())
      j.erase(key);
    else
      j[key] = value;
    auto r = model_config_from_hf(j);
    EXPECT_FALSE(r.ok()) << key;
    if (!r.ok()) {
      EXPECT_TRUE(mentions(r.status(), text)) << r.status().to_string();
    }
  };
  const nlohmann::json erase = nlohmann::json::value_t::discarded;
  refused(llama, "rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}, "rope_scaling");
  refused(llama, "hidden_act", "gelu", "hidden_act");
  refused(llama, "attention_bias", true, "biases");
  refused(llama, "hidden_size", erase, "missing key \"hidden_size\"");
  refused(llama, "num_hidden_layers", -2, "positive integer");
  refused(llama, "head_dim", 7, "head_dim");
  refused(llama, "model_type", "bert", "model_type \"bert\" is not supported");
  refused(llama, "num_key_value_heads", 3, "config.json");  // 4 heads: not divisible
  nlohmann::json gpt = *model_config_to_hf(*find_preset("gpt-tiny"));
  refused(gpt, "activation_function", "relu", "activation_function");
  refused(gpt, "scale_attn_by_inverse_layer_idx", true, "scale_attn_by_inverse_layer_idx");
  refused(gpt, "n_embd", 63, "config.json");  // not divisible by 4 heads
  // Harmless keys are ignored; unknown ones are reported, not refused.
  gpt["attn_pdrop"] = 0.1;
  gpt["transformers_version"] = "4.40.0";
  gpt["some_new_key"] = 1;
  auto r = model_config_from_hf(gpt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->unknown_keys, std::vector<std::string>{"some_new_key"});
}

}  // namespace
}  // namespace tessera
