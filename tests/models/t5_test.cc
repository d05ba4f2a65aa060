// T5: parameter counts of the public checkpoints, the graph's inputs, span corruption's lengths,
// validation, and the logits of a tiny T5 against a plain-loop reference written here from the
// architecture's definition (both feed-forward kinds, tied and untied heads, a head width
// that is not n_embd / n_head).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "ir/position_buckets.h"
#include "models/model.h"
#include "preset_util.h"
#include "runtime/executor.h"

namespace tessera {
namespace {

// Hugging Face's T5ForConditionalGeneration: t5-small ... t5-11b, and google/t5-v1_1-small
// (gated GELU, untied head, 8 layers, 6 heads of 64 on a width of 512).
TEST(T5, ExactParameterCountsOfThePublicCheckpoints) {
  EXPECT_EQ(build_model(preset("t5-small"), 1, 8, ModelMode::logits).graph.param_count(), 60506624);
  EXPECT_EQ(build_model(preset("t5-base"), 1, 8, ModelMode::logits).graph.param_count(), 222903552);
  EXPECT_EQ(count_params(preset("t5-large")), 737668096);
  EXPECT_EQ(count_params(preset("t5-3b")), 2851598336);
  EXPECT_EQ(count_params(preset("t5-11b")), 11307321344);
  ModelConfig v11 = family_defaults("t5");
  v11.n_layer = 8;
  v11.n_embd = 512;
  v11.n_head = 6;
  v11.head_size = 64;
  v11.ffn_hidden = 1024;
  v11.vocab_size = 32128;
  v11.ffn_activation = "gated-gelu";
  v11.tied_embeddings = false;
  ASSERT_TRUE(validate(v11).ok()) << validate(v11).to_string();
  EXPECT_EQ(build_model(v11, 1, 8, ModelMode::logits).graph.param_count(), 76961152);
}

// T5's standard pre-training shape: 568 tokens of text give 512 encoder inputs and 114
// targets, each with an EOS that Tessera does not append.
TEST(T5, SpanCorruptionLengthsAreT5s) {
  SpanCorruption s = span_corruption(568);
  EXPECT_EQ(s.noise, 85);
  EXPECT_EQ(s.spans, 28);
  EXPECT_EQ(s.encoder_len(), 511);
  EXPECT_EQ(s.decoder_len(), 113);
  s = span_corruption(2);  // the least: one noise token, one span
  EXPECT_EQ(s.noise, 1);
  EXPECT_EQ(s.spans, 1);
  EXPECT_EQ(s.encoder_len(), 2);
  EXPECT_EQ(s.decoder_len(), 2);
}

TEST(T5, TakesTextAndDecoderTokensAndGivesTargetLogits) {
  ModelConfig c = preset("t5-tiny");
  EXPECT_EQ(task_of(c), ModelTask::span_corruption);
  ModelGraph m = build_model(c, 3, 64, ModelMode::train);
  ASSERT_EQ(m.inputs.size(), 3u);
  EXPECT_EQ(m.inputs[0].name, kTokensInput);
  EXPECT_EQ(m.graph.type(m.inputs[0].value).shape, (Shape{3, 57}));
  EXPECT_EQ(m.inputs[1].name, kDecoderTokensInput);
  EXPECT_EQ(m.graph.type(m.inputs[1].value).shape, (Shape{3, 13}));
  EXPECT_FALSE(m.inputs[1].target);
  EXPECT_EQ(m.inputs[2].name, kTargetsInput);
  EXPECT_TRUE(m.inputs[2].target);
  EXPECT_EQ(m.graph.type(m.logits).shape, (Shape{3 * 13, 50257 + kT5ExtraTokens}));
  EXPECT_EQ(m.graph.param_grads().size(), m.graph.params().size());
}

TEST(T5, ValidateNamesTheT5Keys) {
  auto message = [](const ModelConfig& c) { return validate(c).to_string(); };
  ModelConfig c = preset("t5-tiny");
  ASSERT_TRUE(validate(c).ok());
  ModelConfig act = c;
  act.ffn_activation = "swish";
  EXPECT_NE(message(act).find("ffn_activation"), std::string::npos) << message(act);
  ModelConfig buckets = c;
  buckets.relative_max_distance = 10;  // not over 32 / 2
  EXPECT_NE(message(buckets).find("relative_max_distance"), std::string::npos);
  ModelConfig gpt = preset("gpt-tiny");
  gpt.head_size = 32;
  EXPECT_NE(message(gpt).find("\"t5\" only"), std::string::npos) << message(gpt);
  ModelConfig heads = c;
  heads.head_size = 0;
  heads.n_head = 5;  // does not divide 64 and no head_size
  EXPECT_NE(message(heads).find("n_head"), std::string::npos) << message(heads);
}

// ---- the reference ---------------------------------------------------------------------

using Vec = std::vector<double>;
using Rows = std::vector<Vec>;

struct Reference {
  const ModelConfig& c;
  Executor& ex;
  const Graph& g;

  Vec param(const std::string& name) {
    ValueId id = g.find_param(name);
    EXPECT_GE(id, 0) << name;
    const float* p = ex.data<float>(id);
    return Vec(p, p + g.type(id).shape.numel());
  }
  Rows norm(const Rows& x, const std::string& name) {
    Vec w = param(name + ".weight");
    Rows out = x;
    for (Vec& r : out) {
      double ms = 0;
      for (double v : r) ms += v * v / static_cast<double>(r.size());
      for (size_t i = 0; i < r.size(); ++i) r[i] *= w[i] / std::sqrt(ms + c.norm_eps);
    }
    return out;
  }
  Rows linear(const Rows& x, const std::string& name) {
    Vec w = param(name + ".weight");
    const size_t in = x[0].size(), out = w.size() / in;
    Rows y(x.size(), Vec(out, 0.0));
    for (size_t t = 0; t < x.size(); ++t)
      for (size_t o = 0; o < out; ++o)
        for (size_t i = 0; i < in; ++i) y[t][o] += w[o * in + i] * x[t][i];
    return y;
  }
  // Self- or cross-attention; table: the relative bias table's name, or "" for none.
  Rows attention(const Rows& x, const Rows& kv, const std::string& name, bool causal,
                 const std::string& table) {
    const int64_t H = c.n_head, D = c.head_dim(), nb = c.relative_buckets;
    Rows q = linear(x, name + ".q"), k = linear(kv, name + ".k"), v = linear(kv, name + ".v");
    Vec bias = table.empty() ? Vec() : param(table + ".weight");
    Rows out(x.size(), Vec(static_cast<size_t>(H * D), 0.0));
    for (int64_t h = 0; h < H; ++h)
      for (size_t i = 0; i < x.size(); ++i) {
        Vec s(kv.size(), -1e300);
        double mx = -1e300, sum = 0;
        for (size_t j = 0; j < kv.size() && (!causal || j <= i); ++j) {
          s[j] = 0;
          for (int64_t d = 0; d < D; ++d) s[j] += q[i][h * D + d] * k[j][h * D + d];
          if (!table.empty())
            s[j] += bias[t5_position_bucket(i, j, !causal, nb, c.relative_max_distance) * H + h];
          mx = std::max(mx, s[j]);
        }
        for (double& e : s) sum += (e = e == -1e300 ? 0 : std::exp(e - mx));
        for (size_t j = 0; j < kv.size(); ++j)
          for (int64_t d = 0; d < D; ++d) out[i][h * D + d] += s[j] / sum * v[j][h * D + d];
      }
    return linear(out, name + ".o");
  }
  Rows feed_forward(const Rows& x, const std::string& name) {
    Rows h;
    if (c.ffn_activation == "gated-gelu") {
      Rows a = linear(x, name + ".wi_0"), b = linear(x, name + ".wi_1");
      for (size_t t = 0; t < a.size(); ++t)
        for (size_t i = 0; i < a[t].size(); ++i) {
          double u = a[t][i];
          a[t][i] =
              0.5 * u * (1 + std::tanh(0.7978845608028654 * (u + 0.044715 * u * u * u))) * b[t][i];
        }
      h = a;
    } else {
      h = linear(x, name + ".wi");
      for (Vec& r : h)
        for (double& u : r) u = std::max(u, 0.0);
    }
    return linear(h, name + ".wo");
  }
  static void add(Rows* x, const Rows& y) {
    for (size_t t = 0; t < x->size(); ++t)
      for (size_t i = 0; i < y[t].size(); ++i) (*x)[t][i] += y[t][i];
  }
  // Logits [Td][V] of one example.
  Rows logits(const int32_t* enc, size_t te, const int32_t* dec, size_t td) {
    Vec shared = param("shared.weight");
    const size_t C = static_cast<size_t>(c.n_embd), V = static_cast<size_t>(c.vocab_size);
    auto embed = [&](const int32_t* ids, size_t n) {
      Rows r;
      for (size_t t = 0; t < n; ++t)
        r.emplace_back(shared.begin() + ids[t] * C, shared.begin() + (ids[t] + 1) * C);
      return r;
    };
    Rows x = embed(enc, te), y = embed(dec, td);
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string b = "encoder.block." + std::to_string(l);
      Rows h = norm(x, b + ".attn_norm");
      add(&x, attention(h, h, b + ".attn", false, "encoder.relative_attention_bias"));
      add(&x, feed_forward(norm(x, b + ".mlp_norm"), b + ".mlp"));
    }
    x = norm(x, "encoder.final_norm");
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string b = "decoder.block." + std::to_string(l);
      Rows h = norm(y, b + ".attn_norm");
      add(&y, attention(h, h, b + ".attn", true, "decoder.relative_attention_bias"));
      add(&y, attention(norm(y, b + ".cross_norm"), x, b + ".cross", false, ""));
      add(&y, feed_forward(norm(y, b + ".mlp_norm"), b + ".mlp"));
    }
    y = norm(y, "decoder.final_norm");
    Vec head = c.tied_embeddings ? shared : param("lm_head.weight");
    const double s = c.tied_embeddings ? 1 / std::sqrt(static_cast<double>(C)) : 1.0;
    Rows out(td, Vec(V, 0.0));
    for (size_t t = 0; t < td; ++t)
      for (size_t v = 0; v < V; ++v)
        for (size_t i = 0; i < C; ++i) out[t][v] += head[v * C + i] * y[t][i] * s;
    return out;
  }
};

void check_against_reference(const ModelConfig& c) {
  const int64_t B = 2, raw = 40;
  ModelGraph m = build_model(c, B, raw, ModelMode::logits);
  CpuBackend cpu;
  Executor ex(m.graph, cpu);
  ex.init_params(7);
  // Norm weights start at one: make them random too, so that a misplaced norm shows.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  for (ValueId p : m.graph.params())
    if (m.graph.name_of(p).find("norm") != std::string::npos)
      for (int64_t i = 0; i < m.graph.type(p).shape.numel(); ++i) ex.data<float>(p)[i] = u(rng);
  const SpanCorruption sc = span_corruption(raw);
  const size_t te = static_cast<size_t>(sc.encoder_len()),
               td = static_cast<size_t>(sc.decoder_len());
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size) - 1);
  std::vector<int32_t> enc(B * te), dec(B * td);
  for (int32_t& t : enc) t = tok(rng);
  for (int32_t& t : dec) t = tok(rng);
  ex.set_input(kTokensInput, enc.data());
  ex.set_input(kDecoderTokensInput, dec.data());
  ex.run();
  const float* got = ex.data<float>(m.logits);
  Reference ref{c, ex, m.graph};
  double worst = 0;
  for (int64_t b = 0; b < B; ++b) {
    Rows want = ref.logits(enc.data() + b * te, te, dec.data() + b * td, td);
    for (size_t t = 0; t < td; ++t)
      for (size_t v = 0; v < want[t].size(); ++v)
        worst = std::max(worst, std::abs(got[(b * td + t) * static_cast<size_t>(c.vocab_size) + v] -
                                         want[t][v]));
  }
  EXPECT_LT(worst, 1e-4) << c.ffn_activation;
}

ModelConfig tiny_reference_config() {
  ModelConfig c = family_defaults("t5");
  c.n_layer = 2;
  c.n_embd = 8;
  c.n_head = 2;
  c.head_size = 3;  // inner width 6, not 8
  c.ffn_hidden = 12;
  c.vocab_size = 30;
  c.relative_buckets = 8;
  c.relative_max_distance = 12;
  c.max_seq_len = 64;
  return c;
}

TEST(T5, LogitsMatchAPlainReference) {
  ModelConfig c = tiny_reference_config();
  ASSERT_TRUE(validate(c).ok()) << validate(c).to_string();
  check_against_reference(c);
}

TEST(T5, GatedGeluUntiedLogitsMatchAPlainReference) {
  ModelConfig c = tiny_reference_config();
  c.ffn_activation = "gated-gelu";
  c.tied_embeddings = false;
  ASSERT_TRUE(validate(c).ok()) << validate(c).to_string();
  check_against_reference(c);
}

}  // namespace
}  // namespace tessera
