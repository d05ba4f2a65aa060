// The op-consistency harness: one table with an entry for every registered op.
//
//  - forward entries run a small graph through Executor + CpuBackend and compare each output
//    with a naive reference written here (plain loops in double), or for fused ops with a
//    decomposition into primitive ops built in the same graph;
//  - gradient entries make the op's float inputs parameters, take
//    loss = reduce_sum(output * fixed random weights), append_backward, and compare every
//    parameter gradient with central finite differences of the same graph;
//  - source entries cover parameter/input.
// The Coverage test fails for any op in all_ops() without an entry (backward-only ops count as
// covered when their forward op, named by OpDef::gradient_of, has a gradient entry) and prints
// the coverage table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "ir/autodiff.h"
#include "ir/builder.h"
#include "op_entries.h"
#include "op_test_util.h"
#include "runtime/executor.h"

namespace tessera {
namespace {

using namespace op_test;

// ---- the table ---------------------------------------------------------------------------

void binary_fwd(Net& n, OpKind op, Shape xs, Shape ys) {
  Gen gy = op == OpKind::div ? magnitude(0.5f, 2.0f) : Gen{};
  Var x = n.param(xs), y = n.param(ys, gy);
  Var z = n.keep(n.b.apply1(op, {}, {x, y}));
  n.run();
  expect_close(n.read(z), ref_binary(op, n.host(x), xs, n.host(y), ys), kFwdTol, op_name(op));
}

void unary_fwd(Net& n, OpKind op, Gen gen, double scalar, double (*ref)(double, double)) {
  Attrs a;  // scale and add_scalar take their scalar; the other unary ops nothing
  if (op_def(op).attrs_index == AttrsIndex<ScalarAttrs>::value) a = ScalarAttrs{.value = scalar};
  Var x = n.param(Shape{2, 3, 4}, gen);
  Var y = n.keep(n.b.apply1(op, a, {x}));
  n.run();
  std::vector<double> want;
  for (float v : n.host(x)) want.push_back(ref(v, scalar));
  expect_close(n.read(y), want, kFwdTol, op_name(op));
}

void reduce_fwd(Net& n, Shape xs, std::vector<int64_t> axes, bool keepdim, Shape want_shape) {
  Var x = n.param(xs);
  Var y = n.keep(n.b.reduce_sum(x, axes, keepdim));
  EXPECT_EQ(y.shape(), want_shape);
  n.run();
  expect_close(n.read(y), ref_reduce(n.host(x), xs, axes), kFwdTol, "reduce_sum");
}

void matmul_fwd(Net& n, Shape sa, Shape sb, bool ta, bool tb, Shape want) {
  Var a = n.param(sa), b = n.param(sb);
  Var c = n.keep(n.b.matmul(a, b, ta, tb));
  EXPECT_EQ(c.shape(), want);
  n.run();
  expect_close(n.read(c), ref_matmul(n.host(a), sa, n.host(b), sb, ta, tb), kFwdTol, "matmul");
}

void transpose_fwd(Net& n, Shape xs, std::vector<int64_t> perm) {
  Var x = n.param(xs);
  Var y = n.keep(n.b.transpose(x, perm));
  n.run();
  expect_close(n.read(y), ref_transpose(n.host(x), xs, perm), 0.0, "transpose");
}

void slice_fwd(Net& n, Shape xs, int axis, int64_t start, int64_t end) {
  Var x = n.param(xs);
  Var y = n.keep(n.b.slice(x, axis, start, end));
  int ax = xs.axis(axis);
  EXPECT_EQ(y.shape(), xs.with_dim(ax, end - start));
  n.run();
  std::vector<double> want;
  std::vector<int64_t> st = strides_of(xs);
  for (int64_t i = 0; i < y.shape().numel(); ++i) {
    std::vector<int64_t> c = unravel(i, y.shape());
    c[static_cast<size_t>(ax)] += start;
    int64_t off = 0;
    for (size_t d = 0; d < c.size(); ++d) off += c[d] * st[d];
    want.push_back(n.host(x)[static_cast<size_t>(off)]);
  }
  expect_close(n.read(y), want, 0.0, "slice");
}

void concat_fwd(Net& n, std::vector<Shape> shapes, int axis) {
  std::vector<Var> xs;
  for (const Shape& s : shapes) xs.push_back(n.param(s));
  Var y = n.keep(n.b.concat(xs, axis));
  int ax = shapes[0].axis(axis);
  n.run();
  std::vector<double> want;
  for (int64_t i = 0; i < y.shape().numel(); ++i) {
    std::vector<int64_t> c = unravel(i, y.shape());
    size_t k = 0;
    while (c[static_cast<size_t>(ax)] >= shapes[k][ax])
      c[static_cast<size_t>(ax)] -= shapes[k++][ax];
    std::vector<int64_t> st = strides_of(shapes[k]);
    int64_t off = 0;
    for (size_t d = 0; d < c.size(); ++d) off += c[d] * st[d];
    want.push_back(n.host(xs[k])[static_cast<size_t>(off)]);
  }
  expect_close(n.read(y), want, 0.0, "concat");
}

std::vector<Entry> build_entries() {
  std::vector<Entry> e;
  auto fwd = [&](const char* op, const char* label, std::function<void(Net&)> f) {
    e.push_back(Entry{op, Check::forward, label, std::move(f), nullptr});
  };

  // Sources.
  e.push_back(Entry{"parameter", Check::source, "parameter_init",
                    [](Net& n) {
                      Var z = n.b.parameter("z", Shape{4}, Init::zeros);
                      Var o = n.b.parameter("o", Shape{5}, Init::ones);
                      Var r = n.b.parameter("r", Shape{100, 100}, Init::normal, 0.5);
                      EXPECT_EQ(n.g.find_param("r"), r.id);
                      n.ex().init_params(3);
                      for (int i = 0; i < 4; ++i) EXPECT_EQ(n.ex().data<float>(z.id)[i], 0.0f);
                      for (int i = 0; i < 5; ++i) EXPECT_EQ(n.ex().data<float>(o.id)[i], 1.0f);
                      double s = 0, s2 = 0;
                      for (int i = 0; i < 10000; ++i) {
                        double x = n.ex().data<float>(r.id)[i];
                        s += x;
                        s2 += x * x;
                      }
                      EXPECT_NEAR(s / 1e4, 0.0, 0.02);
                      EXPECT_NEAR(std::sqrt(s2 / 1e4), 0.5, 0.02);
                    },
                    nullptr});
  e.push_back(Entry{"input", Check::source, "input_roundtrip",
                    [](Net& n) {
                      std::vector<float> v = n.random(6);
                      Var x = n.finput(Shape{2, 3}, v);
                      Var y = n.keep(n.b.scale(x, 1.0));
                      n.run();
                      expect_close(n.read(y), v, 0.0, "input");
                    },
                    nullptr});

  fwd("fill", "fill", [](Net& n) {
    Var f = n.keep(n.b.fill(Shape{2, 3}, 2.5));
    Var h = n.keep(n.b.fill(Shape{3}, -1.25, DType::bf16));
    n.run();
    expect_close(n.read(f), std::vector<double>(6, 2.5), 0.0, "fill f32");
    expect_close(n.read(h), std::vector<double>(3, -1.25), 0.0, "fill bf16");
  });

  // Binary ops, broadcasting in both directions.
  fwd("add", "add_same", [](Net& n) { binary_fwd(n, OpKind::add, {2, 3, 4}, {2, 3, 4}); });
  fwd("add", "add_bcast_right", [](Net& n) { binary_fwd(n, OpKind::add, {2, 3, 4}, {4}); });
  fwd("add", "add_bcast_left", [](Net& n) { binary_fwd(n, OpKind::add, {3, 1}, {2, 3, 4}); });
  fwd("sub", "sub_bcast_left", [](Net& n) { binary_fwd(n, OpKind::sub, {4}, {2, 3, 4}); });
  fwd("sub", "sub_bcast_both", [](Net& n) { binary_fwd(n, OpKind::sub, {2, 1, 4}, {3, 1}); });
  fwd("mul", "mul_bcast_both", [](Net& n) { binary_fwd(n, OpKind::mul, {2, 1, 4}, {3, 1}); });
  fwd("mul", "mul_bcast_mid", [](Net& n) { binary_fwd(n, OpKind::mul, {2, 3, 4}, {2, 1, 4}); });
  fwd("div", "div_bcast_right", [](Net& n) { binary_fwd(n, OpKind::div, {2, 3, 4}, {3, 1}); });
  fwd("div", "div_bcast_left", [](Net& n) { binary_fwd(n, OpKind::div, {4}, {2, 3, 4}); });

  // Unary ops.
  fwd("scale", "scale", [](Net& n) {
    unary_fwd(n, OpKind::scale, {}, -1.7, [](double x, double s) { return x * s; });
  });
  fwd("add_scalar", "add_scalar", [](Net& n) {
    unary_fwd(n, OpKind::add_scalar, {}, 0.3, [](double x, double s) { return x + s; });
  });
  fwd("exp", "exp", [](Net& n) {
    unary_fwd(n, OpKind::exp, uniform(-2, 2), 0, [](double x, double) { return std::exp(x); });
  });
  fwd("log", "log", [](Net& n) {
    unary_fwd(n, OpKind::log, uniform(0.1f, 3), 0, [](double x, double) { return std::log(x); });
  });
  fwd("sqrt", "sqrt", [](Net& n) {
    unary_fwd(n, OpKind::sqrt, uniform(0.1f, 3), 0, [](double x, double) { return std::sqrt(x); });
  });
  fwd("rsqrt", "rsqrt", [](Net& n) {
    unary_fwd(n, OpKind::rsqrt, uniform(0.1f, 3), 0,
              [](double x, double) { return 1.0 / std::sqrt(x); });
  });
  fwd("tanh", "tanh", [](Net& n) {
    unary_fwd(n, OpKind::tanh, uniform(-3, 3), 0, [](double x, double) { return std::tanh(x); });
  });
  fwd("gelu", "gelu", [](Net& n) {
    unary_fwd(n, OpKind::gelu, uniform(-4, 4), 0, [](double x, double) { return gelu_ref(x); });
  });
  fwd("silu", "silu", [](Net& n) {
    unary_fwd(n, OpKind::silu, uniform(-4, 4), 0,
              [](double x, double) { return x * sigmoid_ref(x); });
  });
  fwd("relu", "relu", [](Net& n) {
    unary_fwd(n, OpKind::relu, uniform(-4, 4), 0, [](double x, double) { return x > 0 ? x : 0; });
  });
  // The backward-only elementwise ops also have direct forward references (derivatives).
  fwd("relu_grad", "relu_grad", [](Net& n) {
    Var x = n.param(Shape{2, 3, 4}, uniform(-3, 3)), dy = n.param(Shape{2, 3, 4});
    Var dx = n.keep(n.b.relu_grad(x, dy));
    n.run();
    std::vector<double> want;
    for (size_t i = 0; i < n.host(x).size(); ++i)
      want.push_back(n.host(x)[i] > 0 ? n.host(dy)[i] : 0.0);
    expect_close(n.read(dx), want, 0.0, "relu_grad");
  });
  fwd("gelu_grad", "gelu_grad", [](Net& n) {
    Var x = n.param(Shape{2, 3, 4}, uniform(-3, 3)), dy = n.param(Shape{2, 3, 4});
    Var dx = n.keep(n.b.gelu_grad(x, dy));
    n.run();
    std::vector<double> want;
    for (size_t i = 0; i < n.host(x).size(); ++i) {
      double v = n.host(x)[i], h = 1e-5;
      want.push_back(n.host(dy)[i] * (gelu_ref(v + h) - gelu_ref(v - h)) / (2 * h));
    }
    expect_close(n.read(dx), want, 1e-5, "gelu_grad");
  });
  fwd("silu_grad", "silu_grad", [](Net& n) {
    Var x = n.param(Shape{2, 3, 4}, uniform(-3, 3)), dy = n.param(Shape{2, 3, 4});
    Var dx = n.keep(n.b.silu_grad(x, dy));
    n.run();
    std::vector<double> want;
    for (size_t i = 0; i < n.host(x).size(); ++i) {
      double v = n.host(x)[i], s = sigmoid_ref(v);
      want.push_back(n.host(dy)[i] * (s + v * s * (1 - s)));
    }
    expect_close(n.read(dx), want, 1e-5, "silu_grad");
  });
  fwd("swiglu", "swiglu", [](Net& n) {
    Var g = n.param(Shape{2, 3, 4}, uniform(-3, 3)), u = n.param(Shape{2, 3, 4});
    Var y = n.keep(n.b.swiglu(g, u));
    Var decomposed = n.keep(n.b.silu(g) * u);
    n.run();
    std::vector<double> want;
    for (size_t i = 0; i < n.host(g).size(); ++i)
      want.push_back(n.host(g)[i] * sigmoid_ref(n.host(g)[i]) * n.host(u)[i]);
    expect_close(n.read(y), want, kFwdTol, "swiglu naive");
    expect_close(n.read(y), n.read(decomposed), kFwdTol, "swiglu vs silu*up");
  });

  // Reductions and broadcasting.
  fwd("reduce_sum", "reduce_mid", [](Net& n) { reduce_fwd(n, {2, 3, 4}, {1}, false, {2, 4}); });
  fwd("reduce_sum", "reduce_mid_keep", [](Net& n) {
    reduce_fwd(n, {2, 3, 4}, {1}, true, {2, 1, 4});
  });
  fwd("reduce_sum", "reduce_outer_keep", [](Net& n) {
    reduce_fwd(n, {2, 3, 4}, {0, 2}, true, {1, 3, 1});
  });
  fwd("reduce_sum", "reduce_outer", [](Net& n) { reduce_fwd(n, {2, 3, 4}, {0, 2}, false, {3}); });
  fwd("reduce_sum", "reduce_last_neg", [](Net& n) {
    reduce_fwd(n, {2, 3, 4}, {-1}, false, {2, 3});
  });
  fwd("reduce_sum", "reduce_leading", [](Net& n) { reduce_fwd(n, {2, 3, 4}, {0}, false, {3, 4}); });
  fwd("reduce_sum", "reduce_all", [](Net& n) { reduce_fwd(n, {2, 3, 4}, {0, 1, 2}, false, {}); });
  fwd("reduce_sum", "reduce_4d", [](Net& n) {
    reduce_fwd(n, {2, 3, 2, 3}, {1, 3}, true, {2, 1, 2, 1});
  });
  fwd("sum_to", "sum_to", [](Net& n0) {
    n0.b.sum_to(n0.param(Shape{2, 3, 4}), Shape{4});
    for (Shape target : {Shape{3, 1}, Shape{4}, Shape{2, 1, 4}, Shape{1, 3, 4}}) {
      Net n;
      Var x = n.param(Shape{2, 3, 4});
      Var y = n.keep(n.b.sum_to(x, target));
      EXPECT_EQ(y.shape(), target);
      n.run();
      // Reduce the broadcast axes: the leading extra ones and those where the target is 1.
      std::vector<int64_t> axes;
      for (int d = 0; d < 3; ++d) {
        int td = d - (3 - target.rank());
        if (td < 0 || target[td] == 1) axes.push_back(d);
      }
      expect_close(n.read(y), ref_reduce(n.host(x), Shape{2, 3, 4}, axes), kFwdTol,
                   "sum_to " + target.to_string());
    }
  });
  fwd("broadcast_to", "broadcast_to", [](Net& n0) {
    n0.b.broadcast_to(n0.param(Shape{4}), Shape{2, 3, 4});
    for (Shape from : {Shape{3, 1}, Shape{4}, Shape{2, 1, 4}}) {
      Net n;
      Var x = n.param(from);
      Var y = n.keep(n.b.broadcast_to(x, Shape{2, 3, 4}));
      n.run();
      std::vector<double> want;
      for (int64_t i = 0; i < 24; ++i)
        want.push_back(bcast_at(n.host(x), from, unravel(i, {2, 3, 4})));
      expect_close(n.read(y), want, 0.0, "broadcast_to from " + from.to_string());
    }
  });

  // Shape ops.
  fwd("reshape", "reshape", [](Net& n) {
    Var x = n.param(Shape{2, 3, 4});
    Var y = n.keep(n.b.reshape(x, Shape{4, -1}));
    EXPECT_EQ(y.shape(), (Shape{4, 6}));
    n.run();
    expect_close(n.read(y), n.host(x), 0.0, "reshape");
  });
  fwd("transpose", "transpose_3d_201", [](Net& n) { transpose_fwd(n, {2, 3, 4}, {2, 0, 1}); });
  fwd("transpose", "transpose_3d_102", [](Net& n) { transpose_fwd(n, {2, 3, 4}, {1, 0, 2}); });
  fwd("transpose", "transpose_4d_0213", [](Net& n) {
    transpose_fwd(n, {2, 3, 4, 5}, {0, 2, 1, 3});
  });
  fwd("transpose", "transpose_4d_3102", [](Net& n) {
    transpose_fwd(n, {2, 3, 4, 5}, {3, 1, 0, 2});
  });
  fwd("slice", "slice_mid", [](Net& n) { slice_fwd(n, {2, 5, 3}, 1, 1, 4); });
  fwd("slice", "slice_last_neg", [](Net& n) { slice_fwd(n, {2, 3, 6}, -1, 2, 5); });
  fwd("slice", "slice_first", [](Net& n) { slice_fwd(n, {4, 3, 2}, 0, 1, 3); });
  fwd("concat", "concat_mid", [](Net& n) { concat_fwd(n, {{2, 1, 3}, {2, 2, 3}, {2, 3, 3}}, 1); });
  fwd("concat", "concat_last", [](Net& n) { concat_fwd(n, {{2, 3, 1}, {2, 3, 2}}, -1); });
  fwd("concat", "concat_first", [](Net& n) { concat_fwd(n, {{1, 3, 2}, {2, 3, 2}}, 0); });
  fwd("cast", "cast_roundtrips", [](Net& n) {
    Var x = n.param(Shape{2, 3, 4}, uniform(-3, 3));
    Var bf = n.keep(n.b.cast(x, DType::bf16)), back_bf = n.keep(n.b.cast(bf, DType::f32));
    Var h = n.keep(n.b.cast(x, DType::f16)), back_h = n.keep(n.b.cast(h, DType::f32));
    Var h_from_bf = n.keep(n.b.cast(bf, DType::f16));
    n.run();
    std::vector<double> want_bf, want_h;
    for (float v : n.host(x)) {
      want_bf.push_back(bf16_to_f32(f32_to_bf16(v)));
      want_h.push_back(f16_to_f32(f32_to_f16(v)));
      (void)v;
    }
    // Exactly the scalar conversions, and within the formats' precision of the input.
    expect_close(n.read(back_bf), want_bf, 0.0, "f32->bf16->f32");
    expect_close(n.read(back_h), want_h, 0.0, "f32->f16->f32");
    expect_close(n.read(h_from_bf), want_bf, 0.0, "bf16->f16 (exact for these values)");
    std::vector<float> rb = n.read(back_bf), rh = n.read(back_h);
    for (size_t i = 0; i < rb.size(); ++i) {
      float v = n.host(x)[i];
      EXPECT_LE(std::fabs(rb[i] - v), std::fabs(v) * 0x1p-8f) << "bf16 rounding of " << v;
      EXPECT_LE(std::fabs(rh[i] - v), std::fabs(v) * 0x1p-11f + 0x1p-25f) << "f16 rounding";
    }
  });

  // Matmul: all transpose combinations, batched operands, shared rank-2 right operand.
  fwd("matmul", "matmul_nn", [](Net& n) { matmul_fwd(n, {3, 4}, {4, 5}, false, false, {3, 5}); });
  fwd("matmul", "matmul_nt", [](Net& n) { matmul_fwd(n, {3, 4}, {5, 4}, false, true, {3, 5}); });
  fwd("matmul", "matmul_tn", [](Net& n) { matmul_fwd(n, {4, 3}, {4, 5}, true, false, {3, 5}); });
  fwd("matmul", "matmul_tt", [](Net& n) { matmul_fwd(n, {4, 3}, {5, 4}, true, true, {3, 5}); });
  fwd("matmul", "matmul_batched_nn", [](Net& n) {
    matmul_fwd(n, {2, 3, 4}, {2, 4, 5}, false, false, {2, 3, 5});
  });
  fwd("matmul", "matmul_batched_tt", [](Net& n) {
    matmul_fwd(n, {2, 4, 3}, {2, 5, 4}, true, true, {2, 3, 5});
  });
  fwd("matmul", "matmul_batched4d_nt", [](Net& n) {
    matmul_fwd(n, {2, 2, 3, 4}, {2, 2, 5, 4}, false, true, {2, 2, 3, 5});
  });
  fwd("matmul", "matmul_batched4d_tn", [](Net& n) {
    matmul_fwd(n, {2, 2, 4, 3}, {2, 2, 4, 5}, true, false, {2, 2, 3, 5});
  });
  fwd("matmul", "matmul_shared_rhs", [](Net& n) {
    matmul_fwd(n, {2, 3, 4}, {4, 5}, false, false, {2, 3, 5});
  });
  fwd("matmul", "matmul_shared_rhs_t", [](Net& n) {
    matmul_fwd(n, {2, 2, 3, 4}, {5, 4}, false, true, {2, 2, 3, 5});
  });

  // Neural-network ops.
  fwd("embedding", "embedding", [](Net& n) {
    Var table = n.param(Shape{7, 4});
    Var ids = n.ids(Shape{2, 3}, {6, 0, 3, 3, 1, 6});
    Var y = n.keep(n.b.embedding(table, ids));
    EXPECT_EQ(y.shape(), (Shape{2, 3, 4}));
    n.run();
    std::vector<double> want;
    for (int32_t id : n.host_ids(ids))
      for (int c = 0; c < 4; ++c) want.push_back(n.host(table)[static_cast<size_t>(id * 4 + c)]);
    expect_close(n.read(y), want, 0.0, "embedding");
  });
  fwd("embedding_grad", "embedding_grad", [](Net& n) {
    Var dy = n.param(Shape{2, 3, 4});
    Var ids = n.ids(Shape{2, 3}, {5, 0, 3, 3, 1, 3});
    Var dt = n.keep(n.b.embedding_grad(dy, ids, 6));
    n.run();
    std::vector<double> want(24, 0.0);
    for (size_t i = 0; i < 6; ++i)
      for (size_t c = 0; c < 4; ++c)
        want[static_cast<size_t>(n.host_ids(ids)[i]) * 4 + c] += n.host(dy)[i * 4 + c];
    expect_close(n.read(dt), want, kFwdTol, "embedding_grad (scatter-add, repeated ids)");
  });
  fwd("layernorm", "layernorm", [](Net& n) {
    Builder& b = n.b;
    const double eps = 1e-5;
    Var x = n.param(Shape{2, 3, 5}, uniform(-2, 2)), w = n.param(Shape{5}),
        bias = n.param(Shape{5});
    std::vector<Var> ln = b.layernorm(x, w, bias, eps);
    for (Var v : ln) n.keep(v);
    Var mean = b.scale(b.reduce_sum(x, {-1}, true), 1.0 / 5);
    Var xc = x - mean;
    Var var = b.scale(b.reduce_sum(xc * xc, {-1}, true), 1.0 / 5);
    Var rstd = b.rsqrt(b.add_scalar(var, eps));
    Var y = n.keep(xc * rstd * w + bias);
    Var mean2 = n.keep(b.reshape(mean, Shape{2, 3})), rstd2 = n.keep(b.reshape(rstd, Shape{2, 3}));
    n.run();
    expect_close(n.read(ln[0]), n.read(y), kFwdTol, "layernorm y");
    expect_close(n.read(ln[1]), n.read(mean2), kFwdTol, "layernorm mean");
    expect_close(n.read(ln[2]), n.read(rstd2), kFwdTol, "layernorm rstd");
  });
  fwd("rmsnorm", "rmsnorm", [](Net& n) {
    Builder& b = n.b;
    const double eps = 1e-5;
    Var x = n.param(Shape{2, 3, 4}, uniform(-2, 2)), w = n.param(Shape{4});
    std::vector<Var> rn = b.rmsnorm(x, w, eps);
    for (Var v : rn) n.keep(v);
    Var rstd = b.rsqrt(b.add_scalar(b.scale(b.reduce_sum(x * x, {-1}, true), 0.25), eps));
    Var y = n.keep(x * rstd * w);
    Var rstd2 = n.keep(b.reshape(rstd, Shape{2, 3}));
    n.run();
    expect_close(n.read(rn[0]), n.read(y), kFwdTol, "rmsnorm y");
    expect_close(n.read(rn[1]), n.read(rstd2), kFwdTol, "rmsnorm rstd");
  });
  fwd("rope", "rope", [](Net& n) {
    const int64_t B = 2, T = 5, H = 2, D = 6;
    const double theta = 100.0;
    Var x = n.param(Shape{B, T, H, D});
    Var y = n.keep(n.b.rope(x, theta));
    Var back = n.keep(n.b.rope(y, theta, /*inverse=*/true));
    n.run();
    // Rotate-half RoPE (GPT-NeoX / HF LLaMA): pairs (i, i + D/2) rotate by t * theta^(-2i/D).
    std::vector<double> want(static_cast<size_t>(B * T * H * D));
    const std::vector<float>& xv = n.host(x);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < D / 2; ++i) {
            size_t o = static_cast<size_t>(((b * T + t) * H + h) * D);
            double ang =
                static_cast<double>(t) * std::pow(theta, -2.0 * static_cast<double>(i) / D);
            double x0 = xv[o + static_cast<size_t>(i)], x1 = xv[o + static_cast<size_t>(i + D / 2)];
            want[o + static_cast<size_t>(i)] = x0 * std::cos(ang) - x1 * std::sin(ang);
            want[o + static_cast<size_t>(i + D / 2)] = x1 * std::cos(ang) + x0 * std::sin(ang);
          }
    expect_close(n.read(y), want, kFwdTol, "rope");
    expect_close(n.read(back), xv, kFwdTol, "rope inverse round trip");
  });
  fwd("rope", "rope_relative_position", [](Net& n) {
    // The defining property: <rope(q)_t, rope(k)_s> depends only on t - s.
    const int64_t T = 6, D = 8;
    std::vector<float> q = n.random(D), k = n.random(D), qs, ks;
    for (int64_t t = 0; t < T; ++t) {
      qs.insert(qs.end(), q.begin(), q.end());
      ks.insert(ks.end(), k.begin(), k.end());
    }
    Var rq = n.keep(n.b.rope(n.param_values(Shape{1, T, 1, D}, qs), 1e4));
    Var rk = n.keep(n.b.rope(n.param_values(Shape{1, T, 1, D}, ks), 1e4));
    n.run();
    std::vector<float> a = n.read(rq), c = n.read(rk);
    auto dot = [&](int64_t t, int64_t s) {
      double d = 0;
      for (int64_t i = 0; i < D; ++i)
        d += a[static_cast<size_t>(t * D + i)] * c[static_cast<size_t>(s * D + i)];
      return d;
    };
    for (int64_t t = 1; t < T; ++t)
      for (int64_t s = 1; s <= t; ++s) EXPECT_NEAR(dot(t, s), dot(t - s, 0), 1e-5) << t << "," << s;
  });
  fwd("softmax", "softmax", [](Net& n) {
    Var x = n.param(Shape{2, 3, 5}, uniform(-3, 3));
    Var y = n.keep(n.b.softmax(x));
    Var e = n.b.exp(x);
    Var ref = n.keep(e / n.b.reduce_sum(e, {-1}, true));
    n.run();
    expect_close(n.read(y), n.read(ref), kFwdTol, "softmax vs exp/sum");
    // Large logits: the fused op must not overflow (max subtraction).
    Net big;
    Var xb = big.param_values(Shape{1, 3}, {1000.0f, 1001.0f, 999.0f});
    Var yb = big.keep(big.b.softmax(xb));
    big.run();
    double z = 1 + std::exp(1.0) + std::exp(-1.0);
    expect_close(big.read(yb), std::vector<double>{1 / z, std::exp(1.0) / z, std::exp(-1.0) / z},
                 kFwdTol, "softmax of large logits");
  });
  fwd("softmax_grad", "softmax_grad", [](Net& n) {
    Var y = n.param(Shape{2, 5}, uniform(0.05f, 0.5f)), dy = n.param(Shape{2, 5});
    Var dx = n.keep(n.b.softmax_grad(y, dy));
    n.run();
    std::vector<double> want;
    for (size_t r = 0; r < 2; ++r) {
      double dot = 0;
      for (size_t j = 0; j < 5; ++j) dot += n.host(y)[r * 5 + j] * n.host(dy)[r * 5 + j];
      for (size_t j = 0; j < 5; ++j)
        want.push_back(n.host(y)[r * 5 + j] * (n.host(dy)[r * 5 + j] - dot));
    }
    expect_close(n.read(dx), want, kFwdTol, "softmax_grad");
  });
  fwd("causal_mask", "causal_mask", [](Net& n) {
    Var x = n.param(Shape{2, 3, 4, 4});
    Var y = n.keep(n.b.causal_mask(x, -7.0));
    n.run();
    std::vector<double> want;
    for (int64_t i = 0; i < x.shape().numel(); ++i) {
      std::vector<int64_t> c = unravel(i, x.shape());
      want.push_back(c[3] > c[2] ? -7.0 : n.host(x)[static_cast<size_t>(i)]);
    }
    expect_close(n.read(y), want, 0.0, "causal_mask");
  });
  add_attention_entries(&e);
  fwd("cross_entropy", "cross_entropy", [](Net& n) {
    Builder& b = n.b;
    const int64_t N = 4, V = 5;
    Var logits = n.param(Shape{N, V}, uniform(-3, 3));
    std::vector<int32_t> t = {4, 0, 2, 4};
    Var targets = n.ids(Shape{N}, t);
    std::vector<Var> ce = b.cross_entropy(logits, targets);
    n.keep(ce[0]);
    n.keep(ce[1]);
    std::vector<float> onehot(static_cast<size_t>(N * V), 0.0f);
    for (int64_t i = 0; i < N; ++i)
      onehot[static_cast<size_t>(i * V + t[static_cast<size_t>(i)])] = 1;
    Var lse = n.keep(b.log(b.reduce_sum(b.exp(logits), {-1})));
    Var picked = b.reduce_sum(logits * n.finput(Shape{N, V}, onehot), {-1});
    Var loss = n.keep(b.scale(b.reduce_sum(lse - picked, {0}), 1.0 / N));
    n.run();
    EXPECT_EQ(ce[0].shape(), Shape{});
    expect_close(n.read(ce[0]), n.read(loss), kFwdTol, "cross_entropy loss");
    expect_close(n.read(ce[1]), n.read(lse), kFwdTol, "cross_entropy lse");
  });

  // Vocab-parallel ops: over the blocks of a 3-way split vocabulary, their sum (or
  // concatenation) is the whole-vocabulary op.
  fwd("logsumexp", "logsumexp", [](Net& n) {
    Builder& b = n.b;
    Var x = n.param(Shape{2, 3, 5}, uniform(-3, 3));
    Var y = n.keep(b.apply1(OpKind::logsumexp, {}, {x}));
    Var want = n.keep(b.log(b.reduce_sum(b.exp(x), {-1})));
    n.run();
    EXPECT_EQ(y.shape(), (Shape{2, 3}));
    expect_close(n.read(y), n.read(want), kFwdTol, "logsumexp");
  });
  const int64_t kBlocks = 3, kRows = 3;  // a vocabulary of 9 in 3 blocks
  auto blocks = [=](Net& n, Var whole, int axis, const std::function<Var(Var, Var)>& op) {
    std::vector<Var> out;
    for (int32_t s = 0; s < kBlocks; ++s)
      out.push_back(op(n.b.slice(whole, axis, s * kRows, (s + 1) * kRows), n.ids(Shape{}, {s})));
    return out;
  };
  // 5 classes padded to 9 columns: block 1 holds 2 classes, block 2 none (-inf).
  fwd("vocab_logsumexp", "vocab_logsumexp_padded", [=](Net& n) {
    const int64_t N = 4, classes = 5;
    Var logits = n.param(Shape{N, kBlocks * kRows}, uniform(-3, 3));
    const CrossEntropyAttrs a{.classes = classes};
    std::vector<Var> parts = blocks(n, logits, 1, [&](Var l, Var s) {
      return n.b.reshape(n.b.op<OpKind::vocab_logsumexp>({l, s}, a)[0], Shape{N, 1});
    });
    Var lse = n.keep(n.b.apply1(OpKind::logsumexp, {}, {n.b.concat(parts, 1)}));
    Var want = n.keep(n.b.apply1(OpKind::logsumexp, {}, {n.b.slice(logits, 1, 0, classes)}));
    Var third = n.keep(parts[2]);
    n.run();
    expect_close(n.read(lse), n.read(want), kFwdTol, "vocab_logsumexp blocks combined");
    for (float x : n.read(third)) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
  });
  fwd("vocab_embedding", "vocab_embedding", [=](Net& n) {
    Var table = n.param(Shape{kBlocks * kRows, 4});
    Var ids = n.ids(Shape{2, 3}, {6, 0, 3, 5, 8, 6});
    std::vector<Var> parts = blocks(n, table, 0, [&](Var t, Var s) {
      return n.b.apply1(OpKind::vocab_embedding, {}, {t, ids, s});
    });
    Var sum = n.keep(parts[0] + parts[1] + parts[2]);
    Var want = n.keep(n.b.embedding(table, ids));
    n.run();
    expect_close(n.read(sum), n.read(want), 0.0, "sum of vocab_embedding blocks");
  });
  fwd("vocab_embedding_grad", "vocab_embedding_grad", [=](Net& n) {
    Var dy = n.param(Shape{2, 3, 4});
    Var ids = n.ids(Shape{2, 3}, {5, 0, 3, 3, 8, 3});
    std::vector<Var> parts;
    for (int32_t s = 0; s < kBlocks; ++s)
      parts.push_back(
          n.b.op<OpKind::vocab_embedding_grad>({dy, ids, n.ids(Shape{}, {s})}, {.rows = kRows})[0]);
    Var cat = n.keep(n.b.concat(parts, 0));
    Var want = n.keep(n.b.embedding_grad(dy, ids, kBlocks * kRows));
    n.run();
    expect_close(n.read(cat), n.read(want), 0.0, "vocab_embedding_grad blocks");
  });
  // shard_slice: the blocks of either axis, concatenated, are the tensor.
  for (int64_t axis : {0, 1}) {
    fwd("shard_slice", axis == 0 ? "shard_slice_0" : "shard_slice_1", [=](Net& n) {
      Var x = n.param(Shape{6, 9, 2});
      std::vector<Var> parts;
      for (int32_t s = 0; s < 3; ++s)
        parts.push_back(
            n.b.op<OpKind::shard_slice>({x, n.ids(Shape{}, {s})}, {.axis = axis, .blocks = 3})[0]);
      Var cat = n.keep(n.b.concat(parts, static_cast<int>(axis)));
      n.run();
      expect_close(n.read(cat), n.host(x), 0.0, "shard_slice blocks");
    });
  }
  fwd("vocab_pick", "vocab_pick", [=](Net& n) {
    const int64_t N = 4;
    Var logits = n.param(Shape{N, kBlocks * kRows}, uniform(-3, 3));
    std::vector<int32_t> t = {8, 0, 4, 2};
    Var targets = n.ids(Shape{N}, t);
    std::vector<Var> parts = blocks(n, logits, 1, [&](Var l, Var s) {
      return n.b.apply1(OpKind::vocab_pick, {}, {l, targets, s});
    });
    Var sum = n.keep(parts[0] + parts[1] + parts[2]);
    n.run();
    std::vector<double> want;
    for (int64_t i = 0; i < N; ++i)
      want.push_back(n.host(logits)[static_cast<size_t>(i * kBlocks * kRows + t[i])]);
    expect_close(n.read(sum), want, 0.0, "sum of vocab_pick blocks");
  });
  // The blocks' gradients concatenated equal the whole-vocabulary gradient; with `classes` <
  // 9, the padding columns' are 0.
  auto ce_grad_blocks = [=](Net& n, int64_t classes) {
    const int64_t N = 4, V = kBlocks * kRows;
    Var logits = n.param(Shape{N, V}, uniform(-3, 3));
    Var targets = n.ids(Shape{N}, {static_cast<int32_t>(classes - 1), 0, 3, 2});
    Var dloss = n.param(Shape{});
    Var lse = n.b.cross_entropy(logits, targets, classes)[1];
    // The mean over a batch split in two.
    const CrossEntropyAttrs a{.classes = classes == V ? 0 : classes, .rows = 2 * N};
    std::vector<Var> parts = blocks(n, logits, 1, [&](Var l, Var s) {
      return n.b.op<OpKind::vocab_cross_entropy_grad>({l, targets, lse, dloss, s}, a)[0];
    });
    Var cat = n.keep(n.b.concat(parts, 1));
    Var want = n.keep(n.b.apply1(OpKind::cross_entropy_grad, a, {logits, targets, lse, dloss}));
    n.run();
    expect_close(n.read(cat), n.read(want), 0.0, "vocab_cross_entropy_grad blocks");
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = classes; j < V; ++j)
        EXPECT_EQ(n.read(cat)[static_cast<size_t>(i * V + j)], 0.0) << "padding column " << j;
  };
  fwd("vocab_cross_entropy_grad", "vocab_cross_entropy_grad",
      [=](Net& n) { ce_grad_blocks(n, kBlocks * kRows); });
  fwd("vocab_cross_entropy_grad", "vocab_cross_entropy_grad_padded",
      [=](Net& n) { ce_grad_blocks(n, 5); });

  add_moe_entries(&e);
  add_fused_entries(&e);
  add_gradient_entries(&e);
  return e;
}

const std::vector<Entry>& entries() {
  static const std::vector<Entry> e = build_entries();
  return e;
}

// ---- tests ---------------------------------------------------------------------------------

class OpConsistency : public testing::TestWithParam<size_t> {};

TEST_P(OpConsistency, Check) {
  const Entry& en = entries()[GetParam()];
  OpKind k;
  ASSERT_TRUE(op_from_name(en.op, &k)) << en.op;
  Net n;
  if (en.check == Check::grad) {
    ASSERT_NE(op_def(k).vjp, nullptr) << en.op << " has no VJP";
    Var out = en.grad(n);
    ASSERT_TRUE(has_op(n.g, k)) << "entry does not use " << en.op;
    grad_check(n, out, en.eps, en.rtol);
    // The backward-only ops this forward op covers must appear in its backward graph.
    for (OpKind bk : all_ops()) {
      const char* of = op_def(bk).gradient_of;
      if (of != nullptr && en.op == of) {
        EXPECT_TRUE(has_op(n.g, bk)) << op_name(bk) << " is not used by the gradient of " << en.op;
      }
    }
  } else {
    en.forward(n);
    EXPECT_TRUE(has_op(n.g, k)) << "entry does not use " << en.op;
  }
}

std::string label_of(const testing::TestParamInfo<size_t>& info) {
  const Entry& en = entries()[info.param];
  return std::string(en.check == Check::grad     ? "grad_"
                     : en.check == Check::source ? "source_"
                                                 : "fwd_") +
         en.label;
}

size_t num_entries() { return entries().size(); }
INSTANTIATE_TEST_SUITE_P(Ops, OpConsistency, testing::Range<size_t>(0, num_entries()), label_of);

TEST(OpConsistencyCoverage, EveryOpHasAnEntry) {
  std::map<std::string, int> fwd, grad, source;
  std::set<std::string> labels;
  for (const Entry& en : entries()) {
    OpKind k;
    EXPECT_TRUE(op_from_name(en.op, &k)) << "entry for unknown op " << en.op;
    EXPECT_TRUE(labels.insert(en.label + std::to_string(static_cast<int>(en.check))).second)
        << "duplicate label " << en.label;
    (en.check == Check::forward ? fwd : en.check == Check::grad ? grad : source)[en.op]++;
  }
  std::string table = "op                        forward  grad  covered-by\n";
  std::vector<std::string> missing;
  for (OpKind k : all_ops()) {
    const OpDef& d = op_def(k);
    std::string name = d.name;
    std::string covered;
    if (source.count(name)) covered = "source";
    // Collectives run on a Communicator, not a Backend: their numerics are checked by
    // tests/comm and, inside training steps, by tests/runtime/step_runner_test.cc
    // (axis_index, the rank's coordinate, too).
    const bool collective = is_collective(k) || k == OpKind::axis_index;
    if (collective) covered = "comm + distributed tests";
    if (d.gradient_of != nullptr) {
      covered = std::string("grad of ") + d.gradient_of;
      if (!grad.count(d.gradient_of)) covered += " (MISSING)";
    }
    if (d.vjp != nullptr && !grad.count(name))
      missing.push_back(name + " (differentiable, no grad entry)");
    bool ok = collective || fwd.count(name) || source.count(name) ||
              (d.gradient_of != nullptr && grad.count(d.gradient_of));
    if (!ok) missing.push_back(name);
    char line[160];
    std::snprintf(line, sizeof line, "%-25s %-8s %-5s %s\n", d.name,
                  fwd.count(name) ? std::to_string(fwd[name]).c_str() : "-",
                  grad.count(name) ? std::to_string(grad[name]).c_str() : (d.vjp ? "MISS" : "n/a"),
                  covered.c_str());
    table += line;
  }
  std::printf("%s", table.c_str());
  std::string m;
  for (const std::string& s : missing) m += " " + s;
  EXPECT_TRUE(missing.empty()) << "ops without an entry:" << m;
}

// bf16/f16 storage: kernels compute in f32 around each op, so results match the f32 graph on the
// same (rounded) inputs within the storage precision.
TEST(OpConsistencyLowPrecision, MatmulAndGeluInBf16AndF16) {
  for (DType dt : {DType::bf16, DType::f16}) {
    Net n;
    Var a = n.param(Shape{2, 3, 8}, {}, dt), w = n.param(Shape{5, 8}, {}, dt);
    Var y = n.keep(n.b.gelu(n.b.matmul(a, w, false, true)));
    Var y32 =
        n.keep(n.b.gelu(n.b.matmul(n.b.cast(a, DType::f32), n.b.cast(w, DType::f32), false, true)));
    EXPECT_EQ(y.dtype(), dt);
    n.run();
    // f32 reference on the stored (already rounded) inputs.
    std::vector<double> mm = ref_matmul(n.host(a), a.shape(), n.host(w), w.shape(), false, true);
    for (double& v : mm) v = gelu_ref(v);
    expect_close(n.read(y32), mm, 1e-5, "f32 compute on rounded inputs");
    double tol = dt == DType::bf16 ? 0x1p-8 : 0x1p-11;  // unit roundoff
    // Two roundings to the storage type: the matmul output (gelu' <= 1.13) and the gelu output.
    std::vector<double> pre = ref_matmul(n.host(a), a.shape(), n.host(w), w.shape(), false, true);
    std::vector<float> got = n.read(y);
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], mm[i], tol * (1.13 * std::fabs(pre[i]) + std::fabs(mm[i])) + 1e-6)
          << dtype_name(dt) << " element " << i;
  }
}

// fill with an i32 dtype is accepted by inference (infer_source takes any dtype), so it must
// produce integers.
TEST(OpConsistencyBugs, FillI32ProducesIntegers) {
  Net n;
  Var f = n.keep(n.b.fill(Shape{3}, 7.0, DType::i32));
  n.run();
  const int32_t* v = n.ex().data<int32_t>(f.id);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(v[i], 7) << "element " << i;
}

}  // namespace
}  // namespace tessera
