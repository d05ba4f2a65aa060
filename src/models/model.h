// Model families written with the builder only: GPT (GPT-2/GPT-3: learned positions, LayerNorm,
// GELU, tied embeddings), LLaMA-style (RMSNorm, SwiGLU, RoPE, grouped-query attention,
// untied head), and ViT (Dosovitskiy et al. 2021: images cut into patches, a class token,
// learned positions, GPT's pre-norm blocks with bidirectional attention, a classifier head on
// the class token). Model code never mentions devices or ranks.
//
//   ModelConfig cfg = *find_preset("gpt2-small");
//   TS_RETURN_IF_ERROR(validate(cfg));
//   ModelGraph m = build_model(cfg, /*batch=*/4, /*seq=*/64, ModelMode::train);
//   m.graph.param_count() == 124439808;
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "ir/graph.h"

namespace tessera {

struct ModelConfig {
  std::string name = "custom";
  std::string family = "gpt";  // "gpt" | "llama" | "vit"
  // The classes the output softmax ranges over: a language model's vocabulary, an image
  // classifier's labels.
  int64_t vocab_size = 50257;
  // Rows of the embedding table and LM head when larger than vocab_size (0: none), e.g.
  // llm.c's 50304 for GPT-2: a size a tensor axis can split (vocab parallelism). The padding
  // rows are never a target or a sample: the loss and the sampler see vocab_size logits.
  int64_t padded_vocab_size = 0;
  int64_t n_layer = 12;
  int64_t n_embd = 768;
  int64_t n_head = 12;
  int64_t n_kv_head = 0;       // llama: grouped-query heads (0 = n_head)
  int64_t ffn_hidden = 0;      // 0 = 4 * n_embd (gpt)
  int64_t max_seq_len = 1024;  // vit: image_tokens()
  // vit: square images of image_size^2 pixels with `channels` values each, cut into
  // (image_size / patch_size)^2 patches.
  int64_t image_size = 0, patch_size = 0, channels = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tied_embeddings = true;  // gpt: lm head = wte; llama: separate lm_head
  double init_std = 0.02;

  int64_t head_dim() const { return n_embd / n_head; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * n_embd; }
  int64_t vocab_rows() const { return padded_vocab_size > 0 ? padded_vocab_size : vocab_size; }
  int64_t patches() const {
    return patch_size > 0 ? (image_size / patch_size) * (image_size / patch_size) : 0;
  }
  int64_t image_tokens() const { return patches() + 1; }  // vit: the class token and the patches
  bool operator==(const ModelConfig&) const = default;
};

// Checks the config is buildable (positive sizes, heads dividing the width, ...). Errors name
// the key and the accepted values.
Status validate(const ModelConfig& cfg);

// Built-in presets: gpt2-small/medium/large/xl, gpt3-125m ... gpt3-175b, llama2-7b/13b/70b,
// llama3-8b/70b/405b, vit-b16/l16/h14 (ImageNet-1k heads), and small ones for training here
// (gpt-mini, gpt-tiny, llama-tiny; vit-tiny on 28 x 28 grey images, 10 classes).
std::optional<ModelConfig> find_preset(const std::string& name);
std::vector<std::string> preset_names();

// The inputs of the language models (GPT, LLaMA).
inline constexpr char kTokensInput[] = "tokens";
inline constexpr char kTargetsInput[] = "targets";

// One of a model graph's inputs. Every input's leading dimension is the batch (data
// parallelism splits it); a data source provides them by name (runtime/feed.h).
struct ModelInput {
  std::string name;
  ValueId value = -1;
  bool target = false;  // what the loss compares against (loss and train modes only)
};

// What a model family learns from, and so which data a run reads.
enum class ModelTask {
  language_model,  // tokens -> next-token logits; inputs "tokens", "targets"
  image_classes,   // images -> class logits; inputs "images" f32 [B, C, H, W], "labels" i32 [B]
};
ModelTask task_of(const ModelConfig& cfg);

// The inputs of the image classifiers (ViT).
inline constexpr char kImagesInput[] = "images";
inline constexpr char kLabelsInput[] = "labels";

struct ModelGraph {
  Graph graph;
  // Language models: "tokens" i32 [B, T], then "targets" i32 [B, T] (loss and train modes).
  std::vector<ModelInput> inputs;
  ValueId logits = -1;  // f32 [B*T, vocab_rows]; the first vocab_size columns are the classes
  ValueId loss = -1;    // f32 [] (loss and train modes)
  int64_t classes = 0;  // ModelConfig::vocab_size: the logits' columns that are tokens
  int64_t batch = 0, seq = 0;  // seq: tokens per example (vit: image_tokens())
};

// What a model graph computes: logits only (sampling), the loss (evaluation), or the loss and
// the gradient of every parameter (training).
enum class ModelMode { logits, loss, train };

// Builds the graph on [batch, seq] tokens (vit: on `batch` images; seq is ignored). Logits are
// readable after a run in logits mode, and in the other modes only with keep_logits (it keeps
// [B,T,V] floats alive for the whole step). The config must have passed validate().
ModelGraph build_model(const ModelConfig& cfg, int64_t batch, int64_t seq, ModelMode mode,
                       bool keep_logits = false);

// GPT's fused QKV projection ("h.N.attn.qkv.weight" [3C, C] and ".bias" [3C]) stores its 3C
// output rows per head, in (head, q|k|v, head_dim) order, so that a tensor axis splitting
// the rows hands each rank whole heads of q, k and v (Megatron's layout). PyTorch references
// and Hugging Face GPT-2 order them (q|k|v, head, head_dim); this is the row of Tessera's
// order that holds their row `row`.
int64_t gpt_qkv_row_from_standard(int64_t row, int64_t n_head, int64_t head_dim);
// Tessera's order of a tensor whose leading dim is 3 x n_head x head_dim rows of `cols`
// elements in the standard (q|k|v, head, head_dim) order.
std::vector<float> gpt_qkv_from_standard(const float* standard, int64_t cols, int64_t n_head,
                                         int64_t head_dim);

// Parameter count from the config alone (checked against the built graph in tests).
int64_t count_params(const ModelConfig& cfg);

}  // namespace tessera
