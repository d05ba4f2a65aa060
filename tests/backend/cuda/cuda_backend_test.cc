// The CUDA kernels against the CPU kernels: whole training graphs (GPT and LLaMA, forward and
// backward, a tensor-parallel rank's graph with the vocab-parallel ops, bf16 storage) run node
// by node. Each node runs on the CPU backend; where the CUDA backend supports it, it runs
// there too on device copies of the same inputs, and the outputs must agree. Without a CUDA
// device every test is skipped (reported as skipped, not passed).
#include "backend/cuda/cuda_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "ir/builder.h"
#include "models/model.h"
#include "parallel/partition.h"
#include "parallel/program.h"
#include "parallel/sharding_search.h"

namespace tessera {
namespace {

#define REQUIRE_DEVICE()                                 \
  do {                                                   \
    std::string why;                                     \
    if (!cuda_device_present(&why)) GTEST_SKIP() << why; \
  } while (0)

// Worst error of one op kind over all its nodes, relative to max(1, max |cpu|) per output.
struct OpReport {
  int nodes = 0;
  double worst = 0;
  std::string where;
};

double tolerance(OpKind op, DType dt) {
  // Low-precision attention on the tensor cores rounds the probabilities (and the backward's
  // dS) to the storage type before their products, as FlashAttention does: two roundings more,
  // and in f16 the unscaled gradients of a model graph are subnormal (dS of 1e-6 keeps a few
  // bits; fp16 training scales the loss so that they are not).
  const bool attention = op == OpKind::attention || op == OpKind::attention_grad;
  if (dt == DType::bf16) return attention ? 0x1p-6 : 0x1p-7;  // a rounding of either result
  if (dt == DType::f16) return attention ? 0x1p-7 : 0x1p-10;
  // f32: sums in a different order (GEMMs, reductions over rows of thousands).
  return is_gemm(op) || op == OpKind::attention_grad || op == OpKind::layernorm_grad ||
                 op == OpKind::rmsnorm_grad || op == OpKind::embedding_grad ||
                 op == OpKind::vocab_embedding_grad || op == OpKind::reduce_sum ||
                 op == OpKind::sum_to
             ? 1e-4
             : 2e-5;
}

std::vector<float> as_floats(const std::vector<char>& bytes, DType dt, int64_t n) {
  std::vector<float> f(static_cast<size_t>(n));
  if (dt == DType::i32) {
    const int32_t* p = reinterpret_cast<const int32_t*>(bytes.data());
    for (int64_t i = 0; i < n; ++i) f[static_cast<size_t>(i)] = static_cast<float>(p[i]);
  } else {
    convert_elements(bytes.data(), dt, f.data(), DType::f32, n);
  }
  return f;
}

// Runs `g` node by node on the CPU (every value in its own host buffer) and checks each node
// the CUDA backend supports against it. Returns the ops the graph uses that CUDA lacks. An i32
// source gets random ids below `vocab`, or its value in `scalars`.
std::set<std::string> check_graph(const Graph& g, int32_t vocab,
                                  std::map<std::string, OpReport>* report, int32_t axis_value = 1,
                                  uint32_t seed = 1,
                                  const std::map<ValueId, int32_t>& scalars = {}) {
  CpuBackend cpu;
  CudaBackend gpu;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<std::vector<char>> host(g.values().size());
  std::set<std::string> missing;
  auto random_fill = [&](ValueId v) {
    const TensorType& t = g.type(v);
    const int64_t n = t.shape.numel();
    std::vector<char>& h = host[static_cast<size_t>(v)];
    h.assign(static_cast<size_t>(t.bytes()), 0);
    if (auto it = scalars.find(v); it != scalars.end()) {
      std::memcpy(h.data(), &it->second, 4);
      return;
    }
    if (t.dtype == DType::i32) {
      std::uniform_int_distribution<int32_t> ids(0, vocab - 1);
      for (int64_t i = 0; i < n; ++i) reinterpret_cast<int32_t*>(h.data())[i] = ids(rng);
      return;
    }
    std::vector<float> f(static_cast<size_t>(n));
    for (float& x : f) x = 0.5f * u(rng);
    convert_elements(f.data(), DType::f32, h.data(), t.dtype, n);
  };
  int index = -1;
  for (const Node& node : g.nodes()) {
    ++index;
    // Sources and what a communicator or the runtime writes get random (or fixed) values.
    if (node.op == OpKind::parameter || node.op == OpKind::input || is_collective(node.op)) {
      for (ValueId v : node.outputs) random_fill(v);
      continue;
    }
    if (node.op == OpKind::axis_index) {  // the rank's coordinate on the axis
      host[static_cast<size_t>(node.outputs[0])].assign(4, 0);
      std::memcpy(host[static_cast<size_t>(node.outputs[0])].data(), &axis_value, 4);
      continue;
    }
    std::vector<const void*> in;
    for (ValueId v : node.inputs) in.push_back(host[static_cast<size_t>(v)].data());
    std::vector<void*> out;
    for (ValueId v : node.outputs) {
      host[static_cast<size_t>(v)].assign(static_cast<size_t>(g.type(v).bytes()), 0);
      out.push_back(host[static_cast<size_t>(v)].data());
    }
    cpu.run(g, node, in, out);
    if (!gpu.supports(node.op)) {
      missing.insert(op_name(node.op));
      continue;
    }
    std::vector<void*> dev_in, dev_out;
    for (ValueId v : node.inputs) {
      dev_in.push_back(gpu.alloc(g.type(v).bytes()));
      gpu.to_device(dev_in.back(), host[static_cast<size_t>(v)].data(), g.type(v).bytes());
    }
    for (ValueId v : node.outputs) {  // NaN-filled (0xff bytes in every float type): an
                                      // element the kernel does not write fails the check
      const int64_t bytes = g.type(v).bytes();
      dev_out.push_back(gpu.alloc(bytes));
      std::vector<char> poison(static_cast<size_t>(bytes), '\xff');
      gpu.to_device(dev_out.back(), poison.data(), bytes);
    }
    std::vector<const void*> cin(dev_in.begin(), dev_in.end());
    gpu.run(g, node, cin, dev_out);
    OpReport& r = (*report)[op_name(node.op)];
    r.nodes++;
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      const TensorType& t = g.type(node.outputs[o]);
      std::vector<char> got(static_cast<size_t>(t.bytes()));
      gpu.to_host(got.data(), dev_out[o], t.bytes());
      const int64_t n = t.shape.numel();
      std::vector<float> want = as_floats(host[static_cast<size_t>(node.outputs[o])], t.dtype, n),
                         have = as_floats(got, t.dtype, n);
      // Error relative to the tensor's own magnitude (gradients are far below 1); a NaN on
      // one side only is an infinite error.
      double scale = 1e-20, err = 0;
      int64_t worst = 0;
      for (int64_t i = 0; i < n; ++i)
        if (std::isfinite(want[i])) scale = std::max(scale, double{std::fabs(want[i])});
      for (int64_t i = 0; i < n; ++i) {
        const bool same_nan = std::isnan(have[i]) && std::isnan(want[i]);
        const double e = same_nan ? 0.0
                         : std::isnan(have[i]) || std::isnan(want[i])
                             ? INFINITY
                             : std::fabs(double{have[i]} - want[i]);
        if (e > err) {
          err = e;
          worst = i;
        }
      }
      const double rel = err / scale;
      if (!(rel <= r.worst)) {
        r.worst = rel;
        r.where =
            "node " + std::to_string(index) + " output " + std::to_string(o) + " " + t.to_string();
      }
      EXPECT_LE(rel, tolerance(node.op, t.dtype))
          << op_name(node.op) << " node " << index << " output " << o << " " << t.to_string()
          << ": element " << worst << " cuda " << (n ? have[worst] : 0) << " cpu "
          << (n ? want[worst] : 0);
    }
    for (void* p : dev_in) gpu.free(p);
    for (void* p : dev_out) gpu.free(p);
  }
  return missing;
}

void print(const std::map<std::string, OpReport>& report) {
  std::printf("%-26s %6s %12s  %s\n", "op", "nodes", "worst rel", "at");
  for (const auto& [op, r] : report)
    std::printf("%-26s %6d %12.3g  %s\n", op.c_str(), r.nodes, r.worst, r.where.c_str());
}

ModelConfig preset(const std::string& name) {
  std::optional<ModelConfig> c = find_preset(name);
  EXPECT_TRUE(c.has_value()) << name;
  return *c;
}

std::string joined(const std::set<std::string>& s) {
  std::string r;
  for (const std::string& x : s) r += " " + x;
  return r;
}

TEST(CudaBackend, RunsEveryOpOfGptAndLlamaTrainingGraphsLikeTheCpu) {
  REQUIRE_DEVICE();
  std::printf("device: %s\n", CudaBackend().device_name().c_str());
  std::map<std::string, OpReport> report;
  for (const char* name : {"gpt-tiny", "llama-tiny", "moe-tiny"}) {
    for (int wide = 0; wide < 2; ++wide) {
      ModelConfig c = preset(name);
      // A small padded vocabulary keeps the graph quick (the padding columns are checked too);
      // the wide variant has rows over 512 and a head dim of 80, not a multiple of 32.
      c.vocab_size = 1000;
      c.padded_vocab_size = 1024;
      if (wide) {
        c.n_embd = 640;
        c.n_head = 8;
        if (c.family == "llama") c.n_kv_head = 2;
        c.ffn_hidden = 0;
      }
      ASSERT_TRUE(validate(c).ok()) << validate(c).to_string();
      ModelGraph m = build_model(c, /*batch=*/2, /*seq=*/64, ModelMode::train);
      std::set<std::string> missing = check_graph(m.graph, 1000, &report);
      EXPECT_TRUE(missing.empty()) << name << " uses ops without a CUDA kernel:" << joined(missing);
    }
  }
  print(report);
}

// The fused ops (parallel/fuse.h) of GPT's one-rank local graph, in f32, bf16 and f16: the
// residual norms (rows up to 1,024 wide take the warp-per-row kernels, 1,088 the block-per-row
// ones), and
// cuBLASLt's BIAS, GELU_AUX_BIAS, DGELU_BGRAD and BGRADB epilogues where it has them, the second
// pass where not (a 9-wide head: a qkv of 108 columns, not a multiple of 8).
TEST(CudaBackend, RunsTheFusedEpiloguesLikeTheCpu) {
  REQUIRE_DEVICE();
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    std::map<std::string, OpReport> report;
    auto check_fused = [&](ModelConfig c) {
      c.vocab_size = 1000;
      c.padded_vocab_size = 1024;
      c.dtype = dt;
      ModelGraph m = build_model(c, /*batch=*/2, /*seq=*/64, ModelMode::train);
      Result<Program> p = lower(m.graph, Plan::data_parallel(1));
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      std::set<std::string> missing = check_graph(p->local(), 1000, &report);
      EXPECT_TRUE(missing.empty()) << "ops without a CUDA kernel:" << joined(missing);
    };
    for (int64_t embd : {64, 640, 36, 1088}) {
      ModelConfig c = preset("gpt-tiny");
      c.n_embd = embd;
      c.n_head = embd == 640 ? 8 : embd == 1088 ? 17 : 4;
      check_fused(c);
    }
    check_fused(preset("llama-tiny"));  // LLaMA's residual rmsnorms
    for (const char* op :
         {"matmul_bias", "matmul_bias_gelu", "matmul_dgelu_bgrad", "matmul_bgrad", "add_layernorm",
          "layernorm_grad_add", "add_rmsnorm", "rmsnorm_grad_add"})
      EXPECT_GT(report[op].nodes, 0) << op << " is not in the fused graphs";
    std::printf("%s:\n", dtype_name(dt));
    print(report);
  }
}

// rope of a context-parallel rank's chunk (a sequence block input, contiguous or zigzag: op.h's
// sequence_position) as the CPU rotates it.
TEST(CudaBackend, RopeOfASequenceChunkLikeTheCpu) {
  REQUIRE_DEVICE();
  std::map<std::string, OpReport> report;
  for (int64_t zigzag : {0, 2}) {
    Graph g;
    Builder b(&g);
    Var x = b.input("x", Shape{2, 16, 4, 8});
    Var block = b.input("block", Shape{}, DType::i32);  // 0 or 1: check_graph's ids below 2
    b.op<OpKind::rope>({x, block}, {.theta = 1e4, .zigzag = zigzag});
    std::set<std::string> missing = check_graph(g, 2, &report);
    EXPECT_TRUE(missing.empty()) << joined(missing);
  }
  EXPECT_TRUE(report.count("rope"));
  print(report);
}

// The same graphs built in bf16 and f16 (ModelConfig::dtype): every op's low-precision path,
// as stored (matmul, attention, the norms, cross-entropy, the sums, the elementwise ops) or
// widened.
TEST(CudaBackend, RunsGptAndLlamaTrainingGraphsInBf16AndF16) {
  REQUIRE_DEVICE();
  for (DType dt : {DType::bf16, DType::f16}) {
    std::map<std::string, OpReport> report;
    for (const char* name : {"gpt-tiny", "llama-tiny"}) {
      ModelConfig c = preset(name);
      c.vocab_size = 1000;
      c.padded_vocab_size = 1024;
      c.dtype = dt;
      ModelGraph m = build_model(c, /*batch=*/2, /*seq=*/64, ModelMode::train);
      std::set<std::string> missing = check_graph(m.graph, 1000, &report);
      EXPECT_TRUE(missing.empty()) << name << " uses ops without a CUDA kernel:" << joined(missing);
    }
    for (const char* op : {"attention_grad", "layernorm_grad", "rmsnorm_grad", "cross_entropy_grad",
                           "sum_to", "matmul"})
      EXPECT_GT(report[op].nodes, 0) << op << " is not in the " << dtype_name(dt) << " graphs";
    std::printf("%s:\n", dtype_name(dt));
    print(report);
  }
}

TEST(CudaBackend, RunsTheVocabParallelOpsOfATensorParallelRank) {
  REQUIRE_DEVICE();
  ModelConfig c = preset("gpt-tiny");
  c.vocab_size = 500;
  c.padded_vocab_size = 512;
  ModelConfig one = c;
  one.n_layer = 1;
  ModelGraph block = build_model(one, 2, 32, ModelMode::train);
  ModelGraph all = build_model(c, 2, 32, ModelMode::train);
  Plan plan = Plan::tensor_parallel(1, 2);
  Result<BlockLayout> b = search_block_layout(block.graph, plan, SearchCost{0});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  plan.params = expand_block_layout(*b, all.graph, plan).value();
  Result<Partitioned> p = partition(all.graph, plan);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  std::map<std::string, OpReport> report;
  for (int32_t block : {0, 1}) {  // both ranks' blocks of the vocabulary (the last has padding)
    std::set<std::string> missing = check_graph(p->local, 500, &report, block);
    EXPECT_TRUE(missing.empty()) << "ops without a CUDA kernel:" << joined(missing);
  }
  for (const char* op : {"vocab_embedding", "vocab_embedding_grad", "vocab_logsumexp", "vocab_pick",
                         "vocab_cross_entropy_grad", "logsumexp"})
    EXPECT_TRUE(report.count(op)) << op << " is not in the tensor-parallel graph";
  print(report);
}

// bf16 and f16 storage: matmul, the binary and unary ops and the activation gradients read
// them as stored (f32 arithmetic). Both sides round their
// results to the storage type once.
TEST(CudaBackend, MatmulAndActivationsInBf16AndF16) {
  REQUIRE_DEVICE();
  for (DType dt : {DType::bf16, DType::f16}) {
    Graph g;
    Builder b(&g);
    Var a = b.parameter("a", Shape{4, 96, 64}, Init::zeros, 0.0, dt);
    Var w = b.parameter("w", Shape{80, 64}, Init::zeros, 0.0, dt);
    Var v = b.parameter("v", Shape{4, 64, 48}, Init::zeros, 0.0, dt);
    Var y = b.gelu(b.matmul(a, w, false, true));                     // [4,96,80], shared weight
    Var z = b.matmul(b.matmul(a, v, false, false), v, false, true);  // batched, B transposed
    Var s = b.matmul(a, a, true, false);                             // batched, A transposed
    // The binary ops run on the stored dtype: same-shape and broadcast operands.
    Var bias = b.parameter("bias", Shape{80}, Init::zeros, 0.0, dt);
    Var e = b.gelu_grad(b.scale((y + bias) * y - y, 0.5), y);
    g.mark_output(y.id);
    g.mark_output(z.id);
    g.mark_output(s.id);
    g.mark_output(e.id);
    std::map<std::string, OpReport> report;
    std::set<std::string> missing = check_graph(g, 1, &report);
    EXPECT_TRUE(missing.empty()) << joined(missing);
    EXPECT_EQ(report["matmul"].nodes, 4);
    for (const char* op : {"add", "mul", "sub", "scale", "gelu_grad"})
      EXPECT_EQ(report[op].nodes, 1) << op;
    print(report);
  }
}

// The attention kernels on the shapes the model graphs do not reach: rows that do not fill a
// tile (70 queries, 45 keys, 130 causal rows over three tiles), bidirectional with a score
// bias, grouped heads, head dims of 16, 80 (padded to 128 on the tensor cores), 64, 128 and
// 256 (the f32 kernels' largest). In f32 (the tiled f32 kernels), bf16 and f16 (the tensor
// cores where there is no bias and the head dim is a multiple of 8 up to 128, else the f32
// kernels on widened copies).
TEST(CudaBackend, AttentionTilesEdgesBiasHeadDimsAndDtypes) {
  REQUIRE_DEVICE();
  struct Case {
    int64_t tq, tk, h, hkv, d;
    bool causal, bias;
  };
  const Case cases[] = {{70, 45, 4, 2, 80, false, true},  {130, 130, 4, 2, 80, true, false},
                        {130, 130, 2, 2, 16, true, true}, {33, 33, 2, 1, 256, true, false},
                        {1, 7, 3, 3, 64, false, false},   {130, 130, 4, 1, 64, true, false},
                        {70, 45, 2, 2, 128, false, false}};
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    std::map<std::string, OpReport> report;
    for (const Case& c : cases) {
      Graph g;
      Builder b(&g);
      Var q = b.parameter("q", Shape{2, c.h, c.tq, c.d}, Init::zeros, 0.0, dt);
      Var k = b.parameter("k", Shape{2, c.hkv, c.tk, c.d}, Init::zeros, 0.0, dt);
      Var v = b.parameter("v", Shape{2, c.hkv, c.tk, c.d}, Init::zeros, 0.0, dt);
      Var bias = c.bias ? b.parameter("bias", Shape{c.h, c.tq, c.tk}, Init::zeros) : Var{};
      Var dout = b.parameter("dout", Shape{2, c.h, c.tq, c.d}, Init::zeros, 0.0, dt);
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
      std::vector<Var> att = b.attention(q, k, v, scale, c.causal, bias);
      std::vector<Var> grads =
          b.attention_grad(q, k, v, att[0], att[1], dout, scale, c.causal, bias);
      for (const Var& x : grads) g.mark_output(x.id);
      std::set<std::string> missing = check_graph(g, 1, &report);
      EXPECT_TRUE(missing.empty()) << joined(missing);
    }
    EXPECT_EQ(report["attention"].nodes, 7);
    EXPECT_EQ(report["attention_grad"].nodes, 7);
    std::printf("%s:\n", dtype_name(dt));
    print(report);
  }
}

// Attention on a context-parallel rank's chunk as the CPU computes it: the queries one of 2
// chunks of the sequence (a block input), the keys the whole sequence (gathered) or one chunk (a
// key block: ring attention's steps over an earlier, the same or a later chunk, whose rows see no
// key: out 0, lse -inf), contiguous or zigzag; and attention_merge of the two steps of a ring.
// Chunks of 70 rows (a tile of 64 and a ragged one; zigzag halves of 35), grouped heads, head
// dims 64 and 80, in f32 and bf16 (the f32 kernels on widened copies: the tensor-core kernels
// take no block).
TEST(CudaBackend, AttentionOverASequenceChunkLikeTheCpu) {
  REQUIRE_DEVICE();
  constexpr int32_t kChunks = 2;
  constexpr int64_t kLen = 70;
  for (DType dt : {DType::f32, DType::bf16}) {
    std::map<std::string, OpReport> report;
    for (int64_t zigzag : {int64_t{0}, int64_t{kChunks}})
      for (int64_t d : {64, 80})
        for (int32_t block = 0; block < kChunks; ++block) {
          SCOPED_TRACE("zigzag " + std::to_string(zigzag) + ", head dim " + std::to_string(d) +
                       ", chunk " + std::to_string(block));
          Graph g;
          Builder b(&g);
          std::map<ValueId, int32_t> scalars;
          auto scalar = [&](const std::string& name, int32_t value) {
            Var x = b.input(name, Shape{}, DType::i32);
            scalars[x.id] = value;
            return x;
          };
          auto tensor = [&](const std::string& name, int64_t heads, int64_t rows) {
            return b.parameter(name, Shape{2, heads, rows, d}, Init::zeros, 0.0, dt);
          };
          const Var q = tensor("q", 4, kLen), dout = tensor("dout", 4, kLen);
          const Var qb = scalar("block", block);
          const AttentionAttrs attrs{
              .scale = 1.0 / std::sqrt(static_cast<double>(d)), .causal = true, .zigzag = zigzag};
          // key_block -1: the whole sequence's keys (gathered); else that chunk's.
          std::vector<std::vector<Var>> steps;
          for (int32_t key_block = -1; key_block < kChunks; ++key_block) {
            const int64_t tk = key_block < 0 ? kChunks * kLen : kLen;
            const std::string step = std::to_string(key_block + 1);
            const Var k = tensor("k" + step, 2, tk), v = tensor("v" + step, 2, tk);
            std::vector<Var> in = {q, k, v, qb}, grad_in;
            if (key_block >= 0) in.push_back(scalar("key_block" + step, key_block));
            std::vector<Var> att = b.op<OpKind::attention>(in, attrs);
            grad_in = {q, k, v, att[0], att[1], dout, qb};
            if (key_block >= 0) grad_in.push_back(in.back());
            for (const Var& x : b.op<OpKind::attention_grad>(grad_in, attrs)) g.mark_output(x.id);
            if (key_block >= 0) steps.push_back(att);
          }
          for (const Var& x :
               b.op<OpKind::attention_merge>({steps[0][0], steps[0][1], steps[1][0], steps[1][1]}))
            g.mark_output(x.id);
          std::set<std::string> missing = check_graph(g, 1, &report, 1, 1, scalars);
          EXPECT_TRUE(missing.empty()) << joined(missing);
        }
    EXPECT_EQ(report["attention"].nodes, 24);
    EXPECT_EQ(report["attention_grad"].nodes, 24);
    EXPECT_EQ(report["attention_merge"].nodes, 8);
    std::printf("%s:\n", dtype_name(dt));
    print(report);
  }
}

}  // namespace
}  // namespace tessera
