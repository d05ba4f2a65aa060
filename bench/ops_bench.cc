// Google Benchmark micro-benchmarks of the CPU kernels that dominate a GPT-2 small training step
// (B=4, T=64 unless named otherwise). Each reports items/s or bytes/s and `vs_anchor`: the
// anchor's time over the kernel's, measured in the same benchmark (above 1: the kernel is
// faster). Anchors: single-threaded OpenBLAS cblas_sgemm on the same shape divided by the
// thread count, i.e. perfect scaling (matmul, and the two products inside attention), memcpy of the
// bytes the op must move (elementwise, layernorm, cross-entropy, AdamW).
//
//   build/bench/tessera_ops_bench --benchmark_filter=matmul
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

// Anchors call OpenBLAS single-threaded, as the kernels do (kernels_matmul.cc).
const bool kSingleThreadedBlas = (openblas_set_num_threads(1), true);

std::vector<float> random_floats(int64_t n, float scale = 1.0f, uint32_t seed = 1) {
  std::vector<float> v(static_cast<size_t>(n));
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  for (float& x : v) x = d(rng);
  return v;
}

// Seconds per call of f, best of a few rounds of `reps` calls.
template <typename F>
double time_of(F f, int reps = 3) {
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / reps);
  }
  return best;
}

TensorType f32(std::vector<int64_t> d) { return {Shape(d), DType::f32}; }

// Runs the kernel under the benchmark loop, then sets vs_anchor from best-of timings of both.
template <typename K, typename A>
void run_with_anchor(benchmark::State& st, K kernel, A anchor) {
  for (auto _ : st) kernel();
  const double tk = time_of(kernel), ta = time_of(anchor);
  st.counters["vs_anchor"] = ta / tk;
}

// Calls one CPU kernel on f32 buffers.
struct KernelCall {
  Attrs attrs;
  std::vector<TensorType> in_t, out_t;
  std::vector<const void*> in;
  std::vector<void*> out;
  void operator()(void (*k)(const cpu::Args&)) const {
    cpu::Args a{attrs, in_t, out_t, in, out};
    k(a);
  }
};

// ---- matmul: the GEMM shapes of GPT-2 small at B*T = 256 rows ----------------------------

void BM_matmul(benchmark::State& st) {
  const int64_t m = st.range(0), n = st.range(1), k = st.range(2);
  const bool ta = st.range(3) != 0, tb = st.range(4) != 0;
  std::vector<float> A = random_floats(m * k), B = random_floats(k * n),
                     C(static_cast<size_t>(m * n));
  const int64_t lda = ta ? m : k, ldb = tb ? k : n;
  auto kernel = [&] {
    cpu::sgemm(ta, tb, m, n, k, A.data(), lda, B.data(), ldb, C.data(), n, 0.0f);
  };
  // Anchor: single-threaded OpenBLAS on the whole product, scaled by the thread count (perfect
  // scaling). OpenBLAS's own threads are not used: they would spin against the backend's.
  const int threads = cpu::num_threads();
  auto anchor = [&] {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                int(m), int(n), int(k), 1.0f, A.data(), int(lda), B.data(), int(ldb), 0.0f,
                C.data(), int(n));
  };
  for (auto _ : st) kernel();
  st.counters["vs_anchor"] = time_of(anchor) / threads / time_of(kernel);
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k * 1e-9 * double(st.iterations()),
                                              benchmark::Counter::kIsRate);
}
// {M, N, K, transpose_a, transpose_b}: forward (x W^T), input grad (dY W), weight grad (dY^T x)
BENCHMARK(BM_matmul)
    ->ArgNames({"M", "N", "K", "ta", "tb"})
    ->Args({256, 2304, 768, 0, 1})
    ->Args({256, 768, 768, 0, 1})
    ->Args({256, 3072, 768, 0, 1})
    ->Args({256, 768, 3072, 0, 1})
    ->Args({256, 50257, 768, 0, 1})
    ->Args({256, 768, 3072, 0, 0})
    ->Args({256, 768, 50257, 0, 0})
    ->Args({2304, 768, 256, 1, 0})
    ->Args({3072, 768, 256, 1, 0})
    ->Args({50257, 768, 256, 1, 0})
    ->Args({2048, 50257, 768, 0, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ---- memory-bound ops: anchor = memcpy moving the same bytes (read + write) -------------

// memcpy of bytes/2 (it reads and writes each byte once), on the backend's threads.
struct MemcpyAnchor {
  std::vector<char> src, dst;
  explicit MemcpyAnchor(int64_t bytes)
      : src(size_t(bytes / 2), 1), dst(static_cast<size_t>(bytes / 2)) {}
  void operator()() {
    cpu::copy_floats(reinterpret_cast<float*>(dst.data()),
                     reinterpret_cast<const float*>(src.data()), int64_t(src.size() / 4));
  }
};

void set_bytes(benchmark::State& st, int64_t bytes) {
  st.SetBytesProcessed(int64_t(st.iterations()) * bytes);
}

void BM_layernorm(benchmark::State& st) {
  const int64_t rows = st.range(0), c = 768;
  std::vector<float> x = random_floats(rows * c), w = random_floats(c), b = random_floats(c);
  std::vector<float> y(x.size()), mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  KernelCall k;
  k.attrs = NormAttrs{.eps = 1e-5};
  k.in_t = {f32({rows, c}), f32({c}), f32({c})};
  k.out_t = {f32({rows, c}), f32({rows}), f32({rows})};
  k.in = {x.data(), w.data(), b.data()};
  k.out = {y.data(), mean.data(), rstd.data()};
  const int64_t bytes = 2 * rows * c * 4;
  MemcpyAnchor anchor(bytes);
  run_with_anchor(
      st, [&] { k(cpu::layernorm); }, anchor);
  set_bytes(st, bytes);
}
BENCHMARK(BM_layernorm)->Arg(256)->Arg(2048)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_gelu(benchmark::State& st) {
  const int64_t n = st.range(0);
  std::vector<float> x = random_floats(n), y(static_cast<size_t>(n)),
                     dy = random_floats(n, 1.0f, 2);
  KernelCall f, g;
  f.in_t = {f32({n})};
  f.out_t = {f32({n})};
  f.in = {x.data()};
  f.out = {y.data()};
  g.in_t = {f32({n}), f32({n})};
  g.out_t = {f32({n})};
  g.in = {x.data(), dy.data()};
  g.out = {y.data()};
  const int64_t bytes = 5 * n * 4;  // forward: read x, write y; backward: read x, dy, write dx
  MemcpyAnchor anchor(bytes);
  run_with_anchor(
      st,
      [&] {
        f([](const cpu::Args& a) { cpu::unary(OpKind::gelu, a); });
        g(cpu::gelu_grad);
      },
      anchor);
  set_bytes(st, bytes);
  st.SetItemsProcessed(int64_t(st.iterations()) * n);
}
// [B*T, 4C] at B=4,T=64 and B=8,T=256: forward + backward
BENCHMARK(BM_gelu)->Arg(256 * 3072)->Arg(2048 * 3072)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_cross_entropy(benchmark::State& st) {
  const int64_t n = st.range(0), v = 50257;
  std::vector<float> logits = random_floats(n * v), dl(static_cast<size_t>(n * v)),
                     lse(static_cast<size_t>(n));
  std::vector<int32_t> tgt(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tgt[size_t(i)] = int32_t((i * 7919) % v);
  float loss = 0, one = 1.0f;
  KernelCall f, g;
  f.attrs = CrossEntropyAttrs{};  // every column a class, the mean over these rows
  g.attrs = f.attrs;
  f.in_t = {f32({n, v}), {Shape{n}, DType::i32}};
  f.out_t = {f32({}), f32({n})};
  f.in = {logits.data(), tgt.data()};
  f.out = {&loss, lse.data()};
  g.in_t = {f32({n, v}), {Shape{n}, DType::i32}, f32({n}), f32({})};
  g.out_t = {f32({n, v})};
  g.in = {logits.data(), tgt.data(), lse.data(), &one};
  g.out = {dl.data()};
  const int64_t bytes = 3 * n * v * 4;  // forward reads the logits; backward reads and writes
  MemcpyAnchor anchor(bytes);
  run_with_anchor(
      st,
      [&] {
        f(cpu::cross_entropy);
        g(cpu::cross_entropy_grad);
      },
      anchor);
  set_bytes(st, bytes);
  st.SetItemsProcessed(int64_t(st.iterations()) * n * v);
}
// forward + backward over the 50257-word vocabulary, B*T rows
BENCHMARK(BM_cross_entropy)->Arg(256)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_adamw(benchmark::State& st) {
  const int64_t n = st.range(0);
  std::vector<float> p = random_floats(n), g = random_floats(n, 1e-3f, 2),
                     m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  AdamWUpdate u;
  u.shrink = 1.0f - 6e-5f;
  u.step_size = 6e-4f;
  const int64_t bytes = 7 * n * 4;  // reads p, g, m, v; writes p, m, v
  MemcpyAnchor anchor(bytes);
  run_with_anchor(
      st, [&] { cpu::adamw_update(u, p.data(), g.data(), m.data(), v.data(), n); }, anchor);
  set_bytes(st, bytes);
  st.SetItemsProcessed(int64_t(st.iterations()) * n);
}
// the token embedding of GPT-2 small (50257 x 768)
BENCHMARK(BM_adamw)->Arg(50257 * 768)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---- attention: anchor = its GEMMs (Q K^T, P V; backward five) as single-threaded sgemm ----

void BM_attention(benchmark::State& st) {
  const int64_t b = st.range(0), h = 12, t = st.range(1), d = 64, n = b * h * t * d;
  std::vector<float> q = random_floats(n), k = random_floats(n, 1.0f, 2),
                     v = random_floats(n, 1.0f, 3), o(static_cast<size_t>(n)),
                     lse(static_cast<size_t>(b * h * t)), dout = random_floats(n, 1.0f, 4),
                     dq(static_cast<size_t>(n)), dk(static_cast<size_t>(n)),
                     dv(static_cast<size_t>(n));
  KernelCall f, g;
  f.attrs = AttentionAttrs{.scale = 0.125};
  g.attrs = f.attrs;
  f.in_t = {f32({b, h, t, d}), f32({b, h, t, d}), f32({b, h, t, d})};
  f.out_t = {f32({b, h, t, d}), f32({b, h, t})};
  f.in = {q.data(), k.data(), v.data()};
  f.out = {o.data(), lse.data()};
  g.in_t = {f.in_t[0], f.in_t[0], f.in_t[0], f.in_t[0], f32({b, h, t}), f.in_t[0]};
  g.out_t = {f.in_t[0], f.in_t[0], f.in_t[0]};
  g.in = {q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data()};
  g.out = {dq.data(), dk.data(), dv.data()};
  std::vector<float> s(static_cast<size_t>(t * t)), out(static_cast<size_t>(t * d));
  const int threads = cpu::num_threads();
  // 7 products of one head, times the heads, over the threads; causal like the kernel: query
  // block j (64 rows) against keys [0, 64 (j + 1)) only.
  const int64_t qb = std::min<int64_t>(64, t);
  auto gemms = [&] {
    for (int64_t i = 0; i < b * h; i += threads)
      for (int r = 0; r < 7; ++r)
        for (int64_t q0 = 0; q0 < t; q0 += qb) {
          const int rows = int(std::min(qb, t - q0)), keys = int(std::min(t, q0 + qb));
          if (r == 0 || r == 3)  // Q K^T, dO V^T: [rows, D] x [D, keys]
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, int(d), 1.0f,
                        q.data() + q0 * d, int(d), k.data(), int(d), 0.0f, s.data(), keys);
          else  // P V and the gradient products: [rows, keys] x [keys, D]
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, int(d), keys, 1.0f,
                        s.data(), keys, v.data(), int(d), 0.0f, out.data(), int(d));
        }
  };
  run_with_anchor(
      st,
      [&] {
        f(cpu::attention);
        g(cpu::attention_grad);
      },
      gemms);
  st.SetItemsProcessed(int64_t(st.iterations()) * b * h * t);
}
// forward + backward, 12 heads of 64: B=4,T=64 and B=8,T=256
BENCHMARK(BM_attention)
    ->Args({4, 64})
    ->Args({8, 256})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
