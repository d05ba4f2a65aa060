// The CPU backend's building blocks against naive references: the thread pool, the split
// SGEMM, the vectorized exp/tanh, and blocked causal attention (several query blocks, a ragged
// last one, grouped KV heads), forward and backward; and the kernel table covering every op.
#include "backend/cpu/kernels.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/vec_math.h"

namespace tessera::cpu {
namespace {

std::vector<float> randn(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The converter's fast paths (vectorized bf16, the F16C instructions for f16) give the
// reference conversions' bits on normal, subnormal, huge, infinite and rounding-tie values.
TEST(CpuBackend, ConversionsMatchTheReferenceBitForBit) {
  std::vector<float> f = {0.0f,     -0.0f,    1.0f,  -2.5f, 65504.0f,        65520.0f,
                          1e6f,     -1e-7f,   6e-8f, 3e-5f, 1.0f + 0x1p-11f, 1.0f + 0x1p-8f,
                          INFINITY, -INFINITY};
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 100.0f);
  while (f.size() < 1000) f.push_back(n(rng) * (f.size() % 3 == 0 ? 1e-6f : 1.0f));
  const int64_t count = static_cast<int64_t>(f.size());
  for (DType dt : {DType::bf16, DType::f16}) {
    std::vector<uint16_t> fast(f.size()), ref(f.size());
    convert_elements(f.data(), DType::f32, fast.data(), dt, count);
    for (size_t i = 0; i < f.size(); ++i)
      ref[i] = dt == DType::bf16 ? f32_to_bf16(f[i]) : f32_to_f16(f[i]);
    EXPECT_EQ(fast, ref) << dtype_name(dt) << " narrowing";
    std::vector<float> wide(f.size());
    convert_elements(ref.data(), dt, wide.data(), DType::f32, count);
    for (size_t i = 0; i < f.size(); ++i) {
      const float want = dt == DType::bf16 ? bf16_to_f32(ref[i]) : f16_to_f32(ref[i]);
      EXPECT_EQ(std::memcmp(&wide[i], &want, 4), 0) << dtype_name(dt) << " widening " << i;
    }
  }
}

// Kernels register themselves (kernels_*.cc): every op that is a computation has one, and the
// ops the runtime handles itself (sources, collectives, the rank's coordinate) have none.
TEST(CpuBackend, EveryComputeOpHasARegisteredKernel) {
  CpuBackend cpu;
  for (OpKind op : all_ops()) {
    const bool runtime_op = op == OpKind::parameter || op == OpKind::input || is_collective(op) ||
                            op == OpKind::axis_index;
    EXPECT_EQ(cpu.supports(op), !runtime_op) << op_name(op);
  }
}

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    std::vector<std::atomic<int>> hits(1000);
    parallel_for(1000, 7, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
  set_num_threads(2);
}

TEST(ThreadPool, NestedRegionRunsSeriallyOnTheCaller) {
  set_num_threads(2);
  std::atomic<int> inner_threads{0};
  parallel_run([&](int, int) {
    parallel_run([&](int t, int nt) {
      EXPECT_EQ(t, 0);
      inner_threads += nt;
    });
  });
  EXPECT_EQ(inner_threads.load(), 2);  // each outer thread ran one inner region of one thread
}

// Growing the pool between regions (more threads than any region so far) while regions run
// back to back: every index exactly once, every time.
TEST(ThreadPool, GrowingThePoolKeepsEveryRegionExact) {
  for (int round = 0; round < 50; ++round) {
    for (int threads : {2, 3, 5, 8}) {
      set_num_threads(threads);
      std::vector<std::atomic<int>> hits(64);
      parallel_for(64, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) hits[static_cast<size_t>(i)]++;
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1) << "round " << round << ", " << threads;
    }
  }
  set_num_threads(2);
}

// An exception in a region (on the caller or a worker) reaches the caller after every thread
// is done, and the next region is parallel again.
TEST(ThreadPool, ExceptionsReachTheCallerAndThePoolRecovers) {
  set_num_threads(2);
  for (int thrower : {0, 1}) {
    EXPECT_THROW(parallel_run([&](int t, int) {
                   if (t == thrower) throw std::runtime_error("chunk failed");
                 }),
                 std::runtime_error);
    std::atomic<int> ran{0};
    parallel_run([&](int, int nt) {
      ran++;
      EXPECT_EQ(nt, 2);
    });
    EXPECT_EQ(ran.load(), 2);
  }
}

TEST(VecMath, ExpAndTanhMatchLibm) {
  double worst_exp = 0, worst_tanh = 0;
  for (float x = -80.0f; x < 80.0f; x += 0.01f) {
    double e = std::exp(static_cast<double>(x));
    worst_exp = std::max(worst_exp, std::fabs(exp_fast(x) - e) / e);
    worst_tanh = std::max(worst_tanh, std::fabs(tanh_fast(x / 8) - std::tanh(x / 8.0)));
  }
  EXPECT_LT(worst_exp, 3e-7);
  EXPECT_LT(worst_tanh, 3e-7);
  EXPECT_EQ(exp_fast(-INFINITY), 0.0f);
  EXPECT_EQ(exp_fast(-200.0f), 0.0f);
  EXPECT_TRUE(std::isinf(exp_fast(200.0f)));
  // The top of the range (2^128 rounds into the exponent of infinity there) and NaN.
  for (float x : {88.4f, 88.6f, 88.7f})
    EXPECT_NEAR(exp_fast(x) / std::exp(static_cast<double>(x)), 1.0, 3e-7) << x;
  EXPECT_TRUE(std::isnan(exp_fast(NAN)));
}

// Every transpose combination on a product large enough to be split across threads, with
// sizes that are not multiples of the 16-wide slices.
TEST(Sgemm, SplitMatchesNaiveForEveryTranspose) {
  set_num_threads(2);
  for (auto [m, n] : {std::pair<int64_t, int64_t>{70, 701}, {701, 70}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t k = 53;
        std::vector<float> A = randn(m * k, 1), B = randn(k * n, 2), C = randn(m * n, 3);
        std::vector<double> want(C.size());
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double s = 0.5 * C[static_cast<size_t>(i * n + j)];
            for (int64_t p = 0; p < k; ++p)
              s += static_cast<double>(ta ? A[static_cast<size_t>(p * m + i)]
                                          : A[static_cast<size_t>(i * k + p)]) *
                   (tb ? B[static_cast<size_t>(j * k + p)] : B[static_cast<size_t>(p * n + j)]);
            want[static_cast<size_t>(i * n + j)] = s;
          }
        sgemm(ta, tb, m, n, k, A.data(), ta ? m : k, B.data(), tb ? k : n, C.data(), n, 0.5f);
        EXPECT_LT(max_abs_diff(C, want), 1e-4) << "m=" << m << " ta=" << ta << " tb=" << tb;
      }
}

// Attention in double (causal: keys j <= i), q [B,H,T,D], k/v [B,Hkv,T,D]: out, and dq, dk, dv of
// sum(out*dout).
struct Reference {
  std::vector<double> out, dq, dk, dv;
};

Reference reference_attention(const std::vector<float>& q, const std::vector<float>& k,
                              const std::vector<float>& v, const std::vector<float>& dout,
                              int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t D, double scale,
                              bool causal) {
  Reference r;
  r.out.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  std::vector<double> p(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kv = (b * Hkv + h / (H / Hkv)) * T * D, qo = (b * H + h) * T * D;
      for (int64_t i = 0; i < T; ++i) {
        const int64_t n = causal ? i + 1 : T;
        double m = -1e300, sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t c = 0; c < D; ++c) s += double(q[qo + i * D + c]) * k[kv + j * D + c];
          p[j] = s * scale;
          m = std::max(m, p[j]);
        }
        for (int64_t j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - m));
        for (int64_t j = 0; j < n; ++j) p[j] /= sum;
        double di = 0;
        for (int64_t c = 0; c < D; ++c) {
          double o = 0;
          for (int64_t j = 0; j < n; ++j) o += p[j] * v[kv + j * D + c];
          r.out[qo + i * D + c] = o;
          di += o * dout[qo + i * D + c];
        }
        for (int64_t j = 0; j < n; ++j) {
          double dp = 0;
          for (int64_t c = 0; c < D; ++c) dp += double(dout[qo + i * D + c]) * v[kv + j * D + c];
          const double ds = p[j] * (dp - di) * scale;
          for (int64_t c = 0; c < D; ++c) {
            r.dq[qo + i * D + c] += ds * k[kv + j * D + c];
            r.dk[kv + j * D + c] += ds * q[qo + i * D + c];
            r.dv[kv + j * D + c] += p[j] * dout[qo + i * D + c];
          }
        }
      }
    }
  return r;
}

// Causal (decoders) and bidirectional (encoders).
class Attention : public ::testing::TestWithParam<bool> {};

TEST_P(Attention, BlockedMatchesNaiveForwardAndBackward) {
  const bool causal = GetParam();
  set_num_threads(2);
  const int64_t B = 2, H = 4, Hkv = 2, T = 150, D = 16;  // 3 query blocks, the last ragged
  const double scale = 1.0 / std::sqrt(double(D));
  const int64_t nq = B * H * T * D, nk = B * Hkv * T * D;
  std::vector<float> q = randn(nq, 1), k = randn(nk, 2), v = randn(nk, 3), dout = randn(nq, 4);
  std::vector<float> out(static_cast<size_t>(nq)), lse(static_cast<size_t>(B * H * T));
  std::vector<float> dq(out.size()), dk(k.size()), dv(v.size());
  const Attrs attrs = AttentionAttrs{.scale = scale, .causal = causal};
  std::vector<TensorType> tq = {{Shape{B, H, T, D}, DType::f32}},
                          tk = {{Shape{B, Hkv, T, D}, DType::f32}};
  std::vector<TensorType> fwd_in = {tq[0], tk[0], tk[0]},
                          fwd_out = {tq[0], {Shape{B, H, T}, DType::f32}};
  attention(Args{attrs, fwd_in, fwd_out, {q.data(), k.data(), v.data()}, {out.data(), lse.data()}});
  std::vector<TensorType> bwd_in = {tq[0], tk[0], tk[0], tq[0], fwd_out[1], tq[0]},
                          bwd_out = {tq[0], tk[0], tk[0]};
  attention_grad(Args{attrs,
                      bwd_in,
                      bwd_out,
                      {q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data()},
                      {dq.data(), dk.data(), dv.data()}});
  Reference want = reference_attention(q, k, v, dout, B, H, Hkv, T, D, scale, causal);
  EXPECT_LT(max_abs_diff(out, want.out), 1e-5);
  EXPECT_LT(max_abs_diff(dq, want.dq), 1e-4);
  EXPECT_LT(max_abs_diff(dk, want.dk), 1e-4);
  EXPECT_LT(max_abs_diff(dv, want.dv), 1e-4);
  // The masked and unmasked kernels differ on these inputs (the flag reaches the kernel).
  Reference other = reference_attention(q, k, v, dout, B, H, Hkv, T, D, scale, !causal);
  EXPECT_GT(max_abs_diff(out, other.out), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(CausalOrNot, Attention, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Causal" : "Bidirectional"; });

// Context parallelism: chunk c of the queries (a sequence block, op.h) against the whole
// sequence's keys gives the whole attention's rows of that chunk, and the chunks' key and
// value gradients add up to the whole's; rope of a chunk rotates by the chunk's positions. The
// chunks are contiguous, or each two zigzag halves (c and 2N-1-c of 2N).
class AttentionWithSequenceBlock : public ::testing::TestWithParam<int64_t> {};

TEST_P(AttentionWithSequenceBlock, ChunksMatchTheirRowsOfTheWhole) {
  const int64_t zigzag = GetParam();
  set_num_threads(2);
  const int64_t B = 2, H = 4, Hkv = 2, T = 160, D = 16, chunks = 2, Tq = T / chunks;
  const double scale = 1.0 / std::sqrt(double(D));
  const int64_t nq = B * H * T * D, nk = B * Hkv * T * D;
  std::vector<float> q = randn(nq, 1), k = randn(nk, 2), v = randn(nk, 3), dout = randn(nq, 4);
  const Reference want = reference_attention(q, k, v, dout, B, H, Hkv, T, D, scale, true);
  const Attrs attrs = AttentionAttrs{.scale = scale, .causal = true, .zigzag = zigzag};
  const TensorType tq{Shape{B, H, Tq, D}, DType::f32}, tk{Shape{B, Hkv, T, D}, DType::f32},
      tl{Shape{B, H, Tq}, DType::f32}, ti{Shape{}, DType::i32};
  // Chunk c's rows (sequence_position) of each (b, h) of a [B, H, T, D] tensor.
  auto rows = [&](const std::vector<float>& x, int64_t c) {
    std::vector<float> y(static_cast<size_t>(B * H * Tq * D));
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t t = 0; t < Tq; ++t)
        std::copy_n(x.begin() + (bh * T + sequence_position(t, c, Tq, zigzag)) * D, D,
                    y.begin() + (bh * Tq + t) * D);
    return y;
  };
  auto to_d = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  std::vector<double> dk(k.size(), 0.0), dv(v.size(), 0.0);
  for (int32_t c = 0; c < chunks; ++c) {
    std::vector<float> qc = rows(q, c), dc = rows(dout, c);
    std::vector<float> out(qc.size()), lse(static_cast<size_t>(B * H * Tq));
    std::vector<float> dq(qc.size()), dkc(k.size()), dvc(v.size());
    std::vector<TensorType> fwd_in = {tq, tk, tk, ti}, fwd_out = {tq, tl};
    attention(Args{
        attrs, fwd_in, fwd_out, {qc.data(), k.data(), v.data(), &c}, {out.data(), lse.data()}});
    std::vector<TensorType> bwd_in = {tq, tk, tk, tq, tl, tq, ti}, bwd_out = {tq, tk, tk};
    attention_grad(Args{attrs,
                        bwd_in,
                        bwd_out,
                        {qc.data(), k.data(), v.data(), out.data(), lse.data(), dc.data(), &c},
                        {dq.data(), dkc.data(), dvc.data()}});
    std::vector<float> want_out(want.out.begin(), want.out.end()),
        want_dq(want.dq.begin(), want.dq.end());
    EXPECT_LT(max_abs_diff(out, to_d(rows(want_out, c))), 1e-5) << "chunk " << c;
    EXPECT_LT(max_abs_diff(dq, to_d(rows(want_dq, c))), 1e-4) << "chunk " << c;
    for (size_t i = 0; i < dk.size(); ++i) dk[i] += dkc[i], dv[i] += dvc[i];
  }
  std::vector<float> dkf(dk.begin(), dk.end()), dvf(dv.begin(), dv.end());
  EXPECT_LT(max_abs_diff(dkf, want.dk), 1e-4);
  EXPECT_LT(max_abs_diff(dvf, want.dv), 1e-4);

  // rope [B, T, H, D]: the chunk's rows of the whole sequence's rotation.
  const std::vector<float> x = randn(B * T * H * D, 5);
  const Attrs ra = RopeAttrs{.theta = 1e4, .zigzag = zigzag};
  std::vector<float> whole(x.size());
  std::vector<TensorType> rin = {{Shape{B, T, H, D}, DType::f32}};
  rope(Args{ra, rin, rin, {x.data()}, {whole.data()}});
  for (int32_t c = 0; c < chunks; ++c) {
    std::vector<float> xc(static_cast<size_t>(B * Tq * H * D)), yc(xc.size()), wc(xc.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tq; ++t) {
        const int64_t from = (b * T + sequence_position(t, c, Tq, zigzag)) * H * D;
        std::copy_n(x.begin() + from, H * D, xc.begin() + (b * Tq + t) * H * D);
        std::copy_n(whole.begin() + from, H * D, wc.begin() + (b * Tq + t) * H * D);
      }
    std::vector<TensorType> cin = {{Shape{B, Tq, H, D}, DType::f32}, ti}, cout = {cin[0]};
    rope(Args{ra, cin, cout, {xc.data(), &c}, {yc.data()}});
    EXPECT_EQ(max_abs_diff(yc, to_d(wc)), 0.0) << "rope chunk " << c;
  }
}

INSTANTIATE_TEST_SUITE_P(Order, AttentionWithSequenceBlock, ::testing::Values(0, 2),
                         [](const auto& info) { return info.param ? "Zigzag" : "Contiguous"; });

}  // namespace
}  // namespace tessera::cpu
