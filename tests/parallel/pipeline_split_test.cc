// Pipeline chunks (parallel/pipeline_split.h): running the chunks' forwards in order, then
// their backwards in reverse, each as its own forward and backward graph (split_phases), gives
// the whole model's loss and gradients (GPT, LLaMA, and T5, whose encoder output crosses
// several cuts).
#include "parallel/pipeline_split.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "models/model.h"
#include "runtime/executor.h"

namespace tessera {
namespace {

ModelConfig small(const char* preset, int layers) {
  ModelConfig c = *find_preset(preset);
  c.n_layer = layers;
  c.vocab_size = 96;
  return c;
}

std::vector<int32_t> ids(int64_t n, int salt) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + salt) % 96);
  return v;
}

std::vector<float> copy_of(Executor& ex, ValueId v) {
  const float* p = ex.data<float>(v);
  return std::vector<float>(p, p + ex.graph().type(v).shape.numel());
}

struct Chunk {
  ChunkGraph cg;
  Phases ph;  // forward, backward
  std::unique_ptr<Executor> fwd, bwd;
};

void expect_pipeline_matches(const ModelConfig& cfg, const std::vector<int>& per_chunk) {
  SCOPED_TRACE(cfg.family + " " + ::testing::PrintToString(per_chunk));
  const int64_t B = 2, T = 8;
  ModelGraph m = build_model(cfg, B, T, ModelMode::train);
  // Every input of the model (T5 has three), by name.
  std::map<std::string, std::vector<int32_t>> feed;
  int salt = 1;
  for (const ModelInput& in : m.inputs)
    feed[in.name] = ids(m.graph.type(in.value).shape.numel(), salt += 4);
  CpuBackend cpu;
  Executor whole(m.graph, cpu);
  whole.init_params(3);
  for (const auto& [name, v] : feed) whole.set_input(name, v.data());
  whole.run();

  Result<std::vector<ChunkGraph>> split = split_pipeline(m.graph, per_chunk);
  ASSERT_TRUE(split.ok()) << split.status().to_string();
  std::vector<Chunk> chunks(split.value().size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    Chunk& k = chunks[c];
    k.cg = std::move(split.value()[c]);
    Result<Phases> ph = split_phases(k.cg.graph, forward_backward_phases(k.cg.graph), 2);
    ASSERT_TRUE(ph.ok()) << ph.status().to_string();
    k.ph = std::move(ph.value());
    k.fwd = std::make_unique<Executor>(k.ph.graphs[0], cpu);
    k.bwd = std::make_unique<Executor>(k.ph.graphs[1], cpu, *k.fwd);
    for (ValueId p : k.ph.graphs[0].params()) {  // the whole model's values, by name
      const ValueId wp = m.graph.find_param(k.ph.graphs[0].name_of(p));
      std::memcpy(k.fwd->raw(p), whole.raw(wp), static_cast<size_t>(m.graph.type(wp).bytes()));
    }
  }
  // Forwards in order: each chunk reads the previous one's sends.
  for (size_t c = 0; c < chunks.size(); ++c) {
    Chunk& k = chunks[c];
    const Graph& f = k.ph.graphs[0];
    for (const auto& [name, v] : feed)
      if (f.find_input(name) >= 0) k.fwd->set_input(name, v.data());
    for (size_t i = 0; i < k.cg.recv.size(); ++i) {
      const Chunk& prev = chunks[c - 1];
      ValueId sent = prev.ph.value_of[0][static_cast<size_t>(prev.cg.send[i])];
      k.fwd->set_input(pipe_act_name(static_cast<int>(c), static_cast<int>(i)),
                       prev.fwd->raw(sent));
    }
    k.fwd->run();
  }
  const Chunk& last = chunks.back();
  const float loss = *last.fwd->data<float>(last.ph.graphs[0].loss());
  EXPECT_NEAR(loss, *whole.data<float>(m.loss), 1e-6 * std::fabs(loss));
  // Backwards in reverse: each chunk reads its stash and the next one's input gradients.
  std::map<std::string, std::vector<float>> grads;
  for (size_t c = chunks.size(); c-- > 0;) {
    Chunk& k = chunks[c];
    for (const Phases::Stash& s : k.ph.stash)
      k.bwd->set_input(k.ph.graphs[1].name_of(s.in), k.fwd->raw(s.out));
    for (size_t i = 0; i < k.cg.send.size(); ++i) {
      const Chunk& next = chunks[c + 1];
      ValueId g = next.ph.value_of[1][static_cast<size_t>(next.cg.recv_grads[i])];
      k.bwd->set_input(pipe_grad_name(static_cast<int>(c + 1), static_cast<int>(i)),
                       next.bwd->raw(g));
    }
    k.bwd->run();
    for (auto [param, grad] : k.ph.graphs[1].param_grads()) {
      std::vector<float> g = copy_of(*k.bwd, grad);
      std::vector<float>& sum = grads[k.ph.graphs[1].name_of(param)];
      if (sum.empty()) sum.assign(g.size(), 0.f);
      for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
    }
  }
  ASSERT_EQ(grads.size(), m.graph.params().size());
  for (auto [param, grad] : m.graph.param_grads()) {
    const std::string& name = m.graph.name_of(param);
    std::vector<float> want = copy_of(whole, grad);
    const std::vector<float>& got = grads[name];
    ASSERT_EQ(got.size(), want.size()) << name;
    double err = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, static_cast<double>(std::fabs(got[i] - want[i])));
      norm = std::max(norm, static_cast<double>(std::fabs(want[i])));
    }
    EXPECT_LE(err, 1e-5 * norm + 1e-9) << name;
  }
}

TEST(PipelineSplit, ChunksReproduceTheWholeModel) {
  expect_pipeline_matches(small("gpt-tiny", 4), {2, 2});
  expect_pipeline_matches(small("gpt-tiny", 4), {1, 2, 1});
  expect_pipeline_matches(small("gpt-tiny", 4), {1, 1, 1, 1});
  expect_pipeline_matches(small("llama-tiny", 3), {2, 1});
  expect_pipeline_matches(small("llama-tiny", 3), {3});
  // T5: 2 encoder then 2 decoder blocks.
  expect_pipeline_matches(small("t5-tiny", 2), {1, 1, 1, 1});
  expect_pipeline_matches(small("t5-tiny", 2), {1, 3});
  expect_pipeline_matches(small("t5-tiny", 2), {3, 1});
}

// T5 in one chunk per block: the encoder's output reaches both decoder chunks, passed on by
// the first; the position biases, computed from a table alone, never cross a cut: each chunk
// computes its own from the table, which it then holds (like the tied embedding).
TEST(PipelineSplit, T5EncoderOutputIsPassedOnAndBiasesAreRecomputed) {
  ModelConfig cfg = small("t5-tiny", 2);
  ModelGraph m = build_model(cfg, 2, 40, ModelMode::train);  // 36 encoder, 8 decoder tokens
  Result<std::vector<ChunkGraph>> split = split_pipeline(m.graph, {1, 1, 1, 1});
  ASSERT_TRUE(split.ok()) << split.status().to_string();
  const std::vector<ChunkGraph>& c = split.value();
  const Shape enc_out{2, 36, cfg.n_embd}, dec_stream{2, 8, cfg.n_embd};
  auto shapes = [](const ChunkGraph& k) {
    std::string out;
    for (ValueId v : k.recv) out += k.graph.type(v).shape.to_string() + " ";
    return out;
  };
  // Chunk 1 gets the encoder stream and the decoder's embeddings (computed before block 0);
  // chunks 2 and 3 the decoder stream and the encoder's output, which chunk 2 also sends on.
  EXPECT_EQ(shapes(c[1]), enc_out.to_string() + " " + dec_stream.to_string() + " ");
  EXPECT_EQ(shapes(c[2]), dec_stream.to_string() + " " + enc_out.to_string() + " ");
  EXPECT_EQ(shapes(c[3]), dec_stream.to_string() + " " + enc_out.to_string() + " ");
  ASSERT_EQ(c[2].send.size(), 2u);
  EXPECT_EQ(c[2].send[1], c[2].recv[1]);  // passed on as received
  for (int k : {0, 1}) {
    EXPECT_GE(c[k].graph.find_param("encoder.relative_attention_bias.weight"), 0) << k;
    EXPECT_LT(c[k].graph.find_param("decoder.relative_attention_bias.weight"), 0) << k;
  }
  for (int k : {2, 3}) {
    EXPECT_LT(c[k].graph.find_param("encoder.relative_attention_bias.weight"), 0) << k;
    EXPECT_GE(c[k].graph.find_param("decoder.relative_attention_bias.weight"), 0) << k;
  }
}

TEST(PipelineSplit, BoundariesAreTheResidualStream) {
  ModelGraph m = build_model(small("gpt-tiny", 4), 2, 8, ModelMode::train);
  Result<std::vector<ChunkGraph>> split = split_pipeline(m.graph, {1, 3});
  ASSERT_TRUE(split.ok()) << split.status().to_string();
  const std::vector<ChunkGraph>& c = split.value();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].first_block, 0);
  EXPECT_EQ(c[1].first_block, 1);
  EXPECT_EQ(c[1].blocks, 3);
  ASSERT_EQ(c[0].send.size(), 1u);  // x after block 0: [B, T, C]
  EXPECT_EQ(c[0].graph.type(c[0].send[0]).shape, (Shape{2, 8, 64}));
  ASSERT_EQ(c[1].recv.size(), 1u);
  EXPECT_EQ(c[1].graph.name_of(c[1].recv[0]), "pipe.act.1.0");
  EXPECT_EQ(c[0].graph.name_of(c[0].send_grads[0]), "pipe.grad.1.0");
  EXPECT_TRUE(c[1].send.empty());
  EXPECT_TRUE(c[0].recv.empty());
  // Tied embeddings: wte is a parameter of both; the loss only on the last chunk.
  EXPECT_GE(c[0].graph.find_param("wte"), 0);
  EXPECT_GE(c[1].graph.find_param("wte"), 0);
  EXPECT_LT(c[0].graph.find_param("ln_f.weight"), 0);
  EXPECT_LT(c[0].graph.loss(), 0);
  EXPECT_GE(c[1].graph.loss(), 0);
  EXPECT_GE(c[0].graph.find_input("tokens"), 0);
  EXPECT_LT(c[1].graph.find_input("tokens"), 0);
}

TEST(PipelineSplit, BadCutsAreErrors) {
  ModelGraph m = build_model(small("gpt-tiny", 4), 2, 8, ModelMode::train);
  for (std::vector<int> bad : {std::vector<int>{2, 1}, {2, 3}, {4, 0}, {}}) {
    Result<std::vector<ChunkGraph>> r = split_pipeline(m.graph, bad);
    ASSERT_FALSE(r.ok()) << ::testing::PrintToString(bad);
    EXPECT_NE(r.status().to_string().find("4 blocks"), std::string::npos) << r.status().to_string();
  }
  ModelGraph eval = build_model(small("gpt-tiny", 4), 2, 8, ModelMode::loss);
  EXPECT_FALSE(split_pipeline(eval.graph, {2, 2}).ok());
}

}  // namespace
}  // namespace tessera
