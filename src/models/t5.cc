// T5 (Raffel et al. 2020), the layout of the public checkpoints: a shared token embedding; an
// encoder of pre-norm blocks (bidirectional self-attention, feed-forward) and a decoder of
// pre-norm blocks (causal self-attention, cross-attention to the encoder's output,
// feed-forward); T5's scale-only norms and no biases; attention unscaled, its scores biased by
// a learned [buckets, heads] table looked up at each (query, key)'s relative position bucket
// (one table for the encoder, one for the decoder, shared by their blocks); the head tied to
// the embedding (scaled by n_embd^-0.5) or untied (v1.1).
//
// Parameters are named like Hugging Face's (shared.weight, encoder.block.N.attn.q.weight, ...)
// with the bias tables outside the blocks (encoder.relative_attention_bias.weight). The
// encoder's blocks are layers 0..L-1 (its final norm in layer L-1), the decoder's L..2L-1;
// both embeddings and bias lookups come before them.
#include <cmath>

#include "ir/builder.h"
#include "models/blocks.h"

namespace tessera {

SpanCorruption span_corruption(int64_t raw) {
  SpanCorruption s;
  s.raw = raw;
  // np.round in the reference: halves to even, as nearbyint in the default rounding mode.
  s.noise = static_cast<int64_t>(std::nearbyint(0.15 * static_cast<double>(raw)));
  s.noise = std::min(std::max<int64_t>(s.noise, 1), raw - 1);
  const int64_t kept = raw - s.noise;
  s.spans = static_cast<int64_t>(std::nearbyint(static_cast<double>(std::min(s.noise, kept)) / 3));
  s.spans = std::max<int64_t>(s.spans, 1);
  return s;
}

namespace {

struct T5Builder {
  Builder& b;
  const ModelConfig& c;
  int64_t C, H, D, F;

  double fan_in_std(int64_t fan_in) const {
    return c.init_std / std::sqrt(static_cast<double>(fan_in));
  }
  Var norm(const char* name, Var x) {
    auto s = b.scope(name);
    return b.rmsnorm(x, b.parameter("weight", Shape{C}, Init::ones), c.norm_eps)[0];
  }
  Var linear(const char* name, Var x, int64_t out, int64_t in, double std) {
    auto s = b.scope(name);
    return b.linear(x, b.parameter("weight", Shape{out, in}, Init::normal, std));
  }
  // The score bias [H, Tq, Tk] of a relative position table [buckets, H].
  Var position_bias(const char* name, int64_t tq, int64_t tk, bool bidirectional) {
    auto s = b.scope(name);
    Var table = b.parameter("weight", Shape{c.relative_buckets, H}, Init::normal, fan_in_std(C));
    Var buckets =
        b.position_buckets(tq, tk, bidirectional, c.relative_buckets, c.relative_max_distance);
    return b.transpose(b.embedding(table, buckets), {2, 0, 1});
  }
  // Attention of x [B,Tq,C] to kv [B,Tk,C] (x itself for self-attention).
  Var attention(const char* name, Var x, Var kv, bool causal, Var bias) {
    auto s = b.scope(name);
    const int64_t B = x.shape()[0], Tq = x.shape()[1], Tk = kv.shape()[1];
    auto heads = [&](const char* proj, Var in, int64_t T, double std) {
      Var p = b.reshape(linear(proj, in, H * D, C, std), Shape{B, T, H, D});
      return b.transpose(p, {0, 2, 1, 3});
    };
    Var q = heads("q", x, Tq, fan_in_std(C * D));
    Var k = heads("k", kv, Tk, fan_in_std(C));
    Var v = heads("v", kv, Tk, fan_in_std(C));
    // Unscaled: T5 folds 1/sqrt(D) into q's initialization.
    Var att = b.attention(q, k, v, 1.0, causal, bias)[0];
    return linear("o", merge_heads(b, att), C, H * D, fan_in_std(H * D));
  }
  Var feed_forward(Var x) {
    auto s = b.scope("mlp");
    Var h;
    if (c.ffn_activation == "gated-gelu") {
      Var gate = b.gelu(linear("wi_0", x, F, C, fan_in_std(C)));  // before wi_1: graph order
      h = gate * linear("wi_1", x, F, C, fan_in_std(C));
    } else {
      h = b.relu(linear("wi", x, F, C, fan_in_std(C)));
    }
    return linear("wo", h, C, F, fan_in_std(F));
  }
};

}  // namespace

ModelGraph build_t5(const ModelConfig& c, int64_t batch, int64_t seq, ModelMode mode,
                    bool keep_logits) {
  const SpanCorruption sc = span_corruption(seq);
  const int64_t Te = sc.encoder_len(), Td = sc.decoder_len(), L = c.n_layer;
  ModelGraph m;
  m.batch = batch;
  m.seq = seq;
  m.classes = c.vocab_size;
  Builder b(&m.graph);
  T5Builder t{b, c, c.n_embd, c.n_head, c.head_dim(), c.ffn()};
  Var tokens = b.input(kTokensInput, Shape{batch, Te}, DType::i32);
  Var dec_tokens = b.input(kDecoderTokensInput, Shape{batch, Td}, DType::i32);
  m.inputs.push_back({kTokensInput, tokens.id, false});
  m.inputs.push_back({kDecoderTokensInput, dec_tokens.id, false});
  Var shared = b.parameter("shared.weight", Shape{c.vocab_rows(), t.C}, Init::normal, c.init_std);
  Var x = b.embedding(shared, tokens), y = b.embedding(shared, dec_tokens);
  Var enc_bias, dec_bias;
  {
    auto s = b.scope("encoder");
    enc_bias = t.position_bias("relative_attention_bias", Te, Te, /*bidirectional=*/true);
  }
  {
    auto s = b.scope("decoder");
    dec_bias = t.position_bias("relative_attention_bias", Td, Td, /*bidirectional=*/false);
  }
  for (int64_t l = 0; l < L; ++l) {
    b.set_layer(static_cast<int>(l));
    auto s = b.scope("encoder.block." + std::to_string(l));
    Var h = t.norm("attn_norm", x);
    x = x + t.attention("attn", h, h, /*causal=*/false, enc_bias);
    x = x + t.feed_forward(t.norm("mlp_norm", x));
  }
  {
    auto s = b.scope("encoder");
    x = t.norm("final_norm", x);  // in the last encoder layer
  }
  for (int64_t l = 0; l < L; ++l) {
    b.set_layer(static_cast<int>(L + l));
    auto s = b.scope("decoder.block." + std::to_string(l));
    Var h = t.norm("attn_norm", y);
    y = y + t.attention("attn", h, h, /*causal=*/true, dec_bias);
    y = y + t.attention("cross", t.norm("cross_norm", y), x, /*causal=*/false, {});
    y = y + t.feed_forward(t.norm("mlp_norm", y));
  }
  b.set_layer(-1);
  {
    auto s = b.scope("decoder");
    y = t.norm("final_norm", y);
  }
  Var logits;
  {
    auto s = b.scope("lm_head");
    Var head = shared;
    if (c.tied_embeddings) {
      y = b.scale(y, 1.0 / std::sqrt(static_cast<double>(t.C)));
    } else {
      head = b.parameter("weight", Shape{c.vocab_rows(), t.C}, Init::normal, c.init_std);
    }
    logits = b.matmul(b.reshape(y, Shape{batch * Td, t.C}), head, false, true);  // [B*Td, V]
  }
  finish_model(b, &m, logits, kTargetsInput, Shape{batch, Td}, mode, keep_logits);
  return m;
}

}  // namespace tessera
