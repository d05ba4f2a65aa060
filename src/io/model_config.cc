#include "io/model_config.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "io/toml_config.h"

namespace tessera {

namespace {

const std::vector<std::string> kKeys = {"preset",
                                        "name",
                                        "family",
                                        "vocab_size",
                                        "padded_vocab_size",
                                        "n_layer",
                                        "n_embd",
                                        "n_head",
                                        "n_kv_head",
                                        "ffn_hidden",
                                        "max_seq_len",
                                        "norm_eps",
                                        "rope_theta",
                                        "tied_embeddings",
                                        "init_std",
                                        "image_size",
                                        "patch_size",
                                        "channels",
                                        "head_size",
                                        "ffn_activation",
                                        "relative_buckets",
                                        "relative_max_distance",
                                        "n_experts",
                                        "experts_per_token",
                                        "capacity_factor",
                                        "router_aux_loss_coef"};

Result<ModelConfig> preset_or_error(const std::string& name, const std::string& where) {
  if (auto p = find_preset(name)) return *p;
  std::string hint = "known presets: " + join_strings(preset_names());
  std::string close = closest_match(name, preset_names());
  if (!close.empty()) hint = "did you mean \"" + close + "\"? " + hint;
  return error(where + "unknown model preset \"" + name + "\"", hint);
}

Result<ModelConfig> from_table(const TomlTable& root) {
  // A model config holds [model] only: another table or key is a typo or meant for another file.
  TS_RETURN_IF_ERROR(root.check_no_unknown_keys({"model"}));
  TS_ASSIGN_OR_RETURN(TomlTable t, root.require_table("model"));
  TS_RETURN_IF_ERROR(t.check_no_unknown_keys(kKeys));
  ModelConfig c;
  TS_ASSIGN_OR_RETURN(std::string preset, t.get_string("preset", ""));
  if (!preset.empty()) {
    TS_ASSIGN_OR_RETURN(c, preset_or_error(preset, root.source() + ": key 'model.preset': "));
  }
  TS_ASSIGN_OR_RETURN(c.family, t.get_choice("family", {"gpt", "llama", "vit", "t5"}, c.family));
  if (preset.empty()) c = family_defaults(c.family);
  TS_ASSIGN_OR_RETURN(c.name, t.get_string("name", preset.empty() ? "custom" : c.name));
  TS_ASSIGN_OR_RETURN(c.vocab_size, t.get_int("vocab_size", c.vocab_size));
  TS_ASSIGN_OR_RETURN(c.padded_vocab_size, t.get_int("padded_vocab_size", c.padded_vocab_size));
  TS_ASSIGN_OR_RETURN(c.n_layer, t.get_int("n_layer", c.n_layer));
  TS_ASSIGN_OR_RETURN(c.n_embd, t.get_int("n_embd", c.n_embd));
  TS_ASSIGN_OR_RETURN(c.n_head, t.get_int("n_head", c.n_head));
  TS_ASSIGN_OR_RETURN(c.n_kv_head, t.get_int("n_kv_head", c.n_kv_head));
  TS_ASSIGN_OR_RETURN(c.ffn_hidden, t.get_int("ffn_hidden", c.ffn_hidden));
  TS_ASSIGN_OR_RETURN(c.image_size, t.get_int("image_size", c.image_size));
  TS_ASSIGN_OR_RETURN(c.patch_size, t.get_int("patch_size", c.patch_size));
  TS_ASSIGN_OR_RETURN(c.channels, t.get_int("channels", c.channels));
  TS_ASSIGN_OR_RETURN(c.head_size, t.get_int("head_size", c.head_size));
  TS_ASSIGN_OR_RETURN(c.ffn_activation, t.get_string("ffn_activation", c.ffn_activation));
  TS_ASSIGN_OR_RETURN(c.relative_buckets, t.get_int("relative_buckets", c.relative_buckets));
  TS_ASSIGN_OR_RETURN(c.relative_max_distance,
                      t.get_int("relative_max_distance", c.relative_max_distance));
  // A vit's sequence follows from its image and patch sizes.
  if (task_of(c) == ModelTask::image_classes) c.max_seq_len = c.image_tokens();
  TS_ASSIGN_OR_RETURN(c.max_seq_len, t.get_int("max_seq_len", c.max_seq_len));
  TS_ASSIGN_OR_RETURN(c.norm_eps, t.get_float("norm_eps", c.norm_eps));
  TS_ASSIGN_OR_RETURN(c.rope_theta, t.get_float("rope_theta", c.rope_theta));
  TS_ASSIGN_OR_RETURN(c.tied_embeddings, t.get_bool("tied_embeddings", c.tied_embeddings));
  TS_ASSIGN_OR_RETURN(c.init_std, t.get_float("init_std", c.init_std));
  TS_ASSIGN_OR_RETURN(c.n_experts, t.get_int("n_experts", c.n_experts));
  TS_ASSIGN_OR_RETURN(c.experts_per_token, t.get_int("experts_per_token", c.experts_per_token));
  TS_ASSIGN_OR_RETURN(c.capacity_factor, t.get_float("capacity_factor", c.capacity_factor));
  TS_ASSIGN_OR_RETURN(c.router_aux_loss_coef,
                      t.get_float("router_aux_loss_coef", c.router_aux_loss_coef));
  Status s = validate(c);
  if (!s.ok()) return error(root.source() + ": [model] " + s.message(), s.hint());
  return c;
}

}  // namespace

Result<ModelConfig> parse_model_config(const std::string& toml_text, const std::string& name) {
  TS_ASSIGN_OR_RETURN(TomlTable root, parse_toml_string(toml_text, name));
  return from_table(root);
}

Result<ModelConfig> load_model_config(const std::string& spec) {
  std::string lower = spec;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const bool is_file = lower.size() > 5 && lower.substr(lower.size() - 5) == ".toml";
  std::error_code ec;
  if (!is_file && std::filesystem::is_directory(spec, ec))
    return error("model '" + spec + "' is a directory, not a preset or a model config",
                 "pass a preset name or a TOML file ending in .toml (a checkpoint directory "
                 "goes to `train --init-from` or `sample --checkpoint`)");
  if (!is_file && std::filesystem::is_regular_file(spec, ec))
    return error("model '" + spec +
                     "' is a file, but model configs are TOML files whose name "
                     "ends in .toml",
                 lower.size() > 5 && lower.substr(lower.size() - 5) == ".json"
                     ? "a checkpoint's manifest.json holds its model: pass the checkpoint "
                       "directory to `train --init-from` or `sample --checkpoint`"
                     : "rename it to end in .toml, with the keys under [model]");
  if (!is_file) return preset_or_error(spec, "");
  TS_ASSIGN_OR_RETURN(TomlTable root, parse_toml_file(spec));
  return from_table(root);
}

// How GPT's fused QKV rows are stored (models/model.h). Checkpoints written before they were
// stored per head lack the key.
constexpr const char* kGptQkvRows = "per_head";

nlohmann::json model_config_to_json(const ModelConfig& c) {
  nlohmann::json j = {{"name", c.name},
                      {"family", c.family},
                      {"vocab_size", c.vocab_size},
                      {"n_layer", c.n_layer},
                      {"n_embd", c.n_embd},
                      {"n_head", c.n_head},
                      {"n_kv_head", c.n_kv_head},
                      {"ffn_hidden", c.ffn_hidden},
                      {"max_seq_len", c.max_seq_len},
                      {"norm_eps", c.norm_eps},
                      {"rope_theta", c.rope_theta},
                      {"tied_embeddings", c.tied_embeddings},
                      {"init_std", c.init_std}};
  if (c.family == "gpt") j["qkv_rows"] = kGptQkvRows;
  if (c.padded_vocab_size > 0) j["padded_vocab_size"] = c.padded_vocab_size;
  // Keys of one family only, written when set (validate() keeps them unset elsewhere).
  for (auto [key, v] : {std::pair<const char*, int64_t>{"image_size", c.image_size},
                        {"patch_size", c.patch_size},
                        {"channels", c.channels},
                        {"head_size", c.head_size},
                        {"relative_buckets", c.relative_buckets},
                        {"relative_max_distance", c.relative_max_distance}})
    if (v != 0) j[key] = v;
  if (!c.ffn_activation.empty()) j["ffn_activation"] = c.ffn_activation;
  if (c.is_moe()) {
    j["n_experts"] = c.n_experts;
    j["experts_per_token"] = c.experts_per_token;
    j["capacity_factor"] = c.capacity_factor;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
  }
  return j;
}

Result<ModelConfig> model_config_from_json(const nlohmann::json& j) {
  try {
    ModelConfig c;
    c.name = j.at("name").get<std::string>();
    c.family = j.at("family").get<std::string>();
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.padded_vocab_size = j.value("padded_vocab_size", int64_t{0});
    c.n_layer = j.at("n_layer").get<int64_t>();
    c.n_embd = j.at("n_embd").get<int64_t>();
    c.n_head = j.at("n_head").get<int64_t>();
    c.n_kv_head = j.at("n_kv_head").get<int64_t>();
    c.ffn_hidden = j.at("ffn_hidden").get<int64_t>();
    c.max_seq_len = j.at("max_seq_len").get<int64_t>();
    c.norm_eps = j.at("norm_eps").get<double>();
    c.rope_theta = j.at("rope_theta").get<double>();
    c.tied_embeddings = j.at("tied_embeddings").get<bool>();
    c.init_std = j.at("init_std").get<double>();
    c.image_size = j.value("image_size", int64_t{0});
    c.patch_size = j.value("patch_size", int64_t{0});
    c.channels = j.value("channels", int64_t{0});
    c.head_size = j.value("head_size", int64_t{0});
    c.ffn_activation = j.value("ffn_activation", std::string());
    c.relative_buckets = j.value("relative_buckets", int64_t{0});
    c.relative_max_distance = j.value("relative_max_distance", int64_t{0});
    c.n_experts = j.value("n_experts", int64_t{0});
    c.experts_per_token = j.value("experts_per_token", int64_t{0});
    c.capacity_factor = j.value("capacity_factor", c.capacity_factor);
    c.router_aux_loss_coef = j.value("router_aux_loss_coef", c.router_aux_loss_coef);
    TS_RETURN_IF_ERROR(validate(c));
    if (c.family == "gpt" && j.value("qkv_rows", std::string("q|k|v")) != kGptQkvRows)
      return error(
          "model config in manifest: GPT attention weights stored with rows in (q|k|v, "
          "head) order (Tessera before 2026-11); this build stores them per head",
          "retrain, or load the tensors and reorder h.N.attn.qkv.weight and .bias "
          "with gpt_qkv_from_standard (models/model.h)");
    return c;
  } catch (const nlohmann::json::exception& e) {
    return error(std::string("model config in manifest is malformed: ") + e.what(),
                 "the checkpoint was not written by this version of Tessera, or is corrupt");
  }
}

}  // namespace tessera
