// Pieces the model families share (internal to src/models).
#pragma once

#include "ir/builder.h"
#include "models/model.h"

namespace tessera {

// [B,H,T,D] attention output -> [B,T,H*D], the heads side by side.
Var merge_heads(Builder& b, Var x);

// GPT-2's pre-norm block: x + attn(ln_1(x)), then x + mlp(ln_2(x)), on x [B, T, C]; the
// attention causal (decoders) or bidirectional (ViT's encoder).
Var gpt_block(Builder& b, const ModelConfig& c, Var x, bool causal);

// A mixture-of-experts MLP on x [B, T, C] (ModelConfig::n_experts > 0): its output y [B, T, C],
// the block's load-balancing loss aux (f32 []) and the routes that found a slot, kept (f32 []).
struct MoeOutputs {
  Var y, aux, kept;
};
MoeOutputs moe_mlp(Builder& b, const ModelConfig& c, Var x);

// The model's tail from its logits [N, vocab_rows]: marks them an output in logits mode (or
// with keep_logits); in the loss and train modes adds the i32 targets input (shaped
// targets_shape, N elements), the mean cross-entropy over the first m->classes columns (plus
// `extra_loss` when valid, a scalar) as the loss, and in train mode the backward pass.
void finish_model(Builder& b, ModelGraph* m, Var logits, const char* targets_name,
                  const Shape& targets_shape, ModelMode mode, bool keep_logits,
                  Var extra_loss = Var{});

// build_model for family "vit".
ModelGraph build_vit(const ModelConfig& c, int64_t batch, ModelMode mode, bool keep_logits);

// build_model for family "t5".
ModelGraph build_t5(const ModelConfig& c, int64_t batch, int64_t seq, ModelMode mode,
                    bool keep_logits);

}  // namespace tessera
