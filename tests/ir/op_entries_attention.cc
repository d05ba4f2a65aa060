// Attention entries of the op-consistency table: the fused attention op against its
// decomposition into primitive ops in the same graph (causal, grouped-query, cross-attention with
// a score bias) and T5's relative position buckets against Hugging Face's values
// (op_consistency_test.cc runs them).
#include <cmath>
#include <functional>
#include <vector>

#include "ir/builder.h"
#include "op_entries.h"

namespace tessera::op_test {
namespace {

// Attention against matmul / scale / causal_mask / softmax / matmul in the same graph; k and v
// heads are repeated for grouped-query attention.
void attention_fwd(Net& n, int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t D) {
  Builder& b = n.b;
  Var q = n.param(Shape{B, H, T, D}), k = n.param(Shape{B, Hkv, T, D}),
      v = n.param(Shape{B, Hkv, T, D});
  double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<Var> att = b.attention(q, k, v, scale);
  n.keep(att[0]);
  n.keep(att[1]);
  auto repeat = [&](Var x) {
    int64_t G = H / Hkv;
    Var e = b.broadcast_to(b.reshape(x, Shape{B, Hkv, 1, T, D}), Shape{B, Hkv, G, T, D});
    return b.reshape(e, Shape{B, H, T, D});
  };
  Var kr = repeat(k), vr = repeat(v);
  Var scores = b.causal_mask(b.scale(b.matmul(q, kr, false, true), scale), -1e9);
  Var ref_out = n.keep(b.matmul(b.softmax(scores), vr));
  Var ref_lse = n.keep(b.log(b.reduce_sum(b.exp(scores), {-1})));
  n.run();
  expect_close(n.read(att[0]), n.read(ref_out), kFwdTol, "attention out");
  expect_close(n.read(att[1]), n.read(ref_lse), kFwdTol, "attention lse");
  // Causality, independently of the decomposition: row 0 attends only to key 0.
  std::vector<float> out = n.read(att[0]);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t d = 0; d < D; ++d)
      EXPECT_NEAR(out[static_cast<size_t>(h * T * D + d)],
                  n.host(v)[static_cast<size_t>((h / (H / Hkv)) * T * D + d)], 1e-6);
}

// Bidirectional attention with Tq != Tk and a score bias [H, Tq, Tk] (T5's cross-attention has
// no bias, its self-attention one) against matmul / scale / add / softmax / matmul.
void attention_biased_fwd(Net& n, int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D) {
  Builder& b = n.b;
  Var q = n.param(Shape{B, H, Tq, D}), k = n.param(Shape{B, H, Tk, D}),
      v = n.param(Shape{B, H, Tk, D}), bias = n.param(Shape{H, Tq, Tk});
  const double scale = 0.8;
  std::vector<Var> att = b.attention(q, k, v, scale, /*causal=*/false, bias);
  n.keep(att[0]);
  n.keep(att[1]);
  Var scores = b.scale(b.matmul(q, k, false, true), scale) + bias;
  Var ref_out = n.keep(b.matmul(b.softmax(scores), v));
  Var ref_lse = n.keep(b.log(b.reduce_sum(b.exp(scores), {-1})));
  n.run();
  expect_close(n.read(att[0]), n.read(ref_out), kFwdTol, "biased attention out");
  expect_close(n.read(att[1]), n.read(ref_lse), kFwdTol, "biased attention lse");
}

// Ring attention's pieces (context parallelism, parallel/partition_context.cc): the queries of
// chunk r of a sequence cut into n = 2 chunks (contiguous, or zigzag: chunk r holds halves r and
// 3 - r) attend to each key chunk j alone (a key block); attention_merge of the two results is
// attention over the whole sequence, and the gradients of the two steps, taken with the whole
// attention's out and lse, sum to its dq and are its dk and dv of chunk j. Causal, grouped
// query heads; chunks of C rows (over the kernel's 64-row blocks, a block spans both zigzag
// halves: some of its rows see keys of a chunk, some none).
void ring_attention_fwd(Net& n, int64_t r, int64_t zigzag, int64_t C = 6) {
  Builder& b = n.b;
  const int64_t B = 1, H = 2, Hkv = 1, D = 4, half = C / 2;
  Var q = n.param(Shape{B, H, C, D});
  Var k0 = n.param(Shape{B, Hkv, C, D}), k1 = n.param(Shape{B, Hkv, C, D});
  Var v0 = n.param(Shape{B, Hkv, C, D}), v1 = n.param(Shape{B, Hkv, C, D});
  Var dout = n.param(Shape{B, H, C, D});
  // The whole sequence in order from the two chunks.
  auto whole = [&](Var c0, Var c1) {
    if (zigzag == 0) return b.concat({c0, c1}, 2);
    auto h = [&](Var c, int64_t i) { return b.slice(c, 2, i * half, (i + 1) * half); };
    return b.concat({h(c0, 0), h(c1, 0), h(c1, 1), h(c0, 1)}, 2);  // halves 0, 1, 2, 3
  };
  Var kw = whole(k0, k1), vw = whole(v0, v1);
  const AttentionAttrs at{.scale = 0.5, .causal = true, .zigzag = zigzag};
  Var block = n.ids(Shape{}, {static_cast<int32_t>(r)});
  std::vector<Var> ref = b.op<OpKind::attention>({q, kw, vw, block}, at);
  std::vector<Var> ref_grad =
      b.op<OpKind::attention_grad>({q, kw, vw, ref[0], ref[1], dout, block}, at);
  std::vector<Var> parts[2], grads[2];
  for (int64_t j = 0; j < 2; ++j) {
    Var kb = n.ids(Shape{}, {static_cast<int32_t>(j)});
    Var kj = j == 0 ? k0 : k1, vj = j == 0 ? v0 : v1;
    parts[j] = b.op<OpKind::attention>({q, kj, vj, block, kb}, at);
    grads[j] = b.op<OpKind::attention_grad>({q, kj, vj, ref[0], ref[1], dout, block, kb}, at);
  }
  std::vector<Var> merged =
      b.op<OpKind::attention_merge>({parts[0][0], parts[0][1], parts[1][0], parts[1][1]});
  Var dq = n.keep(b.add(grads[0][0], grads[1][0]));
  Var dk = n.keep(whole(grads[0][1], grads[1][1])), dv = n.keep(whole(grads[0][2], grads[1][2]));
  for (Var x : {merged[0], merged[1], ref[0], ref[1], ref_grad[0], ref_grad[1], ref_grad[2]})
    n.keep(x);
  n.run();
  expect_close(n.read(merged[0]), n.read(ref[0]), kFwdTol, "ring attention out");
  expect_close(n.read(merged[1]), n.read(ref[1]), kFwdTol, "ring attention lse");
  expect_close(n.read(dq), n.read(ref_grad[0]), kFwdTol, "ring attention dq");
  expect_close(n.read(dk), n.read(ref_grad[1]), kFwdTol, "ring attention dk");
  expect_close(n.read(dv), n.read(ref_grad[2]), kFwdTol, "ring attention dv");
}

}  // namespace

void add_attention_entries(std::vector<Entry>* entries) {
  std::vector<Entry>& e = *entries;
  auto fwd = [&](const char* op, const char* label, std::function<void(Net&)> f) {
    e.push_back(Entry{op, Check::forward, label, std::move(f), nullptr});
  };
  fwd("attention", "attention_mha", [](Net& n) { attention_fwd(n, 2, 2, 2, 5, 4); });
  fwd("attention", "attention_gqa", [](Net& n) { attention_fwd(n, 2, 4, 2, 5, 4); });
  fwd("attention", "attention_mqa", [](Net& n) { attention_fwd(n, 1, 3, 1, 4, 2); });
  fwd("attention", "attention_cross_biased",
      [](Net& n) { attention_biased_fwd(n, 2, 3, 4, 7, 5); });
  fwd("attention", "attention_long_cross_biased",  // more than one 64-row query block
      [](Net& n) { attention_biased_fwd(n, 1, 2, 70, 9, 4); });
  fwd("attention_merge", "ring_attention_chunk0", [](Net& n) { ring_attention_fwd(n, 0, 0); });
  fwd("attention_merge", "ring_attention_chunk1", [](Net& n) { ring_attention_fwd(n, 1, 0); });
  fwd("attention_merge", "ring_attention_zigzag_chunk0",
      [](Net& n) { ring_attention_fwd(n, 0, 2); });
  fwd("attention_merge", "ring_attention_zigzag_chunk1",
      [](Net& n) { ring_attention_fwd(n, 1, 2); });
  fwd("attention_merge", "ring_attention_zigzag_long_chunk0",
      [](Net& n) { ring_attention_fwd(n, 0, 2, 130); });
  fwd("attention_merge", "ring_attention_zigzag_long_chunk1",
      [](Net& n) { ring_attention_fwd(n, 1, 2, 130); });
  fwd("attention_merge", "ring_attention_long_chunk1",
      [](Net& n) { ring_attention_fwd(n, 1, 0, 130); });
  // Values of Hugging Face's T5Attention._relative_position_bucket.
  e.push_back(Entry{"position_buckets", Check::source, "position_buckets_t5",
                    [](Net& n) {
                      Var bi = n.keep(n.b.position_buckets(1, 400, true, 32, 128));
                      Var uni = n.keep(n.b.position_buckets(400, 1, false, 32, 128));
                      n.run();
                      const int32_t* x = n.ex().data<int32_t>(bi.id);  // key j - query 0
                      EXPECT_EQ(x[0], 0);
                      EXPECT_EQ(x[1], 17);
                      EXPECT_EQ(x[7], 23);
                      EXPECT_EQ(x[8], 24);  // first logarithmic bucket
                      EXPECT_EQ(x[20], 16 + 8 + 2);
                      EXPECT_EQ(x[127], 31);
                      EXPECT_EQ(x[399], 31);
                      const int32_t* y = n.ex().data<int32_t>(uni.id);  // query i - key 0
                      EXPECT_EQ(y[5], 5);
                      EXPECT_EQ(y[15], 15);
                      EXPECT_EQ(y[20], 17);
                      EXPECT_EQ(y[100], 30);
                      EXPECT_EQ(y[399], 31);
                    },
                    nullptr});
}

}  // namespace tessera::op_test
