#include "cost/op_cost.h"

#include <gtest/gtest.h>

#include <tuple>

#include "ir/builder.h"
#include "test_cluster.h"

namespace tessera {
namespace {

using testing::round_cluster;

TEST(GemmShapeEfficiency, WholeTilesLoseOnlyTheKTerm) {
  DeviceSpec d = round_cluster().device;
  d.sm_count = 0;
  EXPECT_NEAR(gemm_shape_efficiency(1024, 1024, 1024, d), 1024.0 / 1152.0, 1e-12);
}

TEST(GemmShapeEfficiency, PartialTilesAndLastWaveCost) {
  DeviceSpec d = round_cluster().device;
  d.sm_count = 0;
  // 129 rows need two 128-row tiles: half the second tile is wasted.
  EXPECT_NEAR(gemm_shape_efficiency(129, 128, 1e9, d), 129.0 / 256.0, 1e-6);
  d.sm_count = 100;
  // 101 tiles on 100 SMs run in two waves; the second is 1% busy.
  EXPECT_NEAR(gemm_shape_efficiency(128 * 101, 128, 1e9, d), 101.0 / 200.0, 1e-6);
}

struct OneOp {
  Graph g;
  NodeId node = -1;
};

OneOp matmul_graph(int64_t m, int64_t k, int64_t n) {
  OneOp o;
  Builder b(&o.g);
  Var x = b.input("x", Shape{m, k});
  Var w = b.parameter("w", Shape{k, n}, Init::zeros, 0);
  Var y = b.matmul(x, w);
  o.node = o.g.value(y.id).producer;
  return o;
}

TEST(OpTime, LargeMatmulIsComputeBoundAtShapeEfficiency) {
  ClusterSpec c = round_cluster();
  OneOp o = matmul_graph(4096, 4096, 4096);
  OpTime t = op_time(o.g, o.g.node(o.node), c.device, {}, DType::bf16);
  double flops = 2.0 * 4096 * 4096 * 4096;
  EXPECT_DOUBLE_EQ(t.flops, flops);
  EXPECT_EQ(t.bound, OpTime::compute);
  double eff = 0.8 * gemm_shape_efficiency(4096, 4096, 4096, c.device);
  EXPECT_NEAR(t.seconds, flops / (200e12 * eff) + 5e-6, 1e-12);
  // In f32 the same GEMM runs at the f32 peak: twice as long, give or take the launch.
  OpTime t32 = op_time(o.g, o.g.node(o.node), c.device, {}, DType::f32);
  EXPECT_NEAR(t32.seconds - 5e-6, 2 * (t.seconds - 5e-6), 1e-12);
}

// A bf16 GEMM with a dimension that is not a multiple of 8 runs at unaligned_gemm_efficiency
// of the aligned rate (GPT-2's 50,257-row LM head); f32 and aligned shapes keep theirs.
TEST(OpTime, UnalignedLowPrecisionGemmsRunAtTheUnalignedEfficiency) {
  ClusterSpec c = round_cluster();
  c.device.unaligned_gemm_efficiency = 0.25;
  auto compute_s = [&](int64_t m, int64_t k, int64_t n, DType dt) {
    OneOp o = matmul_graph(m, k, n);
    return op_time(o.g, o.g.node(o.node), c.device, {}, dt).seconds - 5e-6;
  };
  auto plain = [&](int64_t m, int64_t k, int64_t n, DType dt) {
    ClusterSpec aligned_only = c;
    aligned_only.device.unaligned_gemm_efficiency = 1;
    OneOp o = matmul_graph(m, k, n);
    return op_time(o.g, o.g.node(o.node), aligned_only.device, {}, dt).seconds - 5e-6;
  };
  for (auto [m, k, n] : {std::tuple{8192L, 768L, 50257L}, std::tuple{8192L, 50257L, 768L},
                         std::tuple{8193L, 768L, 768L}}) {
    EXPECT_NEAR(compute_s(m, k, n, DType::bf16), 4 * plain(m, k, n, DType::bf16), 1e-12) << n;
    EXPECT_NEAR(compute_s(m, k, n, DType::f32), plain(m, k, n, DType::f32), 1e-12) << n;
  }
  EXPECT_NEAR(compute_s(8192, 768, 50304, DType::bf16), plain(8192, 768, 50304, DType::bf16),
              1e-12);
}

// FP8 GEMMs (beside bf16): a transformer block's GEMM runs at the FP8 peak times
// fp8_gemm_efficiency and the shape factors, after a cast of its left operand (2 bytes read and
// 1 written per element, at memory bandwidth); a GEMM outside the blocks (the LM head) and a
// device without an FP8 peak keep the bf16 time.
TEST(OpTime, Fp8GemmsInTheBlocksRunAtTheFp8PeakAfterACast) {
  ClusterSpec c = round_cluster();
  c.device.peak_flops_fp8 = 400e12;
  c.device.fp8_gemm_efficiency = 0.5;
  const int64_t m = 4096, k = 4096, n = 4096;
  OneOp head = matmul_graph(m, k, n);
  OneOp block;
  {
    Builder b(&block.g);
    b.set_layer(0);
    Var x = b.input("x", Shape{m, k});
    Var w = b.parameter("w", Shape{k, n}, Init::zeros, 0);
    block.node = block.g.value(b.matmul(x, w).id).producer;
  }
  const OpTime bf = op_time(block.g, block.g.node(block.node), c.device, {}, DType::bf16);
  const OpTime f8 = op_time(block.g, block.g.node(block.node), c.device, {}, DType::bf16, true);
  const double flops = 2.0 * m * k * n, shape = gemm_shape_efficiency(m, n, k, c.device);
  const double cast = 3.0 * m * k / (2e12 * 0.5) + 5e-6;
  EXPECT_NEAR(f8.seconds, flops / (400e12 * 0.5 * shape) + cast + 5e-6, 1e-12);
  EXPECT_DOUBLE_EQ(f8.bytes, m * k + k * n + 2.0 * m * n + 3.0 * m * k);
  EXPECT_LT(f8.seconds, bf.seconds);
  EXPECT_DOUBLE_EQ(op_time(head.g, head.g.node(head.node), c.device, {}, DType::bf16, true).seconds,
                   op_time(head.g, head.g.node(head.node), c.device, {}, DType::bf16).seconds);
  c.device.peak_flops_fp8 = 0;
  EXPECT_DOUBLE_EQ(
      op_time(block.g, block.g.node(block.node), c.device, {}, DType::bf16, true).seconds,
      bf.seconds);
}

TEST(OpTime, ElementwiseIsMemoryBoundAndHalvesInBf16) {
  ClusterSpec c = round_cluster();
  Graph g;
  Builder b(&g);
  Var x = b.input("x", Shape{1024, 1024});
  Var y = b.gelu(x);
  const Node& n = g.node(g.value(y.id).producer);
  OpTime f32 = op_time(g, n, c.device, {}, DType::f32);
  OpTime bf = op_time(g, n, c.device, {}, DType::bf16);
  EXPECT_EQ(f32.bound, OpTime::memory);
  EXPECT_DOUBLE_EQ(f32.bytes, 2.0 * 4 * 1024 * 1024);  // read x, write y
  EXPECT_NEAR(f32.seconds, f32.bytes / (2e12 * 0.5) + 5e-6, 1e-15);
  EXPECT_DOUBLE_EQ(bf.bytes, f32.bytes / 2);
  // A measured efficiency for the op kind replaces memory_efficiency.
  OpTime tuned = op_time(g, n, c.device, {{"gelu", 0.25}}, DType::f32);
  EXPECT_NEAR(tuned.seconds, f32.bytes / (2e12 * 0.25) + 5e-6, 1e-15);
}

TEST(OpTime, ReshapeIsAViewUnlessMeasured) {
  ClusterSpec c = round_cluster();
  Graph g;
  Builder b(&g);
  Var x = b.input("x", Shape{64, 64});
  Var y = b.reshape(x, Shape{4096});
  const Node& n = g.node(g.value(y.id).producer);
  EXPECT_EQ(op_time(g, n, c.device, {}, DType::f32).seconds, 0.0);
  EXPECT_GT(op_time(g, n, c.device, {{"reshape", 0.5}}, DType::f32).seconds, 5e-6);
}

// Causal attention computes the unmasked part of its score matrix: half of a square; of a
// context-parallel chunk (Tq queries of Tk keys, a sequence block) the last chunk's, the
// slowest, 1 - Tq / 2Tk; of a zigzag order's chunk half. The FLOPs stay the full rectangle's.
TEST(OpTime, CausalAttentionTimesTheUnmaskedPartOfItsChunk) {
  const DeviceSpec dev = round_cluster().device;
  auto seconds = [&](int64_t tq, int64_t tk, bool block, int64_t zigzag) {
    Graph g;
    Builder b(&g);
    Var q = b.input("q", Shape{4, 16, tq, 128}, DType::bf16);
    Var k = b.input("k", Shape{4, 16, tk, 128}, DType::bf16);
    Var v = b.input("v", Shape{4, 16, tk, 128}, DType::bf16);
    std::vector<Var> in = {q, k, v};
    if (block) in.push_back(b.input("block", Shape{}, DType::i32));
    Var out = b.op<OpKind::attention>(in, {.scale = 0.1, .causal = true, .zigzag = zigzag})[0];
    const OpTime t = op_time(g, g.node(g.value(out.id).producer), dev, {}, DType::bf16);
    EXPECT_EQ(t.bound, OpTime::compute);
    return std::pair{t.seconds - dev.launch_overhead, t.flops};
  };
  const auto [whole, whole_flops] = seconds(8192, 8192, false, 0);
  const auto [last, chunk_flops] = seconds(2048, 8192, true, 0);
  const auto [zigzag, zigzag_flops] = seconds(2048, 8192, true, 4);
  EXPECT_DOUBLE_EQ(chunk_flops, whole_flops / 4);
  EXPECT_DOUBLE_EQ(zigzag_flops, chunk_flops);
  EXPECT_NEAR(last / whole, (1.0 - 2048.0 / (2 * 8192)) / 4 / 0.5, 1e-9);  // 7/8 of 1/4, vs 1/2
  EXPECT_NEAR(zigzag / whole, 0.25, 1e-9);
}

// A materialized attention (the frameworks before FlashAttention) is its kernels: with compute
// free, the forward moves q, k, the score matrix S (written), S twice more (softmax), and S, v
// and the output; the backward 7 S and four times q and k/v. It computes the whole rectangle,
// causal or not, where the fused kernel skips the masked half.
TEST(OpTime, MaterializedAttentionIsItsKernelsAroundTheScoreMatrix) {
  DeviceSpec dev = round_cluster().device;
  auto attention = [&](bool causal, AttentionKernel kernel, bool backward) {
    Graph g;
    Builder b(&g);
    Var q = b.input("q", Shape{2, 8, 1024, 64}, DType::bf16);
    Var k = b.input("k", Shape{2, 4, 1024, 64}, DType::bf16);
    Var v = b.input("v", Shape{2, 4, 1024, 64}, DType::bf16);
    std::vector<Var> fwd = b.attention(q, k, v, 0.1, causal);
    NodeId node = g.value(fwd[0].id).producer;
    if (backward) {
      std::vector<Var> d = b.attention_grad(q, k, v, fwd[0], fwd[1], fwd[0], 0.1, causal);
      node = g.value(d[0].id).producer;
    }
    return op_time(g, g.node(node), dev, {}, DType::bf16, false, kernel);
  };
  const double s = 2.0 * 8 * 1024 * 1024 * 2, q = 2.0 * 8 * 1024 * 64 * 2,
               kv = 2.0 * 4 * 1024 * 64 * 2;
  dev.peak_flops_bf16 = 1e30;  // compute free: each kernel is its bytes
  dev.launch_overhead = 0;
  const double bw = dev.memory_bandwidth * dev.memory_efficiency;
  const OpTime fwd = attention(true, AttentionKernel::materialized, false);
  EXPECT_DOUBLE_EQ(fwd.bytes, 4 * s + 2 * q + 2 * kv);
  EXPECT_NEAR(fwd.seconds, fwd.bytes / bw, 1e-15);
  EXPECT_EQ(fwd.bound, OpTime::memory);
  const OpTime bwd = attention(true, AttentionKernel::materialized, true);
  EXPECT_DOUBLE_EQ(bwd.bytes, 7 * s + 4 * q + 4 * kv);
  EXPECT_NEAR(bwd.seconds, bwd.bytes / bw, 1e-15);
  EXPECT_DOUBLE_EQ(bwd.flops, 2 * fwd.flops);
  // Compute-bound: the materialized GEMMs take the whole rectangle, the fused kernel half.
  dev = round_cluster().device;
  dev.memory_bandwidth = 1e30;
  EXPECT_DOUBLE_EQ(attention(true, AttentionKernel::materialized, false).seconds,
                   attention(false, AttentionKernel::materialized, false).seconds);
  EXPECT_NEAR(attention(true, AttentionKernel::fused, false).seconds - dev.launch_overhead,
              (attention(false, AttentionKernel::fused, false).seconds - dev.launch_overhead) / 2,
              1e-15);
}

// A materialized attention's batched GEMMs with heads off the 8-element alignment (108 wide)
// keep the lesser of unaligned_gemm_efficiency and unaligned_attention_efficiency of their rate;
// aligned heads (64 wide), f32, the fused kernel and the model's other GEMMs keep theirs.
TEST(OpTime, UnalignedHeadsSlowAMaterializedAttentionsGemms) {
  auto compute_s = [](int64_t width, DeviceSpec dev, DType dt, AttentionKernel kernel) {
    dev.memory_bandwidth = 1e30;  // the GEMMs alone
    dev.launch_overhead = 0;
    Graph g;
    Builder b(&g);
    Var q = b.input("q", Shape{2, 8, 1024, width}, dt);
    Var k = b.input("k", Shape{2, 8, 1024, width}, dt);
    Var v = b.input("v", Shape{2, 8, 1024, width}, dt);
    std::vector<Var> fwd = b.attention(q, k, v, 0.1, true);
    return op_time(g, g.node(g.value(fwd[0].id).producer), dev, {}, dt, false, kernel).seconds;
  };
  const DeviceSpec plain = round_cluster().device;
  DeviceSpec slow = plain;
  slow.unaligned_attention_efficiency = 0.1;
  const AttentionKernel mat = AttentionKernel::materialized;
  EXPECT_NEAR(compute_s(108, slow, DType::bf16, mat), 10 * compute_s(108, plain, DType::bf16, mat),
              1e-12);
  EXPECT_DOUBLE_EQ(compute_s(64, slow, DType::bf16, mat), compute_s(64, plain, DType::bf16, mat));
  EXPECT_DOUBLE_EQ(compute_s(108, slow, DType::f32, mat), compute_s(108, plain, DType::f32, mat));
  EXPECT_DOUBLE_EQ(compute_s(108, slow, DType::bf16, AttentionKernel::fused),
                   compute_s(108, plain, DType::bf16, AttentionKernel::fused));
  DeviceSpec both = slow;  // the lesser of the two
  both.unaligned_gemm_efficiency = 0.05;
  EXPECT_NEAR(compute_s(108, both, DType::bf16, mat), 20 * compute_s(108, plain, DType::bf16, mat),
              1e-12);
  // A plain GEMM off the alignment keeps unaligned_gemm_efficiency (1 here).
  OneOp o = matmul_graph(8192, 768, 50257);
  EXPECT_DOUBLE_EQ(op_time(o.g, o.g.node(o.node), slow, {}, DType::bf16).seconds,
                   op_time(o.g, o.g.node(o.node), plain, {}, DType::bf16).seconds);
}

}  // namespace
}  // namespace tessera
