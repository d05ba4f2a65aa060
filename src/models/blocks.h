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

// The model's tail from its logits [N, vocab_rows]: marks them an output in logits mode (or
// with keep_logits); in the loss and train modes adds the i32 targets input (shaped
// targets_shape, N elements), the mean cross-entropy over the first m->classes columns as the
// loss, and in train mode the backward pass.
void finish_model(Builder& b, ModelGraph* m, Var logits, const char* targets_name,
                  const Shape& targets_shape, ModelMode mode, bool keep_logits);

// build_model for family "vit".
ModelGraph build_vit(const ModelConfig& c, int64_t batch, ModelMode mode, bool keep_logits);

// build_model for family "t5".
ModelGraph build_t5(const ModelConfig& c, int64_t batch, int64_t seq, ModelMode mode,
                    bool keep_logits);

}  // namespace tessera
