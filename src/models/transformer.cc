// GPT and LLaMA-style decoder-only transformers, written once with the builder.
#include <cmath>

#include "base/check.h"
#include "ir/autodiff.h"
#include "ir/builder.h"
#include "models/blocks.h"
#include "models/model.h"

namespace tessera {

// [B,H,T,D] -> [B,T,H*D]
Var merge_heads(Builder& b, Var x) {
  const Shape& s = x.shape();
  return b.reshape(b.transpose(x, {0, 2, 1, 3}), Shape{s[0], s[2], s[1] * s[3]});
}

int64_t gpt_qkv_row_from_standard(int64_t row, int64_t n_head, int64_t head_dim) {
  const int64_t c = n_head * head_dim;
  const int64_t which = row / c, head = (row % c) / head_dim, d = row % head_dim;
  return (head * 3 + which) * head_dim + d;
}

std::vector<float> gpt_qkv_from_standard(const float* standard, int64_t cols, int64_t n_head,
                                         int64_t head_dim) {
  const int64_t rows = 3 * n_head * head_dim;
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    std::copy(standard + r * cols, standard + (r + 1) * cols,
              out.begin() + gpt_qkv_row_from_standard(r, n_head, head_dim) * cols);
  return out;
}

Var gpt_block(Builder& b, const ModelConfig& c, Var x, bool causal) {
  const int64_t C = c.n_embd, H = c.n_head, D = c.head_dim(), F = c.ffn();
  const double proj_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  auto norm = [&](const char* name, Var in) {
    auto s = b.scope(name);
    Var w = b.parameter("weight", Shape{C}, Init::ones);
    Var bias = b.parameter("bias", Shape{C}, Init::zeros);
    return b.layernorm(in, w, bias, c.norm_eps)[0];
  };
  auto linear = [&](const char* name, Var in, int64_t out, int64_t inp, double std) {
    auto s = b.scope(name);
    Var w = b.parameter("weight", Shape{out, inp}, Init::normal, std);
    Var bias = b.parameter("bias", Shape{out}, Init::zeros);
    return b.linear(in, w, bias);
  };
  {
    Var h = norm("ln_1", x);
    auto s = b.scope("attn");
    // [B,T,3C] with columns per head (head, q|k|v, D): a split of the 3C columns over a
    // tensor axis gives each rank whole heads (see gpt_qkv_row_from_standard).
    const Shape& xs = x.shape();
    Var heads = b.reshape(linear("qkv", h, 3 * C, C, c.init_std), Shape{xs[0], xs[1], H, 3, D});
    auto pick = [&](int64_t i) {  // [B,T,H,1,D] -> [B,H,T,D]
      Var one = b.reshape(b.slice(heads, 3, i, i + 1), Shape{xs[0], xs[1], H, D});
      return b.transpose(one, {0, 2, 1, 3});
    };
    Var q = pick(0), k = pick(1), v = pick(2);
    Var att = b.attention(q, k, v, 1.0 / std::sqrt(static_cast<double>(D)), causal)[0];
    x = x + linear("proj", merge_heads(b, att), C, C, proj_std);
  }
  Var h = norm("ln_2", x);
  auto s = b.scope("mlp");
  Var a = b.gelu(linear("fc", h, F, C, c.init_std));
  return x + linear("proj", a, C, F, proj_std);
}

namespace {

// LLaMA block: x + attn(rmsnorm(x)), then x + swiglu-mlp(rmsnorm(x)) (or a mixture of
// SwiGLU experts, whose load-balancing loss and kept routes are added to *moe).
Var llama_block(Builder& b, const ModelConfig& c, Var x, MoeOutputs* moe) {
  const int64_t C = c.n_embd, H = c.n_head, Hkv = c.kv_heads(), D = c.head_dim(), F = c.ffn();
  const Shape& xs = x.shape();
  const double proj_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  auto norm = [&](const char* name, Var in) {
    auto s = b.scope(name);
    Var w = b.parameter("weight", Shape{C}, Init::ones);
    return b.rmsnorm(in, w, c.norm_eps)[0];
  };
  auto linear = [&](const char* name, Var in, int64_t out, int64_t inp, double std) {
    auto s = b.scope(name);
    return b.linear(in, b.parameter("weight", Shape{out, inp}, Init::normal, std));
  };
  {
    Var h = norm("attn_norm", x);
    auto s = b.scope("attn");
    Var q = b.reshape(linear("q", h, H * D, C, c.init_std), Shape{xs[0], xs[1], H, D});
    Var k = b.reshape(linear("k", h, Hkv * D, C, c.init_std), Shape{xs[0], xs[1], Hkv, D});
    Var v = b.reshape(linear("v", h, Hkv * D, C, c.init_std), Shape{xs[0], xs[1], Hkv, D});
    q = b.transpose(b.rope(q, c.rope_theta), {0, 2, 1, 3});
    k = b.transpose(b.rope(k, c.rope_theta), {0, 2, 1, 3});
    v = b.transpose(v, {0, 2, 1, 3});
    Var att = b.attention(q, k, v, 1.0 / std::sqrt(static_cast<double>(D)))[0];
    x = x + linear("o", merge_heads(b, att), C, H * D, proj_std);
  }
  Var h = norm("mlp_norm", x);
  if (c.is_moe()) {
    auto s = b.scope("moe");
    MoeOutputs o = moe_mlp(b, c, h);
    moe->aux = moe->aux.valid() ? moe->aux + o.aux : o.aux;
    moe->kept = moe->kept.valid() ? moe->kept + o.kept : o.kept;
    return x + o.y;
  }
  auto s = b.scope("mlp");
  Var gate = linear("gate", h, F, C, c.init_std);
  Var up = linear("up", h, F, C, c.init_std);
  return x + linear("down", b.swiglu(gate, up), C, F, proj_std);
}

}  // namespace

ModelTask task_of(const ModelConfig& c) {
  if (c.family == "vit") return ModelTask::image_classes;
  if (c.family == "t5") return ModelTask::span_corruption;
  return ModelTask::language_model;
}

int64_t num_blocks(const ModelConfig& c) {
  return task_of(c) == ModelTask::span_corruption ? 2 * c.n_layer : c.n_layer;
}

int64_t tokens_per_example(const ModelConfig& c, int64_t seq) {
  if (task_of(c) == ModelTask::image_classes) return c.image_tokens();
  if (task_of(c) == ModelTask::span_corruption) return span_corruption(seq).encoder_len();
  return seq;
}

ModelGraph build_model(const ModelConfig& c, int64_t batch, int64_t seq, ModelMode mode,
                       bool keep_logits) {
  TS_CHECK(validate(c).ok()) << validate(c).to_string();
  if (c.family == "vit") return build_vit(c, batch, mode, keep_logits);
  TS_CHECK_LE(seq, c.max_seq_len);
  if (c.family == "t5") return build_t5(c, batch, seq, mode, keep_logits);
  ModelGraph m;
  m.batch = batch;
  m.seq = seq;
  m.classes = c.vocab_size;
  Builder b(&m.graph);
  b.set_param_dtype(c.dtype);
  const int64_t C = c.n_embd, V = c.vocab_rows();
  Var tokens = b.input(kTokensInput, Shape{batch, seq}, DType::i32);
  m.inputs.push_back({kTokensInput, tokens.id, false});
  Var emb, x;
  if (c.family == "gpt") {
    emb = b.parameter("wte", Shape{V, C}, Init::normal, c.init_std);
    Var wpe = b.parameter("wpe", Shape{c.max_seq_len, C}, Init::normal, c.init_std);
    x = b.embedding(emb, tokens) + b.slice(wpe, 0, 0, seq);
  } else {
    emb = b.parameter("tok_emb", Shape{V, C}, Init::normal, c.init_std);
    x = b.embedding(emb, tokens);
  }
  MoeOutputs moe;  // aux and kept summed over the blocks
  for (int64_t l = 0; l < c.n_layer; ++l) {
    b.set_layer(static_cast<int>(l));
    auto s = b.scope("h." + std::to_string(l));
    x = c.family == "gpt" ? gpt_block(b, c, x, /*causal=*/true) : llama_block(b, c, x, &moe);
  }
  b.set_layer(-1);
  Var aux_loss;
  if (c.is_moe() && mode != ModelMode::logits) {
    auto s = b.scope("moe_balance");
    aux_loss = b.scale(moe.aux, c.router_aux_loss_coef / static_cast<double>(c.n_layer));
    m.graph.add_metric(kMoeKeptMetric, moe.kept.id);
    m.moe_routes = batch * seq * c.experts_per_token * c.n_layer;
  }
  Var head;
  if (c.family == "gpt") {
    auto s = b.scope("ln_f");
    Var w = b.parameter("weight", Shape{C}, Init::ones);
    Var bias = b.parameter("bias", Shape{C}, Init::zeros);
    x = b.layernorm(x, w, bias, c.norm_eps)[0];
  } else {
    auto s = b.scope("norm");
    x = b.rmsnorm(x, b.parameter("weight", Shape{C}, Init::ones), c.norm_eps)[0];
  }
  head = c.tied_embeddings ? emb
                           : b.parameter("lm_head.weight", Shape{V, C}, Init::normal, c.init_std);
  Var logits;
  {
    auto s = b.scope("lm_head");
    logits = b.matmul(x, head, false, true);  // [B, T, V]
  }
  finish_model(b, &m, logits, kTargetsInput, Shape{batch, seq}, mode, keep_logits, aux_loss);
  return m;
}

void finish_model(Builder& b, ModelGraph* m, Var logits, const char* targets_name,
                  const Shape& targets_shape, ModelMode mode, bool keep_logits, Var extra_loss) {
  m->logits = logits.id;
  if (mode == ModelMode::logits || keep_logits) m->graph.mark_output(logits.id);
  if (mode == ModelMode::logits) return;
  Var targets = b.input(targets_name, targets_shape, DType::i32);
  m->inputs.push_back({targets_name, targets.id, true});
  Var loss;
  {
    auto s = b.scope("loss");
    // The targets shaped as the logits' rows (every dim but the classes).
    std::vector<int64_t> rows = logits.shape().dims();
    rows.pop_back();
    Var t = targets.shape() == Shape(rows) ? targets : b.reshape(targets, Shape(rows));
    loss = b.cross_entropy(logits, t, m->classes)[0];
    if (extra_loss.valid()) loss = loss + b.cast(extra_loss, loss.dtype());
  }
  m->loss = loss.id;
  if (mode == ModelMode::loss) {
    m->graph.set_loss(loss.id);
  } else {
    append_backward(b, loss);
  }
}

}  // namespace tessera
