// Graph structure: verify(), print_graph(), error messages, builder scopes, FLOP counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "ir/autodiff.h"
#include "ir/builder.h"
#include "models/model.h"
#include "runtime/executor.h"

namespace tessera {
namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A small two-layer MLP with a loss and its backward pass.
void build_mlp(Graph* g) {
  Builder b(g);
  Var x = b.input("x", Shape{4, 8});
  Var h;
  {
    auto s = b.scope("h.0");
    b.set_layer(0);
    auto s2 = b.scope("mlp");
    Var w = b.parameter("weight", Shape{16, 8}, Init::normal, 0.02);
    Var bias = b.parameter("bias", Shape{16}, Init::zeros);
    h = b.gelu(b.linear(x, w, bias));
  }
  b.set_layer(-1);
  Var w2 = b.parameter("head", Shape{3, 16}, Init::normal, 0.02);
  Var y = b.linear(h, w2);
  append_backward(b, b.reduce_sum(y * y, {0, 1}));
}

TEST(Graph, VerifyAcceptsBuiltGraphs) {
  Graph g;
  build_mlp(&g);
  Status s = verify(g);
  EXPECT_TRUE(s.ok()) << s.to_string();
  for (const char* preset : {"gpt-tiny", "llama-tiny"}) {
    ModelGraph m = build_model(*find_preset(preset), 2, 8, ModelMode::train);
    Status sm = verify(m.graph);
    EXPECT_TRUE(sm.ok()) << preset << ": " << sm.to_string();
  }
}

// Graph is append-only with no mutating accessors; a corrupted graph is made here by writing
// through const_cast into a node of a (non-const) Graph.
TEST(Graph, VerifyRejectsWrongRecordedType) {
  Graph g;
  Builder b(&g);
  Var a = b.input("a", Shape{2, 3});
  Var w = b.input("w", Shape{3, 5});
  Var y = b.matmul(a, w);
  ASSERT_TRUE(verify(g).ok());
  Node& n = const_cast<Node&>(g.producer(y.id));
  std::get<MatmulAttrs>(n.attrs).transpose_b = true;  // [2,3] x [3,5]^T no longer type-checks
  Status s = verify(g);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.message(), "matmul")) << s.message();
  EXPECT_TRUE(contains(s.message(), "node %2")) << s.message();
  EXPECT_TRUE(contains(s.message(), "inner dims differ: 3 vs 5")) << s.message();
}

TEST(Graph, VerifyRejectsUseBeforeDefinition) {
  Graph g;
  Builder b(&g);
  Var a = b.input("a", Shape{2, 3});
  Var e = b.exp(a);
  Var t = b.tanh(e);
  Node& n = const_cast<Node&>(g.producer(e.id));
  n.inputs[0] = t.id;  // exp now reads a value defined after it
  Status s = verify(g);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.message(), "exp")) << s.message();
  EXPECT_TRUE(contains(s.message(), "before it is defined")) << s.message();
}

TEST(Graph, VerifyRejectsChangedShapeAttribute) {
  Graph g;
  Builder b(&g);
  Var a = b.input("a", Shape{2, 3, 4});
  Var r = b.reshape(a, Shape{6, 4});
  std::get<ShapeAttrs>(const_cast<Node&>(g.producer(r.id)).attrs).shape = {4, 6};
  Status s = verify(g);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.message(), "reshape")) << s.message();
  EXPECT_TRUE(contains(s.message(), "f32[6,4]")) << s.message();
  EXPECT_TRUE(contains(s.message(), "f32[4,6]")) << s.message();
}

TEST(Graph, AddNodeShapeErrorNamesOpScopeAndTypes) {
  Graph g;
  Builder b(&g);
  Var a = b.input("a", Shape{2, 3});
  Var w = b.input("w", Shape{4, 5});
  Result<NodeId> r = g.add_node(OpKind::matmul, MatmulAttrs{}, {a.id, w.id}, "h.1.mlp", 1, false);
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_TRUE(contains(m, "matmul")) << m;
  EXPECT_TRUE(contains(m, "h.1.mlp")) << m;
  EXPECT_TRUE(contains(m, "f32[2,3]")) << m;
  EXPECT_TRUE(contains(m, "f32[4,5]")) << m;
  EXPECT_FALSE(r.status().hint().empty());

  Result<NodeId> r2 = g.add_node(OpKind::add, {}, {a.id, w.id}, "", -1, false);
  ASSERT_FALSE(r2.ok());
  EXPECT_TRUE(contains(r2.status().message(), "add")) << r2.status().message();
  EXPECT_TRUE(contains(r2.status().message(), "do not broadcast")) << r2.status().message();

  Result<NodeId> r3 = g.add_node(OpKind::exp, {}, {a.id, w.id}, "", -1, false);
  ASSERT_FALSE(r3.ok());
  EXPECT_TRUE(contains(r3.status().message(), "op exp at '' takes 1 inputs, got 2"))
      << r3.status().message();
  // Failed add_node calls leave the graph as it was.
  EXPECT_EQ(g.nodes().size(), 2u);
  EXPECT_EQ(g.values().size(), 2u);
  EXPECT_TRUE(verify(g).ok());
}

TEST(Graph, AddNodeRefusesAttributesOfAnotherOp) {
  Graph g;
  Builder b(&g);
  Var a = b.input("a", Shape{2, 3});
  Var w = b.input("w", Shape{3, 5});
  Result<NodeId> r = g.add_node(OpKind::matmul, RopeAttrs{}, {a.id, w.id}, "h.0.mlp", 0, false);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(
      contains(r.status().message(), "op matmul at 'h.0.mlp' takes MatmulAttrs, got RopeAttrs"))
      << r.status().message();
  Result<NodeId> none = g.add_node(OpKind::slice, {}, {a.id}, "", -1, false);
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(contains(none.status().message(), "takes SliceAttrs, got NoAttrs"));
  EXPECT_EQ(g.nodes().size(), 2u);
  // The typed builder takes the op's own attributes.
  Var y = b.op<OpKind::matmul>({a, w}, {.transpose_a = false, .transpose_b = false})[0];
  EXPECT_EQ(y.shape(), (Shape{2, 5}));
  EXPECT_FALSE(g.producer(y.id).attr<MatmulAttrs>().transpose_b);
}

TEST(GraphDeathTest, ReadingAnotherOpsAttributesIsABug) {
  Graph g;
  Builder b(&g);
  Var y = b.rope(b.input("x", Shape{1, 2, 1, 4}), 1e4);
  EXPECT_DEATH(g.producer(y.id).attr<MatmulAttrs>(), "read as MatmulAttrs but they are RopeAttrs");
}

TEST(Graph, FailedDuplicateParameterLeavesGraphUnchanged) {
  Graph g;
  Builder b(&g);
  b.parameter("w", Shape{2}, Init::zeros);
  Result<NodeId> r =
      g.add_node(OpKind::parameter, SourceAttrs{.name = "w", .shape = {3}}, {}, "", -1, false);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "duplicate parameter name 'w'"));
  EXPECT_EQ(g.values().size(), g.nodes().size()) << "a dangling value was left behind";
  for (const Value& v : g.values())
    EXPECT_LT(v.producer, static_cast<NodeId>(g.nodes().size())) << "value with no producer";
}

TEST(GraphDeathTest, BuilderShapeErrorAbortsNamingOp) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Graph g;
  Builder b(&g);
  Var a = b.input("a", Shape{2, 3});
  Var w = b.input("w", Shape{4, 5});
  auto s = b.scope("blk");
  EXPECT_DEATH(b.matmul(a, w), "op matmul at 'blk' with inputs \\(f32\\[2,3\\], f32\\[4,5\\]\\)");
}

TEST(Graph, BuilderScopesNameParametersAndNodes) {
  Graph g;
  Builder b(&g);
  Var x = b.input("x", Shape{2, 4});
  {
    auto s0 = b.scope("h.0");
    auto s1 = b.scope("attn");
    {
      auto s2 = b.scope("qkv");
      Var w = b.parameter("weight", Shape{12, 4}, Init::normal, 0.02);
      EXPECT_EQ(g.name_of(w.id), "h.0.attn.qkv.weight");
      Var y = b.linear(x, w);
      EXPECT_EQ(g.producer(y.id).scope, "h.0.attn.qkv");
    }
    EXPECT_EQ(b.current_scope(), "h.0.attn");
  }
  EXPECT_EQ(b.current_scope(), "");
  Var top = b.parameter("wte", Shape{3}, Init::zeros);
  EXPECT_EQ(g.name_of(top.id), "wte");
  EXPECT_GE(g.find_param("h.0.attn.qkv.weight"), 0);
  EXPECT_EQ(g.find_param("qkv.weight"), -1);

  ModelGraph m = build_model(*find_preset("gpt-tiny"), 1, 4, ModelMode::logits);
  for (const char* name :
       {"h.0.attn.qkv.weight", "h.1.mlp.fc.bias", "h.0.ln_1.weight", "wte", "wpe", "ln_f.weight"})
    EXPECT_GE(m.graph.find_param(name), 0) << name;
  ModelGraph l = build_model(*find_preset("llama-tiny"), 1, 4, ModelMode::logits);
  for (const char* name : {"h.0.attn.q.weight", "h.1.mlp.gate.weight", "h.0.attn_norm.weight",
                           "tok_emb", "norm.weight", "lm_head.weight"})
    EXPECT_GE(l.graph.find_param(name), 0) << name;
}

TEST(Graph, PrintGraphShowsScopesTypesAndBackward) {
  Graph g;
  build_mlp(&g);
  std::string p = print_graph(g);
  EXPECT_TRUE(contains(p, "matmul(")) << p;
  EXPECT_TRUE(contains(p, "{tb}")) << p;
  EXPECT_TRUE(contains(p, ": f32[4,16]  # h.0.mlp")) << p;
  EXPECT_TRUE(contains(p, "'h.0.mlp.weight' : f32[16,8]")) << p;
  EXPECT_TRUE(contains(p, "# bwd h.0.mlp")) << p;
  EXPECT_TRUE(contains(p, "gelu_grad(")) << p;
  // One line per node.
  EXPECT_EQ(static_cast<size_t>(std::count(p.begin(), p.end(), '\n')), g.nodes().size());
}

TEST(Graph, PrintGraphShowsTheAttributesTheTypesDoNot) {
  Graph g;
  Builder b(&g);
  Var x = b.input("x", Shape{1, 6, 2, 4});
  b.slice(x, 1, 2, 5);
  b.rope(x, 5e5, true);
  b.reduce_sum(x, {0, 2}, true);
  b.cross_entropy(b.input("logits", Shape{3, 8}), b.input("t", Shape{3}, DType::i32), 5);
  const std::string p = print_graph(g);
  for (const char* want :
       {"slice(%0) {axis=1 [2,5)}", "rope(%0) {theta=500000 inverse}",
        "reduce_sum(%0) {axes=[0,2] keepdim}", "{classes=5 rows=0}", "input() 't' : i32[3]"})
    EXPECT_TRUE(contains(p, want)) << want << " in\n" << p;
}

TEST(Graph, MatmulFlopsAre2MNK) {
  const int64_t M = 6, N = 5, K = 7, B = 3;
  {
    Graph g;
    Builder b(&g);
    b.matmul(b.input("a", Shape{M, K}), b.input("b", Shape{K, N}));
    EXPECT_EQ(g.total_flops(), 2.0 * M * N * K);
  }
  {
    Graph g;
    Builder b(&g);
    b.matmul(b.input("a", Shape{B, K, M}), b.input("b", Shape{B, N, K}), true, true);
    EXPECT_EQ(g.total_flops(), 2.0 * B * M * N * K);
  }
  {
    Graph g;
    Builder b(&g);
    b.matmul(b.input("a", Shape{B, M, K}), b.input("b", Shape{N, K}), false, true);
    EXPECT_EQ(g.total_flops(), 2.0 * B * M * N * K);
  }
  {
    // Training: the backward of a matmul is two matmuls of the same size.
    Graph g;
    Builder b(&g);
    Var y = b.matmul(b.parameter("a", Shape{M, K}, Init::zeros),
                     b.parameter("b", Shape{K, N}, Init::zeros));
    Var loss = b.reduce_sum(y, {0, 1});
    const double fwd = g.total_flops();
    EXPECT_EQ(fwd, 2.0 * M * N * K + M * N);
    append_backward(b, loss);
    EXPECT_EQ(g.forward_flops(), fwd);
    EXPECT_EQ(g.total_flops(), fwd + 2 * (2.0 * M * N * K));
  }
}

TEST(Autodiff, AccumulatesFanOutAndZeroesUnusedParameters) {
  Graph g;
  Builder b(&g);
  Var x = b.parameter("x", Shape{3}, Init::zeros);
  Var unused = b.parameter("unused", Shape{2}, Init::zeros);
  Var loss = b.reduce_sum(b.exp(x) + x, {0});  // d/dx = exp(x) + 1
  append_backward(b, loss);
  ASSERT_TRUE(verify(g).ok());
  EXPECT_EQ(g.loss(), loss.id);
  ASSERT_EQ(g.param_grads().size(), 2u);
  for (const Node& n : g.nodes()) {
    if (n.outputs[0] > loss.id) {
      EXPECT_TRUE(n.backward) << op_name(n.op);
    }
  }
  CpuBackend cpu;
  Executor ex(g, cpu);
  float xs[3] = {0.5f, -2.0f, 3.0f};
  std::memcpy(ex.raw(x.id), xs, sizeof xs);
  ex.run();
  const float* dx = ex.data<float>(g.param_grads().at(x.id));
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(dx[i], std::exp(xs[i]) + 1);
  const float* du = ex.data<float>(g.param_grads().at(unused.id));
  EXPECT_EQ(du[0], 0.0f);
  EXPECT_EQ(du[1], 0.0f);
}

// Slices of one tensor get their gradients placed by one concat: no zero fills, no adds, and
// the gaps (a slice nobody reads) filled once; values as the per-slice formula gives.
TEST(Autodiff, SiblingSlicesShareOneConcat) {
  Graph g;
  Builder b(&g);
  Var x = b.parameter("x", Shape{2, 6}, Init::zeros);
  Var a = b.slice(x, 1, 0, 2), c = b.slice(x, 1, 4, 6);  // columns 2..3 unused
  Var loss = b.reduce_sum(b.exp(a) + b.scale(c, 3.0), {0, 1});
  append_backward(b, loss);
  ASSERT_TRUE(verify(g).ok());
  int concats = 0, adds = 0, fills = 0;
  for (const Node& n : g.nodes()) {
    if (!n.backward) continue;
    concats += n.op == OpKind::concat;
    adds += n.op == OpKind::add;
    fills += n.op == OpKind::fill && g.type(n.outputs[0]).shape.numel() > 1;
  }
  EXPECT_EQ(concats, 1);
  EXPECT_EQ(adds, 0);
  EXPECT_EQ(fills, 1);  // the unread columns
  CpuBackend cpu;
  Executor ex(g, cpu);
  float xs[12] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, -1, -2, -3, -4, -5, -6};
  std::memcpy(ex.raw(x.id), xs, sizeof xs);
  ex.run();
  const float* dx = ex.data<float>(g.param_grads().at(x.id));
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < 6; ++k) {
      float want = k < 2 ? std::exp(xs[r * 6 + k]) : k < 4 ? 0.0f : 3.0f;
      EXPECT_FLOAT_EQ(dx[r * 6 + k], want) << r << "," << k;
    }
}

// VJPs must not hold a `const Shape&` from Var::shape() (a reference into Graph::values_) across
// a builder call that appends values: the vector may reallocate. Which call reallocates depends
// on the graph size, so this builds the same computation after 0..63 unrelated nodes.
TEST(Autodiff, VjpsSurviveValueVectorReallocation) {
  for (int pad = 0; pad < 64; ++pad) {
    Graph g;
    Builder b(&g);
    Var x = b.parameter("x", Shape{3}, Init::zeros);
    Var y = b.parameter("y", Shape{2, 3}, Init::zeros);
    Var dummy = y;
    for (int i = 0; i < pad; ++i) dummy = b.exp(dummy);
    // d/dx = 2x + 1 + sum over rows of (y - 1/y), d/dy = x - x/y^2
    Var loss = b.reduce_sum(x * x + x, {0}) + b.reduce_sum(x * y - x / y, {0, 1});
    append_backward(b, loss);
    ASSERT_TRUE(verify(g).ok()) << "pad " << pad;
    ASSERT_EQ(g.type(g.param_grads().at(x.id)).shape, (Shape{3})) << "pad " << pad;
    ASSERT_EQ(g.type(g.param_grads().at(y.id)).shape, (Shape{2, 3})) << "pad " << pad;
    CpuBackend cpu;
    Executor ex(g, cpu);
    float xs[3] = {0.5f, -2, 3}, ys[6] = {0.5f, 1, 2, 4, -1, 0.25f};
    std::memcpy(ex.raw(x.id), xs, sizeof xs);
    std::memcpy(ex.raw(y.id), ys, sizeof ys);
    ex.run();
    const float* dx = ex.data<float>(g.param_grads().at(x.id));
    const float* dy = ex.data<float>(g.param_grads().at(y.id));
    for (int j = 0; j < 3; ++j)
      EXPECT_NEAR(dx[j], 2 * xs[j] + 1 + ys[j] - 1 / ys[j] + ys[3 + j] - 1 / ys[3 + j], 1e-5)
          << "pad " << pad;
    for (int i = 0; i < 6; ++i)
      EXPECT_NEAR(dy[i], xs[i % 3] * (1 + 1 / (ys[i] * ys[i])), 1e-5) << "pad " << pad;
  }
}

}  // namespace
}  // namespace tessera
