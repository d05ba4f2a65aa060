// The single-device step against PyTorch: tools/make_golden.py writes a tiny GPT and a tiny
// LLaMA (parameters, inputs, logits, loss, every gradient, a 10-step AdamW trajectory with
// clipping); this test loads them into Tessera's models and compares.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>

#include "backend/cpu/cpu_backend.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "runtime/step_runner.h"

namespace tessera {
namespace {

struct Golden {
  SafetensorsFile file;
  ModelConfig cfg;
  int64_t batch = 0, seq = 0;
};

int64_t meta_int(const SafetensorsFile& f, const char* key) {
  return std::stoll(f.metadata().at(key));
}
double meta_float(const SafetensorsFile& f, const char* key) {
  return std::stod(f.metadata().at(key));
}

Golden load_golden(const std::string& name) {
  auto r = load_safetensors(std::string(TESSERA_SOURCE_DIR) + "/tests/golden/" + name);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  Golden g{std::move(r).value(), {}, 0, 0};
  const SafetensorsFile& f = g.file;
  ModelConfig& c = g.cfg;
  c.family = f.metadata().at("model") == "gpt" ? "gpt" : "llama";
  c.vocab_size = meta_int(f, "vocab_size");
  c.n_layer = meta_int(f, "n_layer");
  c.n_head = meta_int(f, "n_head");
  if (c.family == "gpt") {
    c.n_embd = meta_int(f, "n_embd");
    c.max_seq_len = meta_int(f, "block_size");
    c.norm_eps = meta_float(f, "ln_eps");
  } else {
    c.n_embd = meta_int(f, "dim");
    c.n_kv_head = meta_int(f, "n_kv_head");
    c.ffn_hidden = meta_int(f, "ffn_hidden");
    c.norm_eps = meta_float(f, "rms_eps");
    c.rope_theta = meta_float(f, "rope_theta");
    c.tied_embeddings = false;
    c.max_seq_len = meta_int(f, "seq_len");
  }
  g.batch = meta_int(f, "batch_size");
  g.seq = meta_int(f, "seq_len");
  return g;
}

// max |a - b| / (max |b| + tiny): a relative error over the whole tensor.
double rel_error(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / (den + 1e-30);
}

const float* raw_floats(const TensorData& t) {
  return reinterpret_cast<const float*>(t.bytes.data());
}

const int32_t* ints(const TensorData& t) {
  return reinterpret_cast<const int32_t*>(t.bytes.data());
}

// The reference's tensors in Tessera's order: PyTorch orders GPT's fused QKV rows (q|k|v,
// head, head_dim), Tessera per head (models/model.h). Reordered copies live as long as this.
struct InTesseraOrder {
  const ModelConfig& cfg;
  std::deque<std::vector<float>> kept;
  const float* operator()(const std::string& name, const TensorData& t) {
    if (cfg.family != "gpt" || name.find(".attn.qkv.") == std::string::npos) return raw_floats(t);
    kept.push_back(gpt_qkv_from_standard(raw_floats(t), t.numel() / t.shape[0], cfg.n_head,
                                         cfg.n_embd / cfg.n_head));
    return kept.back().data();
  }
};

void check_model(const std::string& file) {
  Golden gold = load_golden(file);
  const SafetensorsFile& f = gold.file;
  ASSERT_TRUE(validate(gold.cfg).ok()) << validate(gold.cfg).to_string();
  ModelGraph m = build_model(gold.cfg, gold.batch, gold.seq, ModelMode::train,
                             /*keep_logits=*/true);
  CpuBackend cpu;
  AdamWConfig opt;
  opt.lr = meta_float(f, "lr");
  opt.beta1 = meta_float(f, "beta1");
  opt.beta2 = meta_float(f, "beta2");
  opt.eps = meta_float(f, "adam_eps");
  opt.weight_decay = meta_float(f, "weight_decay");
  Plan plan = Plan::data_parallel(1);
  Result<MeshComms> comms = MeshComms::single(plan);
  ASSERT_TRUE(comms.ok()) << comms.status().to_string();
  auto made = StepRunner::create(m.graph, plan, cpu, comms.value(), opt);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  StepRunner& ts = *made.value();
  const Graph& g = m.graph;
  InTesseraOrder as_tessera{gold.cfg, {}};

  // Every golden parameter exists in the graph with the same shape, and vice versa.
  int golden_params = 0;
  for (const std::string& name : f.names())
    if (name.rfind("param.", 0) == 0) ++golden_params;
  ASSERT_EQ(golden_params, static_cast<int>(g.params().size()));
  for (size_t i = 0; i < g.params().size(); ++i) {
    const ValueId p = g.params()[i];
    const std::string& name = g.name_of(p);
    auto t = f.find("param." + name);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    ASSERT_EQ((*t)->shape, g.type(p).shape.dims()) << name;
    std::memcpy(ts.param_data(i), as_tessera(name, **t), (*t)->bytes.size());
  }
  const int32_t* tokens = ints(f.get("input.tokens"));
  const int32_t* targets = ints(f.get("input.targets"));

  float loss = ts.forward_backward(token_feed(tokens, targets)).value();
  float want = raw_floats(f.get("out.loss"))[0];
  EXPECT_NEAR(loss, want, 1e-5 * std::fabs(want)) << "loss";
  const TensorData& logits = f.get("out.logits");
  const ValueId local_logits = ts.program().part.global_to_local[static_cast<size_t>(m.logits)];
  EXPECT_LT(rel_error(ts.executor().data<float>(local_logits), raw_floats(logits), logits.numel()),
            1e-5)
      << "logits";
  size_t i = 0;
  for (ValueId p : g.params()) {
    const TensorData& want_grad = f.get("grad." + g.name_of(p));
    EXPECT_LT(rel_error(ts.optimizer().params()[i++].grad, as_tessera(g.name_of(p), want_grad),
                        want_grad.numel()),
              1e-4)
        << "gradient of " << g.name_of(p);
  }

  // 10 AdamW steps with clipping on the same batch; the first loss was computed above.
  const TensorData& traj = f.get("traj.loss");
  double clip = meta_float(f, "grad_clip");
  for (int64_t step = 0; step < traj.numel(); ++step) {
    if (step > 0) loss = ts.forward_backward(token_feed(tokens, targets)).value();
    EXPECT_NEAR(loss, raw_floats(traj)[step], 1e-5 * std::fabs(raw_floats(traj)[step]))
        << "step " << step;
    ASSERT_TRUE(ts.apply(opt.lr, clip).ok());
  }
  for (size_t k = 0; k < g.params().size(); ++k) {
    const ValueId p = g.params()[k];
    const TensorData& want_p = f.get("traj.param." + g.name_of(p));
    EXPECT_LT(rel_error(ts.param_data(k), as_tessera(g.name_of(p), want_p), want_p.numel()), 1e-4)
        << "parameter after 10 steps: " << g.name_of(p);
  }
}

TEST(Golden, TinyGptMatchesPyTorch) { check_model("gpt_tiny.safetensors"); }
TEST(Golden, TinyLlamaMatchesPyTorch) { check_model("llama_tiny.safetensors"); }

}  // namespace
}  // namespace tessera
