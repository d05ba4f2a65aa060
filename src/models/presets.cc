#include <cmath>

#include "models/model.h"

namespace tessera {

namespace {

ModelConfig gpt(const char* name, int64_t layers, int64_t width, int64_t heads, int64_t ctx,
                int64_t vocab = 50257) {
  ModelConfig c;
  c.name = name;
  c.family = "gpt";
  c.n_layer = layers;
  c.n_embd = width;
  c.n_head = heads;
  c.max_seq_len = ctx;
  c.vocab_size = vocab;
  return c;
}

ModelConfig llama(const char* name, int64_t layers, int64_t width, int64_t heads, int64_t kv_heads,
                  int64_t ffn, int64_t vocab, int64_t ctx, double theta) {
  ModelConfig c;
  c.name = name;
  c.family = "llama";
  c.n_layer = layers;
  c.n_embd = width;
  c.n_head = heads;
  c.n_kv_head = kv_heads;
  c.ffn_hidden = ffn;
  c.vocab_size = vocab;
  c.max_seq_len = ctx;
  c.rope_theta = theta;
  c.tied_embeddings = false;
  return c;
}

// A LLaMA whose MLPs are mixtures of `experts` experts, `top_k` per token.
ModelConfig moe(ModelConfig c, int64_t experts, int64_t top_k) {
  c.n_experts = experts;
  c.experts_per_token = top_k;
  return c;
}

// ViT with the ImageNet-1k head (the public vit-base/large/huge checkpoints' shapes).
ModelConfig vit(const char* name, int64_t layers, int64_t width, int64_t heads, int64_t image,
                int64_t patch, int64_t channels, int64_t classes) {
  ModelConfig c;
  c.name = name;
  c.family = "vit";
  c.n_layer = layers;
  c.n_embd = width;
  c.n_head = heads;
  c.image_size = image;
  c.patch_size = patch;
  c.channels = channels;
  c.vocab_size = classes;
  c.max_seq_len = c.image_tokens();
  c.norm_eps = 1e-6;
  c.tied_embeddings = false;
  return c;
}

// T5 (Raffel et al. 2020, the released checkpoints): relu feed-forward, the head tied to the
// embedding, 32 relative buckets up to 128 apart, a 32128-row vocabulary (SentencePiece's
// 32000, 100 sentinels, padding).
ModelConfig t5(const char* name, int64_t layers, int64_t width, int64_t heads, int64_t head_size,
               int64_t ffn, int64_t vocab = 32128) {
  ModelConfig c;
  c.name = name;
  c.family = "t5";
  c.n_layer = layers;
  c.n_embd = width;
  c.n_head = heads;
  c.head_size = head_size;
  c.ffn_hidden = ffn;
  c.vocab_size = vocab;
  c.max_seq_len = 512;
  c.norm_eps = 1e-6;
  c.init_std = 1.0;  // T5's initializer factor
  c.ffn_activation = "relu";
  c.relative_buckets = 32;
  c.relative_max_distance = 128;
  return c;
}

std::vector<ModelConfig> all_presets() {
  return {
      // Sized to learn in minutes on 2 CPU cores (the `tessera train` default).
      gpt("gpt-mini", 4, 192, 6, 128),
      gpt("gpt-tiny", 2, 64, 4, 64),
      llama("llama-tiny", 2, 64, 4, 2, 128, 50257, 64, 10000.0),
      moe(llama("moe-tiny", 2, 64, 4, 2, 128, 50257, 64, 10000.0), 8, 2),
      // Fashion-MNIST's 28 x 28 grey images in 7 x 7 patches, 10 classes.
      vit("vit-tiny", 4, 64, 4, 28, 7, 1, 10),
      // GPT-2's tokens, then 100 sentinels and the decoder's start token (kT5ExtraTokens).
      t5("t5-tiny", 2, 64, 4, 16, 256, 50257 + kT5ExtraTokens),
      // GPT-2 (Radford et al. 2019).
      gpt("gpt2-small", 12, 768, 12, 1024),
      gpt("gpt2-medium", 24, 1024, 16, 1024),
      gpt("gpt2-large", 36, 1280, 20, 1024),
      gpt("gpt2-xl", 48, 1600, 25, 1024),
      // GPT-3 (Brown et al. 2020, Table 2.1); 13B uses width 5120 (the paper's 5140 is not a
      // multiple of its 40 heads).
      gpt("gpt3-125m", 12, 768, 12, 2048),
      gpt("gpt3-350m", 24, 1024, 16, 2048),
      gpt("gpt3-760m", 24, 1536, 16, 2048),
      gpt("gpt3-1.3b", 24, 2048, 16, 2048),
      gpt("gpt3-2.7b", 32, 2560, 32, 2048),
      gpt("gpt3-6.7b", 32, 4096, 32, 2048),
      gpt("gpt3-13b", 40, 5120, 40, 2048),
      gpt("gpt3-175b", 96, 12288, 96, 2048),
      // Megatron-LM's GPT-2 8.3B (Shoeybi et al. 2019, Table 1), MT-NLG 530B (Smith et al.
      // 2022, Table 1) and the 1T model of Narayanan et al. 2021 (Table 1).
      gpt("megatron-8.3b", 72, 3072, 24, 1024),
      gpt("mt-nlg-530b", 105, 20480, 128, 2048),
      gpt("gpt-1t", 128, 25600, 160, 2048),
      // LLaMA 2 (Touvron et al. 2023) and LLaMA 3 (Dubey et al. 2024).
      llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, 10000.0),
      llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, 10000.0),
      llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, 10000.0),
      llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 500000.0),
      llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 500000.0),
      llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192, 500000.0),
      // Mixtral 8x7B (Jiang et al. 2024): Mistral 7B's attention, 8 experts, 2 per token.
      moe(llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768, 1e6), 8, 2),
      // ViT (Dosovitskiy et al. 2021, Table 1) at 224 x 224 with 1000 classes.
      vit("vit-b16", 12, 768, 12, 224, 16, 3, 1000),
      vit("vit-l16", 24, 1024, 16, 224, 16, 3, 1000),
      vit("vit-h14", 32, 1280, 16, 224, 14, 3, 1000),
      // T5 (Raffel et al. 2020, Table 14's models as released).
      t5("t5-small", 6, 512, 8, 64, 2048),
      t5("t5-base", 12, 768, 12, 64, 3072),
      t5("t5-large", 24, 1024, 16, 64, 4096),
      t5("t5-3b", 24, 1024, 32, 128, 16384),
      t5("t5-11b", 24, 1024, 128, 128, 65536),
  };
}

}  // namespace

ModelConfig family_defaults(const std::string& family) {
  ModelConfig c;
  if (family == "t5") c = t5("custom", c.n_layer, c.n_embd, c.n_head, 0, 0, c.vocab_size);
  c.family = family;
  c.tied_embeddings = family == "gpt" || family == "t5";
  return c;
}

std::optional<ModelConfig> find_preset(const std::string& name) {
  for (const ModelConfig& c : all_presets())
    if (c.name == name) return c;
  return std::nullopt;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const ModelConfig& c : all_presets()) names.push_back(c.name);
  return names;
}

namespace {

// The parameter count in T: int64_t for count_params, double for validate() to bound a config
// whose count would overflow.
template <typename T>
T params_as(const ModelConfig& c) {
  T C = static_cast<T>(c.n_embd), V = static_cast<T>(c.vocab_rows()), F = static_cast<T>(c.ffn()),
    L = static_cast<T>(c.n_layer);
  if (c.family == "gpt" || c.family == "vit") {
    T block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (F * C + F) + (C * F + C);
    if (c.family == "vit") {
      T K = static_cast<T>(c.channels * c.patch_size * c.patch_size);
      // patch embedding, class token, positions, blocks, final norm, head
      return (C * K + C) + C + static_cast<T>(c.image_tokens()) * C + L * block + 2 * C +
             (V * C + V);
    }
    return V * C + static_cast<T>(c.max_seq_len) * C + L * block + 2 * C +
           (c.tied_embeddings ? 0 : V * C);
  }
  if (c.family == "t5") {
    T inner = static_cast<T>(c.n_head * c.head_dim());
    T ffn = (c.ffn_activation == "gated-gelu" ? 3 : 2) * F * C;
    T encoder = 2 * C + 4 * inner * C + ffn, decoder = 3 * C + 8 * inner * C + ffn;
    T tables = 2 * static_cast<T>(c.relative_buckets * c.n_head);
    // shared embedding, bias tables, blocks, final norms, untied head
    return V * C + tables + L * (encoder + decoder) + 2 * C + (c.tied_embeddings ? 0 : V * C);
  }
  T kv = static_cast<T>(c.kv_heads() * c.head_dim());
  T mlp = 3 * F * C;
  if (c.is_moe()) mlp = static_cast<T>(c.n_experts) * (mlp + C);  // the experts and the router
  T block = 2 * C + C * C + 2 * kv * C + C * C + mlp;
  return V * C + L * block + C + (c.tied_embeddings ? 0 : V * C);
}

}  // namespace

// The keys only family "t5" has, and its constraints.
Status validate_t5_keys(const ModelConfig& c) {
  if (c.family != "t5") {
    if (c.head_size != 0 || !c.ffn_activation.empty() || c.relative_buckets != 0 ||
        c.relative_max_distance != 0)
      return error(
          "keys 'head_size', 'ffn_activation', 'relative_buckets' and 'relative_max_distance' "
          "are for family \"t5\" only");
    return Status();
  }
  if (c.head_size < 0)
    return error("key 'head_size' must be >= 0 (0 = n_embd / n_head), got " +
                 std::to_string(c.head_size));
  if (c.head_size > (int64_t{1} << 16))
    return error("key 'head_size' = " + std::to_string(c.head_size) + " is over 65536");
  if (c.ffn_activation != "relu" && c.ffn_activation != "gated-gelu")
    return error("key 'ffn_activation' is \"" + c.ffn_activation +
                 "\"; accepted values for family \"t5\": \"relu\", \"gated-gelu\"");
  if (c.relative_buckets < 4 || c.relative_buckets > 4096)
    return error(
        "key 'relative_buckets' = " + std::to_string(c.relative_buckets) + " must be in [4, 4096]",
        "T5 uses 32");
  if (c.relative_max_distance <= c.relative_buckets / 2 || c.relative_max_distance > (1 << 24))
    return error("key 'relative_max_distance' = " + std::to_string(c.relative_max_distance) +
                     " must be over relative_buckets / 2 = " +
                     std::to_string(c.relative_buckets / 2) + " (and at most 2^24)",
                 "T5 uses 128 with 32 buckets");
  if (c.n_kv_head != 0)
    return error("key 'n_kv_head': family \"t5\" has no grouped-query attention");
  if (c.max_seq_len < 2)
    return error("key 'max_seq_len' = " + std::to_string(c.max_seq_len) +
                 ": a t5 needs at least 2 tokens of text to corrupt a span of");
  return Status();
}

// The mixture-of-experts keys (family "llama" only) and their constraints.
Status validate_moe_keys(const ModelConfig& c) {
  if (c.n_experts < 0 || c.n_experts > 4096)
    return error("key 'n_experts' = " + std::to_string(c.n_experts) + " must be in [0, 4096]",
                 "0 for a dense MLP; Mixtral uses 8");
  if (c.n_experts == 0) {
    if (c.experts_per_token != 0)
      return error("key 'experts_per_token' needs n_experts > 0 (a mixture of experts)");
    return Status();
  }
  if (c.family != "llama")
    return error("key 'n_experts': mixtures of experts are built for family \"llama\" only");
  if (c.experts_per_token < 1 || c.experts_per_token > c.n_experts)
    return error("key 'experts_per_token' = " + std::to_string(c.experts_per_token) +
                     " must be in [1, n_experts = " + std::to_string(c.n_experts) + "]",
                 "Mixtral routes each token to 2 experts");
  if (!(c.capacity_factor > 0) || !(c.capacity_factor <= 1e6))
    return error("key 'capacity_factor' must be in (0, 1e6]",
                 "1.25 is usual; n_experts / experts_per_token drops no token");
  if (!(c.router_aux_loss_coef >= 0) || !(c.router_aux_loss_coef <= 1e6))
    return error("key 'router_aux_loss_coef' must be in [0, 1e6]", "Mixtral uses 0.02");
  return Status();
}

Status validate(const ModelConfig& c) {
  auto positive = [](const char* key, int64_t v) -> Status {
    if (v <= 0)
      return error("key '" + std::string(key) + "' must be a positive integer, got " +
                   std::to_string(v));
    return Status();
  };
  if (c.family != "gpt" && c.family != "llama" && c.family != "vit" && c.family != "t5")
    return error("key 'family' is \"" + c.family +
                 "\"; accepted values: \"gpt\", \"llama\", \"vit\", \"t5\"");
  TS_RETURN_IF_ERROR(positive("vocab_size", c.vocab_size));
  if (c.padded_vocab_size != 0 && c.padded_vocab_size < c.vocab_size)
    return error("key 'padded_vocab_size' = " + std::to_string(c.padded_vocab_size) +
                     " is smaller than vocab_size = " + std::to_string(c.vocab_size),
                 "use 0 (no padding) or a size >= vocab_size, e.g. a multiple of 128");
  TS_RETURN_IF_ERROR(positive("n_layer", c.n_layer));
  TS_RETURN_IF_ERROR(positive("n_embd", c.n_embd));
  TS_RETURN_IF_ERROR(positive("n_head", c.n_head));
  TS_RETURN_IF_ERROR(positive("max_seq_len", c.max_seq_len));
  TS_RETURN_IF_ERROR(validate_t5_keys(c));
  if (c.head_size == 0 && c.n_embd % c.n_head != 0)
    return error("n_head = " + std::to_string(c.n_head) +
                     " does not divide n_embd = " + std::to_string(c.n_embd),
                 "choose n_head among the divisors of n_embd (head_dim = n_embd / n_head)");
  if (c.n_kv_head < 0 || (c.n_kv_head > 0 && c.n_head % c.n_kv_head != 0))
    return error("n_kv_head = " + std::to_string(c.n_kv_head) +
                     " does not divide n_head = " + std::to_string(c.n_head),
                 "use a divisor of n_head (or 0 for n_head)");
  if (c.family != "llama" && c.family != "t5" && c.n_kv_head > 0 && c.n_kv_head != c.n_head)
    return error("n_kv_head (grouped-query attention) is only supported by family \"llama\"");
  if (c.family == "vit") {
    TS_RETURN_IF_ERROR(positive("image_size", c.image_size));
    TS_RETURN_IF_ERROR(positive("patch_size", c.patch_size));
    TS_RETURN_IF_ERROR(positive("channels", c.channels));
    if (c.image_size % c.patch_size != 0)
      return error("patch_size = " + std::to_string(c.patch_size) +
                       " does not divide image_size = " + std::to_string(c.image_size),
                   "choose a patch size among the divisors of the image size");
    if (c.image_size > (int64_t{1} << 16) || c.channels > 4096)
      return error("image_size " + std::to_string(c.image_size) + " or channels " +
                   std::to_string(c.channels) + " is too large (at most 65536 and 4096)");
    if (c.max_seq_len != c.image_tokens())
      return error("key 'max_seq_len' = " + std::to_string(c.max_seq_len) +
                       ": a vit's sequence is its class token and patches, (image_size / "
                       "patch_size)^2 + 1 = " +
                       std::to_string(c.image_tokens()),
                   "leave max_seq_len out of a vit config, or set it to " +
                       std::to_string(c.image_tokens()));
    if (c.tied_embeddings) return error("key 'tied_embeddings': a vit has no embedding to tie");
  } else if (c.image_size != 0 || c.patch_size != 0 || c.channels != 0) {
    return error("keys 'image_size', 'patch_size' and 'channels' are for family \"vit\" only");
  }
  if (c.family == "llama" && c.head_dim() % 2 != 0)
    return error("head_dim = n_embd / n_head = " + std::to_string(c.head_dim()) +
                 " must be even for RoPE");
  TS_RETURN_IF_ERROR(validate_moe_keys(c));
  if (c.ffn_hidden < 0) return error("key 'ffn_hidden' must be >= 0 (0 = 4 * n_embd)");
  if (!(c.norm_eps > 0)) return error("key 'norm_eps' must be > 0");
  if (!(c.rope_theta > 0)) return error("key 'rope_theta' must be > 0");
  if (!(c.init_std > 0)) return error("key 'init_std' must be > 0");
  // Sizes are int64 element counts: bound every dimension and the parameter count (computed in
  // double here, so that a typo like n_embd = 4e9 is refused instead of overflowing).
  constexpr int64_t kMaxDim = int64_t{1} << 24;
  for (auto [key, v] : {std::pair<const char*, int64_t>{"n_embd", c.n_embd},
                        {"ffn_hidden", c.ffn()},
                        {"vocab_size", c.vocab_rows()},
                        {"max_seq_len", c.max_seq_len}})
    if (v > kMaxDim)
      return error("key '" + std::string(key) + "' = " + std::to_string(v) + " is over " +
                       std::to_string(kMaxDim) + ", the largest size Tessera takes",
                   "check the value for a typo (the largest published models have n_embd ~ 2e4)");
  // Graphs are built node by node (tens per block): deeper than this takes minutes and GBs
  // to build before anything runs. The deepest published transformers have ~100-200 blocks.
  constexpr int64_t kMaxLayers = 10000;
  if (c.n_layer > kMaxLayers)
    return error("key 'n_layer' = " + std::to_string(c.n_layer) + " is over " +
                     std::to_string(kMaxLayers) + ", the deepest model Tessera builds",
                 "check the value for a typo (the deepest published transformers have ~100-200 "
                 "blocks)");
  const double params = params_as<double>(c);
  constexpr double kMaxParams = 1e15;
  if (params > kMaxParams)
    return error("the model would have about " + std::to_string(static_cast<long long>(params)) +
                     " parameters, over the 1e15 Tessera takes",
                 "check n_embd, ffn_hidden, n_layer and vocab_size for a typo");
  return Status();
}

int64_t count_params(const ModelConfig& c) { return params_as<int64_t>(c); }

int64_t count_expert_params(const ModelConfig& c) {
  return c.is_moe() ? c.n_layer * c.n_experts * 3 * c.ffn() * c.n_embd : 0;
}

}  // namespace tessera
