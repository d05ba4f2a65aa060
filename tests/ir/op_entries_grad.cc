// Gradient entries of the op-consistency table: every op with a VJP, its float inputs made
// parameters, checked against central finite differences (op_consistency_test.cc runs them).
#include "op_entries.h"

namespace tessera::op_test {

void add_gradient_entries(std::vector<Entry>* e) {
  auto grad = [&](const char* op, const char* label, std::function<Var(Net&)> f,
                  double eps = 1e-2) {
    e->push_back(Entry{op, Check::grad, label, nullptr, std::move(f), eps});
  };
  grad("add", "add_bcast", [](Net& n) { return n.param({2, 3, 4}) + n.param({4}); });
  grad("add", "add_bcast_both", [](Net& n) { return n.param({2, 1, 4}) + n.param({3, 1}); });
  grad("sub", "sub_bcast_left", [](Net& n) { return n.param({4}) - n.param({2, 3, 4}); });
  grad("mul", "mul_bcast_both", [](Net& n) { return n.param({2, 1, 4}) * n.param({3, 1}); });
  grad("div", "div_bcast", [](Net& n) {
    return n.param({2, 3, 4}) / n.param({3, 1}, magnitude(0.5f, 2));
  });
  grad("div", "div_bcast_left", [](Net& n) {
    return n.param({4}) / n.param({2, 3, 4}, magnitude(0.5f, 2));
  });
  grad("scale", "scale", [](Net& n) { return n.b.scale(n.param({2, 3}), -1.7); });
  grad("add_scalar", "add_scalar", [](Net& n) { return n.b.add_scalar(n.param({2, 3}), 0.3); });
  grad("exp", "exp", [](Net& n) { return n.b.exp(n.param({2, 3})); });
  grad("log", "log", [](Net& n) { return n.b.log(n.param({2, 3}, uniform(0.5f, 2))); });
  grad("sqrt", "sqrt", [](Net& n) { return n.b.sqrt(n.param({2, 3}, uniform(0.5f, 2))); });
  grad("rsqrt", "rsqrt", [](Net& n) { return n.b.rsqrt(n.param({2, 3}, uniform(0.5f, 2))); });
  grad("tanh", "tanh", [](Net& n) { return n.b.tanh(n.param({2, 3})); });
  grad("gelu", "gelu", [](Net& n) { return n.b.gelu(n.param({2, 3, 4}, uniform(-3, 3))); });
  grad("silu", "silu", [](Net& n) { return n.b.silu(n.param({2, 3, 4}, uniform(-3, 3))); });
  // Inputs away from relu's kink at 0, where central differences are not the derivative.
  grad("relu", "relu", [](Net& n) { return n.b.relu(n.param({2, 3, 4}, magnitude(0.1f, 2))); });
  grad("swiglu", "swiglu", [](Net& n) {
    return n.b.swiglu(n.param({2, 3, 4}, uniform(-3, 3)), n.param({2, 3, 4}));
  });
  grad("reduce_sum", "reduce_sum_keep", [](Net& n) {
    return n.b.reduce_sum(n.param({2, 3, 4}), {0, 2}, true);
  });
  grad("reduce_sum", "reduce_sum_nokeep_neg", [](Net& n) {
    return n.b.reduce_sum(n.param({2, 3, 4}), {-2}, false);
  });
  grad("sum_to", "sum_to", [](Net& n) { return n.b.sum_to(n.param({2, 3, 4}), Shape{3, 1}); });
  grad("broadcast_to", "broadcast_to", [](Net& n) {
    return n.b.broadcast_to(n.param({3, 1}), Shape{2, 3, 4});
  });
  grad("reshape", "reshape", [](Net& n) { return n.b.reshape(n.param({2, 3, 4}), Shape{4, 6}); });
  grad("transpose", "transpose_3d", [](Net& n) {
    return n.b.transpose(n.param({2, 3, 4}), {2, 0, 1});
  });
  grad("transpose", "transpose_4d", [](Net& n) {
    return n.b.transpose(n.param({2, 3, 2, 3}), {3, 1, 0, 2});
  });
  grad("slice", "slice_mid", [](Net& n) { return n.b.slice(n.param({2, 5, 3}), 1, 1, 4); });
  grad("slice", "slice_prefix", [](Net& n) { return n.b.slice(n.param({2, 5, 3}), 1, 0, 2); });
  grad("concat", "concat_mid", [](Net& n) {
    return n.b.concat({n.param({2, 1, 3}), n.param({2, 2, 3}), n.param({2, 3, 3})}, 1);
  });
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      static const char* names[2][2] = {{"matmul_nn", "matmul_nt"}, {"matmul_tn", "matmul_tt"}};
      grad("matmul", names[ta][tb], [ta, tb](Net& n) {
        return n.b.matmul(n.param(ta ? Shape{4, 3} : Shape{3, 4}),
                          n.param(tb ? Shape{5, 4} : Shape{4, 5}), ta, tb);
      });
      static const char* bnames[2][2] = {{"matmul_batched_nn", "matmul_batched_nt"},
                                         {"matmul_batched_tn", "matmul_batched_tt"}};
      grad("matmul", bnames[ta][tb], [ta, tb](Net& n) {
        return n.b.matmul(n.param(ta ? Shape{2, 4, 3} : Shape{2, 3, 4}),
                          n.param(tb ? Shape{2, 5, 4} : Shape{2, 4, 5}), ta, tb);
      });
    }
  grad("matmul", "matmul_shared_rhs", [](Net& n) {
    return n.b.matmul(n.param({2, 3, 4}), n.param({4, 5}));
  });
  grad("matmul", "matmul_shared_rhs_t", [](Net& n) {
    return n.b.matmul(n.param({2, 3, 4}), n.param({5, 4}), false, true);
  });
  grad("embedding", "embedding", [](Net& n) {
    return n.b.embedding(n.param({6, 4}), n.ids(Shape{2, 3}, {5, 0, 3, 3, 1, 3}));
  });
  grad("layernorm", "layernorm", [](Net& n) {
    return n.b.layernorm(n.param({2, 3, 5}, uniform(-2, 2)), n.param({5}), n.param({5}), 1e-5)[0];
  });
  grad("rmsnorm", "rmsnorm", [](Net& n) {
    return n.b.rmsnorm(n.param({2, 3, 4}, uniform(-2, 2)), n.param({4}), 1e-5)[0];
  });
  grad("rope", "rope", [](Net& n) { return n.b.rope(n.param({1, 3, 2, 4}), 100.0); });
  grad("softmax", "softmax", [](Net& n) {
    return n.b.softmax(n.param({2, 3, 5}, uniform(-2, 2)));
  });
  grad("causal_mask", "causal_mask", [](Net& n) {
    return n.b.causal_mask(n.param({2, 3, 3}), -2.0);
  });
  grad("attention", "attention_mha", [](Net& n) {
    return n.b.attention(n.param({1, 2, 3, 4}), n.param({1, 2, 3, 4}), n.param({1, 2, 3, 4}),
                         0.5)[0];
  });
  grad("attention", "attention_bidirectional", [](Net& n) {
    return n.b.attention(n.param({1, 2, 3, 4}), n.param({1, 2, 3, 4}), n.param({1, 2, 3, 4}), 0.5,
                         /*causal=*/false)[0];
  });
  grad("attention", "attention_gqa", [](Net& n) {
    return n.b.attention(n.param({2, 4, 3, 2}), n.param({2, 2, 3, 2}), n.param({2, 2, 3, 2}),
                         0.7)[0];
  });
  // T5: a score bias (its gradient summed over the batch), causal self-attention and
  // cross-attention with more keys than queries.
  grad("attention", "attention_biased_causal", [](Net& n) {
    return n.b.attention(n.param({2, 2, 3, 4}), n.param({2, 2, 3, 4}), n.param({2, 2, 3, 4}), 1.0,
                         /*causal=*/true, n.param({2, 3, 3}))[0];
  });
  grad("attention", "attention_cross_biased_gqa", [](Net& n) {
    return n.b.attention(n.param({2, 4, 2, 3}), n.param({2, 2, 5, 3}), n.param({2, 2, 5, 3}), 0.6,
                         /*causal=*/false, n.param({4, 2, 5}))[0];
  });
  grad("cross_entropy", "cross_entropy", [](Net& n) {
    return n.b.cross_entropy(n.param({4, 5}, uniform(-2, 2)), n.ids(Shape{4}, {4, 0, 2, 4}))[0];
  });
  // Two padding columns: no probability, no gradient (the finite differences of the padding
  // logits are 0).
  grad("cross_entropy", "cross_entropy_padded", [](Net& n) {
    return n.b.cross_entropy(n.param({4, 7}, uniform(-2, 2)), n.ids(Shape{4}, {4, 0, 2, 4}), 5)[0];
  });
  // Cast: inputs on a 1/64 grid in [-2, 2] and a step of 1/64 keep every perturbed value exact
  // in bf16 and f16, so the finite difference is exact.
  for (DType dt : {DType::bf16, DType::f16}) {
    grad(
        "cast", dt == DType::bf16 ? "cast_bf16" : "cast_f16",
        [dt](Net& n) {
          std::vector<float> v = n.random(6, uniform(-2, 2));
          for (float& x : v) x = std::round(x * 64) / 64;
          return n.b.cast(n.b.cast(n.param_values(Shape{2, 3}, v), dt), DType::f32);
        },
        1.0 / 64);
  }
}

}  // namespace tessera::op_test
