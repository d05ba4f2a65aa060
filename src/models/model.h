// Model families written with the builder only: GPT (GPT-2/GPT-3: learned positions, LayerNorm,
// GELU, tied embeddings), LLaMA-style (RMSNorm, SwiGLU, RoPE, grouped-query attention,
// untied head), ViT (Dosovitskiy et al. 2021: images cut into patches, a class token,
// learned positions, GPT's pre-norm blocks with bidirectional attention, a classifier head on
// the class token), and T5 (Raffel et al. 2020: an encoder-decoder with relative position
// buckets, scale-only norms, no biases, trained by span corruption). Model code never mentions
// devices or ranks.
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
  std::string family = "gpt";  // "gpt" | "llama" | "vit" | "t5"
  // The classes the output softmax ranges over: a language model's vocabulary, an image
  // classifier's labels.
  int64_t vocab_size = 50257;
  // Rows of the embedding table and LM head when larger than vocab_size (0: none), e.g.
  // llm.c's 50304 for GPT-2: a size a tensor axis can split (vocab parallelism). The padding
  // rows are never a target or a sample: the loss and the sampler see vocab_size logits.
  int64_t padded_vocab_size = 0;
  int64_t n_layer = 12;  // t5: the encoder's blocks, and as many decoder blocks
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
  // t5: T5's initializer factor instead: each weight's std is init_std times T5's rule (1 for
  // the embeddings, fan_in^-0.5 for the projections).
  double init_std = 0.02;
  // t5: the width of an attention head when it is not n_embd / n_head (t5-3b and t5-11b: 128,
  // with 32 and 128 heads on a width of 1024); 0 = n_embd / n_head.
  int64_t head_size = 0;
  // t5: the feed-forward block, "relu" (T5: wo(relu(wi x))) or "gated-gelu" (T5 v1.1:
  // wo(gelu(wi_0 x) * wi_1 x)). Other families have their own and leave it empty.
  std::string ffn_activation;
  // t5: relative position buckets per attention bias table, and the offset from which all
  // offsets share the last bucket (T5: 32 and 128).
  int64_t relative_buckets = 0, relative_max_distance = 0;
  // gpt and llama: the storage of parameters, activations and gradients (bf16/f16: mixed
  // precision, with f32 master weights and optimizer state kept by the optimizer).
  DType dtype = DType::f32;
  // llama: a mixture of experts in place of each block's MLP (Mixtral; models/moe.cc) when
  // n_experts > 0: a router picks experts_per_token of n_experts SwiGLU experts (each of
  // ffn_hidden) per token and sums their outputs weighted by the softmax of the picked router
  // logits. Each expert takes at most capacity_factor x its even share of the tokens of an
  // example (the rest are dropped there: their other experts and the residual carry them);
  // capacity_factor >= n_experts / experts_per_token drops nothing. The loss adds
  // router_aux_loss_coef x the load-balancing loss (Switch Transformer's, averaged over blocks).
  int64_t n_experts = 0;
  int64_t experts_per_token = 0;
  double capacity_factor = 1.25;
  double router_aux_loss_coef = 0.02;

  bool is_moe() const { return n_experts > 0; }
  // Token slots per expert for `tokens` tokens of `examples` examples (models/moe.cc).
  int64_t expert_capacity(int64_t examples, int64_t tokens) const;
  int64_t head_dim() const { return head_size > 0 ? head_size : n_embd / n_head; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * n_embd; }
  int64_t vocab_rows() const { return padded_vocab_size > 0 ? padded_vocab_size : vocab_size; }
  int64_t patches() const {
    return patch_size > 0 ? (image_size / patch_size) * (image_size / patch_size) : 0;
  }
  int64_t image_tokens() const { return patches() + 1; }  // vit: the class token and the patches
  bool operator==(const ModelConfig&) const = default;
};

// The config a family's keys start from when no preset is named: ModelConfig's defaults with
// the family's own (llama and vit: an untied head; t5: T5's norms, buckets, relu, tied head).
ModelConfig family_defaults(const std::string& family);

// Checks the config is buildable (positive sizes, heads dividing the width, ...). Errors name
// the key and the accepted values.
Status validate(const ModelConfig& cfg);

// Built-in presets: gpt2-small/medium/large/xl, gpt3-125m ... gpt3-175b, llama2-7b/13b/70b,
// llama3-8b/70b/405b, vit-b16/l16/h14 (ImageNet-1k heads), t5-small/base/large/3b/11b (the
// original T5 checkpoints), and small ones for training here (gpt-mini, gpt-tiny, llama-tiny;
// vit-tiny on 28 x 28 grey images, 10 classes; t5-tiny on the GPT-2 tokens and sentinels).
std::optional<ModelConfig> find_preset(const std::string& name);
std::vector<std::string> preset_names();

// The metric (Graph::metrics) of a mixture of experts: the routes of a step that found a slot.
inline constexpr char kMoeKeptMetric[] = "moe_routes_kept";

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
  language_model,   // tokens -> next-token logits; inputs "tokens", "targets"
  image_classes,    // images -> class logits; inputs "images" f32 [B, C, H, W], "labels" i32 [B]
  span_corruption,  // text with spans replaced by sentinels -> the spans; inputs "tokens",
                    // "decoder_tokens", "targets" (SpanCorruption below)
};
ModelTask task_of(const ModelConfig& cfg);

// The inputs of the image classifiers (ViT).
inline constexpr char kImagesInput[] = "images";
inline constexpr char kLabelsInput[] = "labels";

// T5's decoder input: the targets shifted right by one, after a start token.
inline constexpr char kDecoderTokensInput[] = "decoder_tokens";

// T5's span corruption (Raffel et al. 2020, section 3.1.4) of `raw` tokens of text: `noise`
// of them (15%, rounded) in `spans` spans (of mean length 3) are each replaced by one sentinel
// in the encoder's input, and the decoder predicts every span after its sentinel. The lengths
// are the same for every example, so batches need no padding:
//   encoder input   = raw - noise + spans tokens: kept text, a sentinel per dropped span;
//   decoder targets = noise + spans tokens: each sentinel then the span it stands for.
struct SpanCorruption {
  int64_t raw = 0, noise = 0, spans = 0;
  int64_t encoder_len() const { return raw - noise + spans; }
  int64_t decoder_len() const { return noise + spans; }
};
// A T5 trained here on a tokenizer of V ids adds ids after them: sentinel i (standing for the
// i-th dropped span of an example) is V + i, and V + kT5Sentinels the decoder's start token.
// Examples have at most kT5Sentinels spans.
inline constexpr int64_t kT5Sentinels = 100;
inline constexpr int64_t kT5ExtraTokens = kT5Sentinels + 1;
// The corruption of `raw` >= 2 tokens: noise = round(0.15 raw) clamped to [1, raw - 1],
// spans = round(noise / 3) clamped to [1, min(noise, raw - noise)].
SpanCorruption span_corruption(int64_t raw);

struct ModelGraph {
  Graph graph;
  // Language models: "tokens" i32 [B, T], then "targets" i32 [B, T] (loss and train modes).
  std::vector<ModelInput> inputs;
  // f32 [B, T, vocab_rows] (language models; T5 [B*T, ...], ViT [B, ...]); the first
  // vocab_size columns are the classes.
  ValueId logits = -1;
  ValueId loss = -1;           // f32 [] (loss and train modes)
  int64_t classes = 0;         // ModelConfig::vocab_size: the logits' columns that are tokens
  int64_t batch = 0, seq = 0;  // seq: tokens per example (vit: image_tokens(); t5: raw text)
  // A mixture of experts (loss and train modes): its (token, expert) routes over all blocks;
  // the graph's metric kMoeKeptMetric counts those that found a slot (the rest were dropped).
  int64_t moe_routes = 0;
};

// What a model graph computes: logits only (sampling), the loss (evaluation), or the loss and
// the gradient of every parameter (training).
enum class ModelMode { logits, loss, train };

// Builds the graph on [batch, seq] tokens (vit: on `batch` images, seq is ignored; t5: on
// span_corruption(seq) of `batch` rows of seq tokens). Logits are
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

// The tokens one example of `seq` feeds the model: seq (GPT, LLaMA), the encoder's input
// span_corruption(seq).encoder_len() (T5, which the simulator's tokens/s counts too), the class
// token and patches (ViT).
int64_t tokens_per_example(const ModelConfig& cfg, int64_t seq);

// Transformer blocks in the graph (Node::layer 0 .. num_blocks - 1), which pipeline stages
// hold: n_layer, and T5's n_layer encoder blocks then n_layer decoder blocks.
int64_t num_blocks(const ModelConfig& cfg);

// Parameter count from the config alone (checked against the built graph in tests).
int64_t count_params(const ModelConfig& cfg);
// Of them, the experts' (a mixture of experts' stacked gate, up and down weights; 0 when dense).
int64_t count_expert_params(const ModelConfig& cfg);

}  // namespace tessera
