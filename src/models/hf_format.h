// How Tessera's models are named and laid out in Hugging Face `transformers` checkpoints:
// GPT (GPT2LMHeadModel, model_type "gpt2"), LLaMA (LlamaForCausalLM, "llama"), a LLaMA with
// mixtures of experts (MixtralForCausalLM, "mixtral": each expert its own HF tensors) and T5
// (T5ForConditionalGeneration, "t5": HF's names, Tessera's layouts; the relative bias tables
// that HF keeps in block 0 are Tessera's encoder/decoder.relative_attention_bias). The file
// I/O lives in io/hf_checkpoint.h; this is the model-family knowledge it needs.
//
//   TS_ASSIGN_OR_RETURN(HfConfig hc, model_config_from_hf(config_json));   // config.json
//   for (const HfTensor& t : hf_tensors(hc.cfg)) {
//     // t.name "h.0.attn.qkv.weight" [3C, C]  <->  t.hf_name
//     // "transformer.h.0.attn.c_attn.weight" [C, 3C], layout HfLayout::gpt_qkv_weight
//     std::vector<float> mine = hf_to_tessera(hc.cfg, t, hf_data);
//   }
//
// Layouts. GPT-2's Conv1D weights are stored [in, out] (Tessera: [out, in]) and its fused
// c_attn orders the 3C outputs (q|k|v, head, head_dim), Tessera per head (model.h). LLaMA's
// q/k rows need no permutation: HF's conversion script already permuted Meta's weights to
// the rotate_half RoPE that Tessera computes. Embedding and LM-head rows beyond vocab_size
// (ModelConfig::padded_vocab_size) are dropped on the way out and are zero on the way in.
//
// Config. Keys that change the computation are mapped, or refused with an error naming the
// key when Tessera cannot compute what they ask (LLaMA 3.1's rope_scaling, biases in
// LLaMA's projections, another activation). Keys with no effect on the weights or the
// forward pass (dropout, token ids, generation settings) are ignored; any other key is
// returned in HfConfig::unknown_keys for the caller to report.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "models/model.h"

namespace tessera {

struct HfConfig {
  ModelConfig cfg;
  std::vector<std::string> unknown_keys;  // neither mapped nor known to be harmless
};

// config.json -> ModelConfig (name "hf-<model_type>"). Errors name the key, its value and
// what Tessera accepts.
Result<HfConfig> model_config_from_hf(const nlohmann::json& config);
// ModelConfig -> config.json as save_pretrained writes it for that architecture.
Result<nlohmann::json> model_config_to_hf(const ModelConfig& cfg);

enum class HfLayout {
  same,            // identical (vocabulary tensors: rows beyond vocab_size dropped / zero)
  transposed,      // GPT-2 Conv1D: HF [in, out] = Tessera [out, in]^T
  gpt_qkv_weight,  // transposed, then rows reordered (q|k|v, head, d) -> (head, q|k|v, d)
  gpt_qkv_bias,    // reordered as the rows above
};

struct HfTensor {
  std::string name;     // Tessera's parameter name
  std::string hf_name;  // the key save_pretrained writes
  HfLayout layout = HfLayout::same;
  std::vector<int64_t> shape;     // Tessera's shape
  std::vector<int64_t> hf_shape;  // in the HF file
  // >= 0: the HF tensor is expert `expert`'s slice [expert] of the Tessera tensor (its experts
  // [E, ...] stacked; Mixtral's experts.N.w1/w2/w3), hf_shape the slice's shape; the layout
  // functions below take and give the slice.
  int64_t expert = -1;
};

// Every parameter of build_model(cfg), in the graph's order, with its HF key and layout (an
// expert-stacked parameter: one entry per expert, in expert order).
std::vector<HfTensor> hf_tensors(const ModelConfig& cfg);

// Keys a reader also accepts for `hf_name` (GPT-2 files saved from GPT2Model lack the
// "transformer." prefix).
std::vector<std::string> hf_name_aliases(const std::string& hf_name);

// Tensors in HF files that hold no parameter and are skipped on import: GPT-2's causal-mask
// buffers ("h.N.attn.bias", "h.N.attn.masked_bias"), LLaMA's "rotary_emb.inv_freq", T5's
// encoder/decoder.embed_tokens.weight (copies of shared.weight), and the
// LM head of a tied model (HF writes it in some versions; it equals the embedding).
bool hf_tensor_is_skipped(const ModelConfig& cfg, const std::string& hf_name);

// The data of `t` converted between layouts; `data` has the source side's shape (hf_shape
// for hf_to_tessera, shape for tessera_to_hf) in row-major order.
std::vector<float> hf_to_tessera(const ModelConfig& cfg, const HfTensor& t, const float* data);
std::vector<float> tessera_to_hf(const ModelConfig& cfg, const HfTensor& t, const float* data);

}  // namespace tessera
