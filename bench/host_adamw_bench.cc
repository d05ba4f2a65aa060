// The offloaded optimizer's rate on this host: the CPU backend's AdamW (what `train --offload
// optimizer` runs on the host's cores) over N f32 elements, in GB/s of optimizer state streamed
// (it reads the parameter, gradient and two moments and writes three: 28 bytes an element),
// against the same threads' streaming bandwidth on a read-modify-write pass (Backend::scale:
// 8 bytes an element). The ratio is a cluster spec's host_optimizer_efficiency for this host.
// Medians of REPS alternated runs.
//
//   tessera_host_adamw_bench [--elems N=33554432] [--reps R=7]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double seconds(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = int64_t{1} << 25;
  int reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--elems")) n = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  if (n < 1024 || reps < 1) {
    std::fprintf(stderr, "error: --elems must be at least 1024 and --reps at least 1\n");
    return 1;
  }
  tessera::CpuBackend cpu;
  std::vector<float> p(static_cast<size_t>(n), 0.5f), g(static_cast<size_t>(n), 1e-3f),
      m(static_cast<size_t>(n), 0.0f), v(static_cast<size_t>(n), 0.0f);
  tessera::AdamWUpdate u;
  u.step_size = 1e-4f;
  u.shrink = 1.0f - 1e-5f;
  std::vector<double> adamw, stream;
  // One untimed pass of each first (pages touched, threads started).
  cpu.adamw(u, p.data(), g.data(), tessera::DType::f32, m.data(), v.data(), n);
  cpu.scale(g.data(), n, 1.0f);
  for (int r = 0; r < reps; ++r) {
    adamw.push_back(seconds(
        [&] { cpu.adamw(u, p.data(), g.data(), tessera::DType::f32, m.data(), v.data(), n); }));
    stream.push_back(seconds([&] { cpu.scale(g.data(), n, 1.0f); }));
  }
  const double a = 28.0 * static_cast<double>(n) / median(adamw) / 1e9;
  const double s = 8.0 * static_cast<double>(n) / median(stream) / 1e9;
  std::printf("host AdamW over %lld f32 elements (%.2f GB of state), median of %d:\n",
              static_cast<long long>(n), 16.0 * static_cast<double>(n) / 1e9, reps);
  std::printf("  adamw   %8.3f ms  %7.2f GB/s (28 bytes an element)\n", 1e3 * median(adamw), a);
  std::printf("  stream  %8.3f ms  %7.2f GB/s (scale in place: 8 bytes an element)\n",
              1e3 * median(stream), s);
  std::printf("  ratio   %.2f  (host_optimizer_efficiency against this streaming rate)\n", a / s);
  return 0;
}
