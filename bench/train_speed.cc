// Training speed of one process on the CPU, against the machine's GEMM peak measured in the same
// run. Builds the preset's training graph and steps it through the StepRunner on a plan of one
// rank, the path `tessera train` takes on one process (forward + backward, gradient accumulation,
// clipping, AdamW), on random tokens.
//
//   tessera_train_speed --model gpt2-small --batch 4 --seq 64 --steps 3 --threads 2
//
// Prints one line of key=value pairs (bench/run_speed.sh parses it):
//   tessera model=gpt2-small B=4 T=64 ... tokens_per_s=... gflops=... peak_gflops=... fraction=...
// gflops counts the training graph's op FLOPs (forward + backward; the optimizer is not
// counted) per second of a whole step (the optimizer included). peak_gflops is the best
// OpenBLAS SGEMM rate on square matrices of 2048 and 4096, through OpenBLAS's threads or split
// over the backend's (whichever is faster), measured before and after the timed steps.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "models/model.h"
#include "runtime/step_runner.h"

extern "C" char* openblas_get_corename(void);

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best rate of C = A B on n x n matrices over `reps` calls, in FLOP/s: through OpenBLAS's own
// threads (`threads` of them), or split over the backend's threads as the kernels call it
// (cpu::sgemm, single-threaded OpenBLAS in each).
double sgemm_rate(int n, int reps, bool backend_split, int threads) {
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (size_t i = 0; i < a.size(); ++i) a[i] = u(rng), b[i] = u(rng);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    if (!backend_split) openblas_set_num_threads(threads);
    auto t0 = Clock::now();
    if (backend_split) {
      tessera::cpu::sgemm(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n, 0.0f);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                  n, 0.0f, c.data(), n);
    }
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * n * n * static_cast<double>(n) / best;
}

// The machine's SGEMM peak: the best of both ways of threading at 2048 and 4096.
double sgemm_peak(int threads) {
  double peak = 0;
  for (bool split : {false, true})
    peak =
        std::max({peak, sgemm_rate(2048, 5, split, threads), sgemm_rate(4096, 3, split, threads)});
  return peak;
}

struct Options {
  std::string model = "gpt2-small";
  int64_t batch = 4, seq = 64;
  int steps = 3, warmup = 1, threads = 2;
  bool peak = true;
};

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--model PRESET] [--batch B] [--seq T] [--steps N] [--warmup N] "
               "[--threads N] [--no-peak]\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (f == "--no-peak") {
      o.peak = false;
      continue;
    }
    if (!(v = next())) return usage(argv[0]);
    if (f == "--model")
      o.model = v;
    else if (f == "--batch")
      o.batch = std::atoll(v);
    else if (f == "--seq")
      o.seq = std::atoll(v);
    else if (f == "--steps")
      o.steps = std::atoi(v);
    else if (f == "--warmup")
      o.warmup = std::atoi(v);
    else if (f == "--threads")
      o.threads = std::atoi(v);
    else
      return usage(argv[0]);
  }
  std::optional<ModelConfig> cfg = find_preset(o.model);
  if (!cfg || o.batch <= 0 || o.seq <= 0 || o.seq > cfg->max_seq_len || o.steps <= 0) {
    std::fprintf(stderr, "error: unknown preset '%s' or bad sizes\n", o.model.c_str());
    return usage(argv[0]);
  }
  cpu::set_num_threads(o.threads);

  // Measured before and after the timed steps, the best kept: a neighbour's load during one
  // measurement lowers the peak, and would flatter the fraction.
  double peak = o.peak ? sgemm_peak(o.threads) : 0.0;

  ModelGraph model = build_model(*cfg, o.batch, o.seq, ModelMode::train);
  CpuBackend cpu;
  // One process: the step runner on a plan of one rank.
  const Plan plan = Plan::data_parallel(1);
  Result<MeshComms> comms = MeshComms::single(plan);
  Result<std::unique_ptr<StepRunner>> made =
      comms.ok() ? StepRunner::create(model.graph, plan, cpu, comms.value(), AdamWConfig{})
                 : Result<std::unique_ptr<StepRunner>>(comms.status());
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().to_string().c_str());
    return 1;
  }
  StepRunner& step = *made.value();
  step.init_params(1234);
  const int64_t n = o.batch * o.seq;
  std::vector<int32_t> tokens(static_cast<size_t>(n)), targets(tokens.size());
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(cfg->vocab_size - 1));
  float loss = 0;
  auto one_step = [&] {
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = id(rng), targets[i] = id(rng);
    loss = step.forward_backward(token_feed(tokens.data(), targets.data())).value();
    (void)step.apply(6e-4, 1.0).value();
  };
  for (int s = 0; s < o.warmup; ++s) one_step();
  auto t0 = Clock::now();
  for (int s = 0; s < o.steps; ++s) one_step();
  const double per_step = seconds_since(t0) / o.steps;
  if (o.peak) peak = std::max(peak, sgemm_peak(o.threads));
  const double flops = model.graph.total_flops();
  const double gflops = flops / per_step / 1e9;
  std::printf(
      "tessera model=%s B=%lld T=%lld steps=%d threads=%d blas_core=%s loss=%.4f "
      "s_per_step=%.4f tokens_per_s=%.2f gflop_per_step=%.2f gflops=%.2f peak_gflops=%.2f "
      "fraction=%.3f\n",
      o.model.c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.seq), o.steps,
      o.threads, openblas_get_corename(), loss, per_step, static_cast<double>(n) / per_step,
      flops / 1e9, gflops, peak / 1e9, peak > 0 ? gflops / (peak / 1e9) : 0.0);
  return 0;
}
