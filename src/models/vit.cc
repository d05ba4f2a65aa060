// ViT (Dosovitskiy et al. 2021), the layout of the public ImageNet-1k checkpoints: images cut
// into P x P patches, each projected to the width (a linear map of its C*P*P values: the
// strided convolution), a learned class token before them, learned positions, GPT's pre-norm
// blocks with bidirectional attention, a final LayerNorm and a classifier head on the class
// token.
#include "ir/builder.h"
#include "models/blocks.h"

namespace tessera {

ModelGraph build_vit(const ModelConfig& c, int64_t batch, ModelMode mode, bool keep_logits) {
  const int64_t C = c.n_embd, ch = c.channels, P = c.patch_size, side = c.image_size / P;
  const int64_t N = c.patches(), K = ch * P * P, T = c.image_tokens();
  ModelGraph m;
  m.batch = batch;
  m.seq = T;
  m.classes = c.vocab_size;
  Builder b(&m.graph);
  Var images = b.input(kImagesInput, Shape{batch, ch, c.image_size, c.image_size});
  m.inputs.push_back({kImagesInput, images.id, false});
  // [B, ch, side*P, side*P] -> [B, side, side, ch, P, P] -> [B, N, ch*P*P]: patch n = (row,
  // col) in raster order, its values in the convolution weight's (ch, P, P) order.
  Var patches = b.reshape(
      b.transpose(b.reshape(images, Shape{batch, ch, side, P, side, P}), {0, 2, 4, 1, 3, 5}),
      Shape{batch, N, K});
  Var x;
  {
    auto s = b.scope("patch_embed");
    Var w = b.parameter("weight", Shape{C, K}, Init::normal, c.init_std);
    Var bias = b.parameter("bias", Shape{1, C}, Init::zeros);
    Var cls = b.parameter("cls_token", Shape{1, C}, Init::normal, c.init_std);
    Var pos = b.parameter("pos_embed", Shape{T, C}, Init::normal, c.init_std);
    // Row 0 is the class token: a zero patch (no weight) whose addend is cls_token instead of
    // the bias. The zero row is a fill, which takes the batch split of the patches, so data
    // parallelism keeps every activation's rows split (a replicated class token concatenated
    // to split patches would gather them).
    Var rows = b.concat({b.fill(Shape{batch, 1, K}, 0.0), patches}, 1);
    Var addend = pos + b.concat({cls, b.broadcast_to(bias, Shape{N, C})}, 0);
    x = b.matmul(rows, w, false, true) + addend;  // [B, T, C]
  }
  for (int64_t l = 0; l < c.n_layer; ++l) {
    b.set_layer(static_cast<int>(l));
    auto s = b.scope("h." + std::to_string(l));
    x = gpt_block(b, c, x, /*causal=*/false);
  }
  b.set_layer(-1);
  {
    auto s = b.scope("norm");
    Var w = b.parameter("weight", Shape{C}, Init::ones);
    Var bias = b.parameter("bias", Shape{C}, Init::zeros);
    x = b.layernorm(x, w, bias, c.norm_eps)[0];
  }
  Var logits;
  {
    auto s = b.scope("head");
    Var cls_out = b.reshape(b.slice(x, 1, 0, 1), Shape{batch, C});
    Var w = b.parameter("weight", Shape{c.vocab_size, C}, Init::normal, c.init_std);
    Var bias = b.parameter("bias", Shape{c.vocab_size}, Init::zeros);
    logits = b.linear(cls_out, w, bias);  // [B, classes]
  }
  finish_model(b, &m, logits, kLabelsInput, Shape{batch}, mode, keep_logits);
  return m;
}

}  // namespace tessera
