#include "models/hf_format.h"

#include <algorithm>
#include <set>

#include "base/check.h"

namespace tessera {

namespace {

using json = nlohmann::json;

// Keys of every HF config that neither change the weights nor the forward pass.
const std::set<std::string>& harmless_keys() {
  static const std::set<std::string> keys = {"_name_or_path",
                                             "architectures",
                                             "bos_token_id",
                                             "eos_token_id",
                                             "pad_token_id",
                                             "torch_dtype",
                                             "transformers_version",
                                             "use_cache",
                                             "return_dict",
                                             "output_attentions",
                                             "output_hidden_states",
                                             "id2label",
                                             "label2id",
                                             "problem_type",
                                             "prefix",
                                             "tokenizer_class",
                                             "task_specific_params",
                                             "initializer_range",
                                             "model_type",
                                             "_attn_implementation",
                                             "gradient_checkpointing"};
  return keys;
}

// Reads the config's keys, remembering which were looked at, so that what is left over can
// be reported as unknown.
class ConfigReader {
 public:
  explicit ConfigReader(const json& j) : j_(j) {}

  const json* find(const std::string& key) {
    seen_.insert(key);
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  Status int_key(const std::string& key, int64_t* out, bool required) {
    const json* v = find(key);
    if (!v) return required ? error("config.json: missing key \"" + key + "\"") : Status();
    if (!v->is_number_integer() || v->get<int64_t>() <= 0)
      return error("config.json: \"" + key + "\" must be a positive integer, got " + v->dump());
    *out = v->get<int64_t>();
    return Status();
  }
  Status float_key(const std::string& key, double* out) {
    const json* v = find(key);
    if (!v) return Status();
    if (!v->is_number() || !(v->get<double>() > 0))
      return error("config.json: \"" + key + "\" must be a positive number, got " + v->dump());
    *out = v->get<double>();
    return Status();
  }
  Status bool_key(const std::string& key, bool* out) {
    const json* v = find(key);
    if (!v) return Status();
    if (!v->is_boolean())
      return error("config.json: \"" + key + "\" must be true or false, got " + v->dump());
    *out = v->get<bool>();
    return Status();
  }
  // A key Tessera computes only with the value `want` (null / absent counts as `want`).
  Status require(const std::string& key, const json& want, const std::string& why) {
    const json* v = find(key);
    if (!v || *v == want) return Status();
    return error("config.json: \"" + key + "\" = " + v->dump() + " is not supported",
                 "Tessera's model computes " + why);
  }
  void ignore(const std::vector<std::string>& keys) { seen_.insert(keys.begin(), keys.end()); }

  std::vector<std::string> unknown() const {
    std::vector<std::string> out;
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!seen_.count(it.key()) && !harmless_keys().count(it.key())) out.push_back(it.key());
    return out;
  }

 private:
  const json& j_;
  std::set<std::string> seen_;
};

Status gpt2_from_hf(ConfigReader& r, ModelConfig* c) {
  c->family = "gpt";
  c->tied_embeddings = true;
  TS_RETURN_IF_ERROR(r.int_key("vocab_size", &c->vocab_size, true));
  if (r.find("n_positions"))
    TS_RETURN_IF_ERROR(r.int_key("n_positions", &c->max_seq_len, true));
  else
    TS_RETURN_IF_ERROR(r.int_key("n_ctx", &c->max_seq_len, true));
  TS_RETURN_IF_ERROR(r.int_key("n_embd", &c->n_embd, true));
  TS_RETURN_IF_ERROR(r.int_key("n_layer", &c->n_layer, true));
  TS_RETURN_IF_ERROR(r.int_key("n_head", &c->n_head, true));
  TS_RETURN_IF_ERROR(r.int_key("n_inner", &c->ffn_hidden, false));
  TS_RETURN_IF_ERROR(r.float_key("layer_norm_epsilon", &c->norm_eps));
  TS_RETURN_IF_ERROR(r.bool_key("tie_word_embeddings", &c->tied_embeddings));
  TS_RETURN_IF_ERROR(r.float_key("initializer_range", &c->init_std));
  if (const json* act = r.find("activation_function")) {
    static const std::set<std::string> tanh_gelus = {"gelu_new", "gelu_pytorch_tanh", "gelu_fast"};
    if (!act->is_string() || !tanh_gelus.count(act->get<std::string>()))
      return error("config.json: \"activation_function\" = " + act->dump() + " is not supported",
                   "Tessera's GPT uses the tanh approximation of GELU (gelu_new)");
  }
  TS_RETURN_IF_ERROR(r.require("scale_attn_weights", true, "attention scaled by 1/sqrt(head_dim)"));
  TS_RETURN_IF_ERROR(r.require("scale_attn_by_inverse_layer_idx", false,
                               "attention scaled by 1/sqrt(head_dim) in every layer"));
  TS_RETURN_IF_ERROR(r.require("add_cross_attention", false, "a decoder without cross-attention"));
  // Numerically the same computation, or training-only settings.
  r.ignore({"n_ctx", "attn_pdrop", "embd_pdrop", "resid_pdrop", "reorder_and_upcast_attn",
            "summary_activation", "summary_first_dropout", "summary_proj_to_labels", "summary_type",
            "summary_use_proj"});
  return Status();
}

Status llama_from_hf(ConfigReader& r, ModelConfig* c) {
  c->family = "llama";
  c->tied_embeddings = false;  // LlamaConfig's default
  c->norm_eps = 1e-6;          // LlamaConfig's default
  c->max_seq_len = 2048;       // LlamaConfig's default
  TS_RETURN_IF_ERROR(r.int_key("vocab_size", &c->vocab_size, true));
  TS_RETURN_IF_ERROR(r.int_key("hidden_size", &c->n_embd, true));
  TS_RETURN_IF_ERROR(r.int_key("intermediate_size", &c->ffn_hidden, true));
  TS_RETURN_IF_ERROR(r.int_key("num_hidden_layers", &c->n_layer, true));
  TS_RETURN_IF_ERROR(r.int_key("num_attention_heads", &c->n_head, true));
  TS_RETURN_IF_ERROR(r.int_key("num_key_value_heads", &c->n_kv_head, false));
  TS_RETURN_IF_ERROR(r.int_key("max_position_embeddings", &c->max_seq_len, false));
  TS_RETURN_IF_ERROR(r.float_key("rms_norm_eps", &c->norm_eps));
  TS_RETURN_IF_ERROR(r.float_key("rope_theta", &c->rope_theta));
  TS_RETURN_IF_ERROR(r.bool_key("tie_word_embeddings", &c->tied_embeddings));
  TS_RETURN_IF_ERROR(r.float_key("initializer_range", &c->init_std));
  int64_t head_dim = 0;
  TS_RETURN_IF_ERROR(r.int_key("head_dim", &head_dim, false));
  if (head_dim != 0 && head_dim * c->n_head != c->n_embd)
    return error("config.json: \"head_dim\" = " + std::to_string(head_dim) +
                     " is not hidden_size / num_attention_heads = " + std::to_string(c->n_embd) +
                     " / " + std::to_string(c->n_head),
                 "Tessera's LLaMA has heads of hidden_size / num_attention_heads");
  TS_RETURN_IF_ERROR(r.require("hidden_act", "silu", "SwiGLU (hidden_act \"silu\")"));
  TS_RETURN_IF_ERROR(r.require("attention_bias", false, "projections without biases"));
  TS_RETURN_IF_ERROR(r.require("mlp_bias", false, "projections without biases"));
  TS_RETURN_IF_ERROR(r.require("rope_scaling", nullptr,
                               "plain RoPE with rope_theta; scaled RoPE (LLaMA 3.1's \"llama3\", "
                               "linear, dynamic, yarn) is not implemented yet"));
  // pretraining_tp only splits the matrix products of the reference implementation.
  r.ignore({"attention_dropout", "pretraining_tp"});
  return Status();
}

// Mixtral: LLaMA's attention and norms, a mixture of experts in each block. HF's Mixtral drops
// no token, so the import takes the capacity that drops none (n_experts / experts_per_token).
Status mixtral_from_hf(ConfigReader& r, ModelConfig* c) {
  TS_RETURN_IF_ERROR(llama_from_hf(r, c));
  TS_RETURN_IF_ERROR(r.int_key("num_local_experts", &c->n_experts, true));
  TS_RETURN_IF_ERROR(r.int_key("num_experts_per_tok", &c->experts_per_token, true));
  TS_RETURN_IF_ERROR(r.float_key("router_aux_loss_coef", &c->router_aux_loss_coef));
  c->capacity_factor = static_cast<double>(c->n_experts) /
                       static_cast<double>(std::max<int64_t>(1, c->experts_per_token));
  TS_RETURN_IF_ERROR(r.require("sliding_window", nullptr,
                               "attention over the whole sequence (sliding-window attention is "
                               "not implemented)"));
  if (const json* j = r.find("router_jitter_noise");
      j && !(j->is_number() && j->get<double>() == 0))
    return error(
        "config.json: \"router_jitter_noise\" = " + j->dump() + ": Tessera's router adds no noise",
        "set it to 0");
  r.ignore({"output_router_logits"});
  return Status();
}

Status t5_from_hf(ConfigReader& r, ModelConfig* c) {
  const std::string name = c->name;
  *c = family_defaults("t5");  // T5Config's defaults: relu, 32 buckets up to 128, eps 1e-6
  c->name = name;
  c->max_seq_len = 512;
  TS_RETURN_IF_ERROR(r.int_key("vocab_size", &c->vocab_size, true));
  TS_RETURN_IF_ERROR(r.int_key("d_model", &c->n_embd, true));
  TS_RETURN_IF_ERROR(r.int_key("d_kv", &c->head_size, true));
  TS_RETURN_IF_ERROR(r.int_key("d_ff", &c->ffn_hidden, true));
  TS_RETURN_IF_ERROR(r.int_key("num_layers", &c->n_layer, true));
  TS_RETURN_IF_ERROR(r.int_key("num_heads", &c->n_head, true));
  int64_t decoder_layers = c->n_layer;
  TS_RETURN_IF_ERROR(r.int_key("num_decoder_layers", &decoder_layers, false));
  if (decoder_layers != c->n_layer)
    return error("config.json: \"num_decoder_layers\" = " + std::to_string(decoder_layers) +
                     " differs from \"num_layers\" = " + std::to_string(c->n_layer),
                 "Tessera's T5 has as many decoder blocks as encoder blocks");
  TS_RETURN_IF_ERROR(r.int_key("relative_attention_num_buckets", &c->relative_buckets, false));
  TS_RETURN_IF_ERROR(
      r.int_key("relative_attention_max_distance", &c->relative_max_distance, false));
  TS_RETURN_IF_ERROR(r.int_key("n_positions", &c->max_seq_len, false));
  TS_RETURN_IF_ERROR(r.float_key("layer_norm_epsilon", &c->norm_eps));
  TS_RETURN_IF_ERROR(r.float_key("initializer_factor", &c->init_std));
  TS_RETURN_IF_ERROR(r.bool_key("tie_word_embeddings", &c->tied_embeddings));
  if (const json* ff = r.find("feed_forward_proj")) {
    if (!ff->is_string() || (*ff != "relu" && *ff != "gated-gelu"))
      return error("config.json: \"feed_forward_proj\" = " + ff->dump() + " is not supported",
                   "Tessera's T5 computes \"relu\" (T5) and \"gated-gelu\" (T5 v1.1)");
    c->ffn_activation = ff->get<std::string>();
  }
  TS_RETURN_IF_ERROR(r.require("is_encoder_decoder", true, "an encoder-decoder"));
  // Derived from feed_forward_proj, or training and generation settings.
  r.ignore({"dense_act_fn", "is_gated_act", "dropout_rate", "classifier_dropout",
            "decoder_start_token_id", "output_past"});
  return Status();
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Transposes a [rows, cols] matrix.
std::vector<float> transpose(const float* a, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = a[r * cols + c];
  return out;
}

}  // namespace

Result<HfConfig> model_config_from_hf(const nlohmann::json& config) {
  if (!config.is_object()) return error("config.json is not a JSON object");
  auto type = config.find("model_type");
  if (type == config.end() || !type->is_string())
    return error(
        "config.json: missing \"model_type\"",
        "Tessera imports \"gpt2\" (GPT2LMHeadModel), \"llama\" (LlamaForCausalLM) and \"t5\" "
        "(T5ForConditionalGeneration)");
  const std::string model_type = type->get<std::string>();
  HfConfig out;
  out.cfg.name = "hf-" + model_type;
  ConfigReader r(config);
  if (model_type == "gpt2") {
    TS_RETURN_IF_ERROR(gpt2_from_hf(r, &out.cfg));
  } else if (model_type == "llama") {
    TS_RETURN_IF_ERROR(llama_from_hf(r, &out.cfg));
  } else if (model_type == "mixtral") {
    TS_RETURN_IF_ERROR(mixtral_from_hf(r, &out.cfg));
  } else if (model_type == "t5") {
    TS_RETURN_IF_ERROR(t5_from_hf(r, &out.cfg));
  } else {
    return error(
        "config.json: model_type \"" + model_type + "\" is not supported",
        "Tessera imports \"gpt2\" (GPT2LMHeadModel), \"llama\" (LlamaForCausalLM), \"mixtral\" "
        "(MixtralForCausalLM) and \"t5\" (T5ForConditionalGeneration)");
  }
  Status s = validate(out.cfg);
  if (!s.ok()) return s.with_context("config.json");
  out.unknown_keys = r.unknown();
  return out;
}

Result<nlohmann::json> model_config_to_hf(const ModelConfig& c) {
  TS_RETURN_IF_ERROR(validate(c));
  if (c.family == "gpt")
    return json{{"architectures", {"GPT2LMHeadModel"}},
                {"model_type", "gpt2"},
                {"vocab_size", c.vocab_size},
                {"n_positions", c.max_seq_len},
                {"n_ctx", c.max_seq_len},
                {"n_embd", c.n_embd},
                {"n_layer", c.n_layer},
                {"n_head", c.n_head},
                {"n_inner", c.ffn() == 4 * c.n_embd ? json(nullptr) : json(c.ffn())},
                {"layer_norm_epsilon", c.norm_eps},
                {"activation_function", "gelu_new"},
                {"scale_attn_weights", true},
                {"tie_word_embeddings", c.tied_embeddings},
                {"initializer_range", c.init_std}};
  if (c.family == "llama") {
    json j = json{{"architectures", {"LlamaForCausalLM"}},
                  {"model_type", "llama"},
                  {"vocab_size", c.vocab_size},
                  {"hidden_size", c.n_embd},
                  {"intermediate_size", c.ffn()},
                  {"num_hidden_layers", c.n_layer},
                  {"num_attention_heads", c.n_head},
                  {"num_key_value_heads", c.kv_heads()},
                  {"head_dim", c.head_dim()},
                  {"max_position_embeddings", c.max_seq_len},
                  {"rms_norm_eps", c.norm_eps},
                  {"rope_theta", c.rope_theta},
                  {"rope_scaling", nullptr},
                  {"hidden_act", "silu"},
                  {"attention_bias", false},
                  {"mlp_bias", false},
                  {"tie_word_embeddings", c.tied_embeddings},
                  {"initializer_range", c.init_std}};
    if (!c.is_moe()) return j;
    // MixtralForCausalLM, which drops no token.
    if (c.capacity_factor * static_cast<double>(c.experts_per_token) <
        static_cast<double>(c.n_experts) * (1 - 1e-9))  // (E / k x k may round below E)
      return error("capacity_factor = " + std::to_string(c.capacity_factor) +
                       " drops tokens, which Hugging Face's Mixtral never does",
                   "export a model trained with capacity_factor >= n_experts / experts_per_token "
                   "(its weights compute the same either way; only the dropping differs)");
    j["architectures"] = {"MixtralForCausalLM"};
    j["model_type"] = "mixtral";
    for (const char* k : {"rope_scaling", "attention_bias", "mlp_bias"}) j.erase(k);
    j["sliding_window"] = nullptr;
    j["num_local_experts"] = c.n_experts;
    j["num_experts_per_tok"] = c.experts_per_token;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = false;
    return j;
  }
  if (c.family == "t5")
    return json{{"architectures", {"T5ForConditionalGeneration"}},
                {"model_type", "t5"},
                {"vocab_size", c.vocab_size},
                {"d_model", c.n_embd},
                {"d_kv", c.head_dim()},
                {"d_ff", c.ffn()},
                {"num_layers", c.n_layer},
                {"num_decoder_layers", c.n_layer},
                {"num_heads", c.n_head},
                {"relative_attention_num_buckets", c.relative_buckets},
                {"relative_attention_max_distance", c.relative_max_distance},
                {"n_positions", c.max_seq_len},
                {"layer_norm_epsilon", c.norm_eps},
                {"initializer_factor", c.init_std},
                {"feed_forward_proj", c.ffn_activation},
                {"is_encoder_decoder", true},
                {"tie_word_embeddings", c.tied_embeddings}};
  return error("model family \"" + c.family + "\" has no Hugging Face counterpart");
}

namespace {

// T5ForConditionalGeneration's tensors, all in Tessera's layout; the relative bias tables live
// in HF's block 0.
template <typename Add>
void add_t5_tensors(const ModelConfig& c, Add& add) {
  const int64_t C = c.n_embd, F = c.ffn(), I = c.n_head * c.head_dim();
  add("shared.weight", "shared.weight", HfLayout::same, {c.vocab_rows(), C});
  for (const char* side : {"encoder", "decoder"})
    add(std::string(side) + ".relative_attention_bias.weight",
        std::string(side) + ".block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        HfLayout::same, {c.relative_buckets, c.n_head});
  for (const std::string side : {"encoder", "decoder"}) {
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string p = side + ".block." + std::to_string(l) + ".", hp = p + "layer.";
      auto attention = [&](const std::string& mine, const std::string& hf) {
        for (const char* m : {"q", "k", "v", "o"})
          add(p + mine + "." + m + ".weight", hf + "." + m + ".weight", HfLayout::same,
              std::string(m) == "o" ? std::vector<int64_t>{C, I} : std::vector<int64_t>{I, C});
      };
      add(p + "attn_norm.weight", hp + "0.layer_norm.weight", HfLayout::same, {C});
      attention("attn", hp + "0.SelfAttention");
      int ff = 1;
      if (side == "decoder") {
        add(p + "cross_norm.weight", hp + "1.layer_norm.weight", HfLayout::same, {C});
        attention("cross", hp + "1.EncDecAttention");
        ff = 2;
      }
      const std::string hf = hp + std::to_string(ff);
      add(p + "mlp_norm.weight", hf + ".layer_norm.weight", HfLayout::same, {C});
      const std::vector<std::string> in = c.ffn_activation == "gated-gelu"
                                              ? std::vector<std::string>{"wi_0", "wi_1"}
                                              : std::vector<std::string>{"wi"};
      for (const std::string& w : in)
        add(p + "mlp." + w + ".weight", hf + ".DenseReluDense." + w + ".weight", HfLayout::same,
            {F, C});
      add(p + "mlp.wo.weight", hf + ".DenseReluDense.wo.weight", HfLayout::same, {C, F});
    }
    add(side + ".final_norm.weight", side + ".final_layer_norm.weight", HfLayout::same, {C});
  }
}

}  // namespace

std::vector<HfTensor> hf_tensors(const ModelConfig& c) {
  const int64_t C = c.n_embd, F = c.ffn(), V = c.vocab_rows(), D = c.head_dim();
  std::vector<HfTensor> out;
  auto add = [&](std::string name, std::string hf, HfLayout layout, std::vector<int64_t> shape) {
    std::vector<int64_t> hf_shape = shape;
    if (layout == HfLayout::transposed || layout == HfLayout::gpt_qkv_weight)
      std::swap(hf_shape[0], hf_shape[1]);
    if (name == "wte" || name == "tok_emb" || name == "shared.weight" || name == "lm_head.weight")
      hf_shape[0] = c.vocab_size;
    out.push_back({std::move(name), std::move(hf), layout, std::move(shape), std::move(hf_shape)});
  };
  if (c.family == "gpt") {
    const std::string t = "transformer.";
    add("wte", t + "wte.weight", HfLayout::same, {V, C});
    add("wpe", t + "wpe.weight", HfLayout::same, {c.max_seq_len, C});
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string p = "h." + std::to_string(l) + ".", hp = t + p;
      add(p + "ln_1.weight", hp + "ln_1.weight", HfLayout::same, {C});
      add(p + "ln_1.bias", hp + "ln_1.bias", HfLayout::same, {C});
      add(p + "attn.qkv.weight", hp + "attn.c_attn.weight", HfLayout::gpt_qkv_weight, {3 * C, C});
      add(p + "attn.qkv.bias", hp + "attn.c_attn.bias", HfLayout::gpt_qkv_bias, {3 * C});
      add(p + "attn.proj.weight", hp + "attn.c_proj.weight", HfLayout::transposed, {C, C});
      add(p + "attn.proj.bias", hp + "attn.c_proj.bias", HfLayout::same, {C});
      add(p + "ln_2.weight", hp + "ln_2.weight", HfLayout::same, {C});
      add(p + "ln_2.bias", hp + "ln_2.bias", HfLayout::same, {C});
      add(p + "mlp.fc.weight", hp + "mlp.c_fc.weight", HfLayout::transposed, {F, C});
      add(p + "mlp.fc.bias", hp + "mlp.c_fc.bias", HfLayout::same, {F});
      add(p + "mlp.proj.weight", hp + "mlp.c_proj.weight", HfLayout::transposed, {C, F});
      add(p + "mlp.proj.bias", hp + "mlp.c_proj.bias", HfLayout::same, {C});
    }
    add("ln_f.weight", t + "ln_f.weight", HfLayout::same, {C});
    add("ln_f.bias", t + "ln_f.bias", HfLayout::same, {C});
  } else if (c.family == "t5") {
    add_t5_tensors(c, add);
  } else {
    const int64_t Q = c.n_head * D, KV = c.kv_heads() * D;
    add("tok_emb", "model.embed_tokens.weight", HfLayout::same, {V, C});
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      const std::string hp = "model.layers." + std::to_string(l) + ".";
      add(p + "attn_norm.weight", hp + "input_layernorm.weight", HfLayout::same, {C});
      add(p + "attn.q.weight", hp + "self_attn.q_proj.weight", HfLayout::same, {Q, C});
      add(p + "attn.k.weight", hp + "self_attn.k_proj.weight", HfLayout::same, {KV, C});
      add(p + "attn.v.weight", hp + "self_attn.v_proj.weight", HfLayout::same, {KV, C});
      add(p + "attn.o.weight", hp + "self_attn.o_proj.weight", HfLayout::same, {C, Q});
      add(p + "mlp_norm.weight", hp + "post_attention_layernorm.weight", HfLayout::same, {C});
      if (c.is_moe()) {  // Mixtral: w1 the gate, w3 the up projection, w2 the down one
        const int64_t E = c.n_experts;
        const std::string moe = hp + "block_sparse_moe.";
        add(p + "moe.router.weight", moe + "gate.weight", HfLayout::same, {E, C});
        for (auto [mine, hf] :
             {std::pair<const char*, const char*>{"gate", "w1"}, {"up", "w3"}, {"down", "w2"}}) {
          const std::vector<int64_t> slice =
              std::string(mine) == "down" ? std::vector<int64_t>{C, F} : std::vector<int64_t>{F, C};
          for (int64_t e = 0; e < E; ++e)
            out.push_back({p + "moe.experts." + mine,
                           moe + "experts." + std::to_string(e) + "." + hf + ".weight",
                           HfLayout::same,
                           {E, slice[0], slice[1]},
                           slice,
                           e});
        }
        continue;
      }
      add(p + "mlp.gate.weight", hp + "mlp.gate_proj.weight", HfLayout::same, {F, C});
      add(p + "mlp.up.weight", hp + "mlp.up_proj.weight", HfLayout::same, {F, C});
      add(p + "mlp.down.weight", hp + "mlp.down_proj.weight", HfLayout::same, {C, F});
    }
    add("norm.weight", "model.norm.weight", HfLayout::same, {C});
  }
  if (!c.tied_embeddings) add("lm_head.weight", "lm_head.weight", HfLayout::same, {V, C});
  return out;
}

std::vector<std::string> hf_name_aliases(const std::string& hf_name) {
  const std::string t = "transformer.";
  if (hf_name.rfind(t, 0) == 0) return {hf_name.substr(t.size())};
  return {};
}

bool hf_tensor_is_skipped(const ModelConfig& c, const std::string& hf_name) {
  auto ends_with = [&](const std::string& s) {
    return hf_name.size() >= s.size() &&
           hf_name.compare(hf_name.size() - s.size(), s.size(), s) == 0;
  };
  if (c.family == "gpt" && (ends_with(".attn.bias") || ends_with(".attn.masked_bias"))) return true;
  if (c.family == "llama" && ends_with(".rotary_emb.inv_freq")) return true;
  // T5's encoder and decoder embeddings are the shared one (older files hold all three).
  if (c.family == "t5" &&
      (hf_name == "encoder.embed_tokens.weight" || hf_name == "decoder.embed_tokens.weight"))
    return true;
  return c.tied_embeddings && hf_name == "lm_head.weight";
}

std::vector<float> hf_to_tessera(const ModelConfig& c, const HfTensor& t, const float* data) {
  const int64_t n = t.expert >= 0 ? numel(t.hf_shape) : numel(t.shape);  // an expert's slice
  switch (t.layout) {
    case HfLayout::same: {
      std::vector<float> out(static_cast<size_t>(n), 0.0f);  // padded vocabulary rows: zero
      std::copy(data, data + numel(t.hf_shape), out.begin());
      return out;
    }
    case HfLayout::transposed:
      return transpose(data, t.hf_shape[0], t.hf_shape[1]);
    case HfLayout::gpt_qkv_weight: {
      std::vector<float> standard = transpose(data, t.hf_shape[0], t.hf_shape[1]);
      return gpt_qkv_from_standard(standard.data(), t.shape[1], c.n_head, c.head_dim());
    }
    case HfLayout::gpt_qkv_bias:
      return gpt_qkv_from_standard(data, 1, c.n_head, c.head_dim());
  }
  TS_CHECK(false) << "unknown layout for " << t.name;
  return {};
}

std::vector<float> tessera_to_hf(const ModelConfig& c, const HfTensor& t, const float* data) {
  switch (t.layout) {
    case HfLayout::same:  // rows beyond vocab_size (padding) dropped
      return std::vector<float>(data, data + numel(t.hf_shape));
    case HfLayout::transposed:
      return transpose(data, t.shape[0], t.shape[1]);
    case HfLayout::gpt_qkv_weight:
    case HfLayout::gpt_qkv_bias: {
      const int64_t rows = t.shape[0], cols = t.shape.size() > 1 ? t.shape[1] : 1;
      std::vector<float> standard(static_cast<size_t>(rows * cols));
      for (int64_t r = 0; r < rows; ++r) {
        const float* src = data + gpt_qkv_row_from_standard(r, c.n_head, c.head_dim()) * cols;
        std::copy(src, src + cols, standard.begin() + r * cols);
      }
      if (t.layout == HfLayout::gpt_qkv_bias) return standard;
      return transpose(standard.data(), rows, cols);
    }
  }
  TS_CHECK(false) << "unknown layout for " << t.name;
  return {};
}

}  // namespace tessera
