// The op-consistency entries of the fused ops (ir/ops_fused.cc): each against the primitive
// ops it fuses (matmul, add, gelu, gelu_grad, sum_to, the norms and their gradients) in the same
// graph, the same f32 arithmetic to the bit.
#include "op_entries.h"

namespace tessera::op_test {

void add_fused_entries(std::vector<Entry>* entries) {
  std::vector<Entry>& e = *entries;
  auto fwd = [&](const char* op, const char* label, std::function<void(Net&)> f) {
    e.push_back(Entry{op, Check::forward, label, std::move(f), nullptr});
  };
  // A rank-3 left operand shares w.
  fwd("matmul_bias", "matmul_bias", [](Net& n) {
    Var x = n.param(Shape{2, 3, 4}), w = n.param(Shape{5, 4}), bias = n.param(Shape{5});
    Var y = n.keep(n.b.op<OpKind::matmul_bias>({x, w, bias}, {.transpose_b = true})[0]);
    Var want = n.keep(n.b.matmul(x, w, false, true) + bias);
    n.run();
    expect_close(n.read(y), n.read(want), 0.0, "matmul_bias");
  });
  fwd("matmul_bias_gelu", "matmul_bias_gelu", [](Net& n) {
    Var x = n.param(Shape{2, 3, 4}), w = n.param(Shape{4, 5}), bias = n.param(Shape{5});
    std::vector<Var> got = n.b.op<OpKind::matmul_bias_gelu>({x, w, bias}, {});
    Var y = n.keep(got[0]), pre = n.keep(got[1]);
    Var want_pre = n.keep(n.b.matmul(x, w) + bias);
    Var want = n.keep(n.b.gelu(want_pre));
    n.run();
    expect_close(n.read(pre), n.read(want_pre), 0.0, "matmul_bias_gelu pre");
    expect_close(n.read(y), n.read(want), 0.0, "matmul_bias_gelu");
  });
  fwd("matmul_dgelu_bgrad", "matmul_dgelu_bgrad", [](Net& n) {
    Var dy = n.param(Shape{2, 3, 4}), w = n.param(Shape{4, 5}), pre = n.param(Shape{2, 3, 5});
    std::vector<Var> got = n.b.op<OpKind::matmul_dgelu_bgrad>({dy, w, pre}, {});
    Var d = n.keep(got[0]), db = n.keep(got[1]);
    Var want_d = n.keep(n.b.gelu_grad(pre, n.b.matmul(dy, w)));
    Var want_db = n.keep(n.b.sum_to(want_d, Shape{5}));
    n.run();
    expect_close(n.read(d), n.read(want_d), 0.0, "matmul_dgelu_bgrad d");
    expect_close(n.read(db), n.read(want_db), 0.0, "matmul_dgelu_bgrad db");
  });
  fwd("matmul_bgrad", "matmul_bgrad", [](Net& n) {
    Var dy = n.param(Shape{2, 3, 5}), x = n.param(Shape{2, 3, 4});
    std::vector<Var> got =
        n.b.op<OpKind::matmul_bgrad>({dy, x}, {.transpose_a = true, .fold_batch = true});
    Var dw = n.keep(got[0]), db = n.keep(got[1]);
    Var want_dw = n.keep(n.b.matmul_folded(dy, x));
    Var want_db = n.keep(n.b.sum_to(dy, Shape{5}));
    n.run();
    expect_close(n.read(dw), n.read(want_dw), 0.0, "matmul_bgrad dw");
    expect_close(n.read(db), n.read(want_db), 0.0, "matmul_bgrad db");
  });
  fwd("add_layernorm", "add_layernorm", [](Net& n) {
    Var x = n.param(Shape{2, 3, 8}), y = n.param(Shape{2, 3, 8});
    Var w = n.param(Shape{8}), b = n.param(Shape{8});
    std::vector<Var> got = n.b.op<OpKind::add_layernorm>({x, y, w, b}, {.eps = 1e-5});
    Var sum = n.keep(x + y);
    std::vector<Var> want = n.b.layernorm(sum, w, b, 1e-5);
    for (int i = 0; i < 4; ++i) n.keep(got[static_cast<size_t>(i)]);
    for (Var v : want) n.keep(v);
    n.run();
    expect_close(n.read(got[0]), n.read(sum), 0.0, "add_layernorm sum");
    for (int i = 0; i < 3; ++i)
      expect_close(n.read(got[static_cast<size_t>(i + 1)]), n.read(want[static_cast<size_t>(i)]),
                   0.0, "add_layernorm norm");
  });
  fwd("layernorm_grad_add", "layernorm_grad_add", [](Net& n) {
    Var dy = n.param(Shape{2, 3, 8}), x = n.param(Shape{2, 3, 8}), dres = n.param(Shape{2, 3, 8});
    Var w = n.param(Shape{8}), b = n.param(Shape{8});
    std::vector<Var> ln = n.b.layernorm(x, w, b, 1e-5);
    std::vector<Var> got =
        n.b.op<OpKind::layernorm_grad_add>({dy, x, w, ln[1], ln[2], dres}, NoAttrs{});
    std::vector<Var> want = n.b.layernorm_grad(dy, x, w, ln[1], ln[2]);
    Var want_dx = n.keep(dres + want[0]);
    for (Var v : got) n.keep(v);
    n.keep(want[1]);
    n.keep(want[2]);
    n.run();
    expect_close(n.read(got[0]), n.read(want_dx), 0.0, "layernorm_grad_add dx");
    expect_close(n.read(got[1]), n.read(want[1]), 0.0, "layernorm_grad_add dw");
    expect_close(n.read(got[2]), n.read(want[2]), 0.0, "layernorm_grad_add db");
  });
  fwd("add_rmsnorm", "add_rmsnorm", [](Net& n) {
    Var x = n.param(Shape{2, 3, 8}), y = n.param(Shape{2, 3, 8}), w = n.param(Shape{8});
    std::vector<Var> got = n.b.op<OpKind::add_rmsnorm>({x, y, w}, {.eps = 1e-5});
    Var sum = n.keep(x + y);
    std::vector<Var> want = n.b.op<OpKind::rmsnorm>({sum, w}, {.eps = 1e-5});
    for (Var v : got) n.keep(v);
    for (Var v : want) n.keep(v);
    n.run();
    expect_close(n.read(got[0]), n.read(sum), 0.0, "add_rmsnorm sum");
    for (int i = 0; i < 2; ++i)
      expect_close(n.read(got[static_cast<size_t>(i + 1)]), n.read(want[static_cast<size_t>(i)]),
                   0.0, "add_rmsnorm norm");
  });
  fwd("rmsnorm_grad_add", "rmsnorm_grad_add", [](Net& n) {
    Var dy = n.param(Shape{2, 3, 8}), x = n.param(Shape{2, 3, 8}), dres = n.param(Shape{2, 3, 8});
    Var w = n.param(Shape{8});
    std::vector<Var> rms = n.b.op<OpKind::rmsnorm>({x, w}, {.eps = 1e-5});
    std::vector<Var> got = n.b.op<OpKind::rmsnorm_grad_add>({dy, x, w, rms[1], dres}, NoAttrs{});
    std::vector<Var> want = n.b.op<OpKind::rmsnorm_grad>({dy, x, w, rms[1]}, NoAttrs{});
    Var want_dx = n.keep(dres + want[0]);
    for (Var v : got) n.keep(v);
    n.keep(want[1]);
    n.run();
    expect_close(n.read(got[0]), n.read(want_dx), 0.0, "rmsnorm_grad_add dx");
    expect_close(n.read(got[1]), n.read(want[1]), 0.0, "rmsnorm_grad_add dw");
  });
}

}  // namespace tessera::op_test
