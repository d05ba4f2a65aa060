#include "train/mfu_peak.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "backend/cpu/kernels.h"
#include "cost/cluster_spec.h"
#include "ir/builder.h"
#include "runtime/executor.h"

namespace tessera {

using Clock = std::chrono::steady_clock;

MfuPeak mfu_peak(Backend& backend, DType dtype, double given) {
  MfuPeak p;
  if (given > 0) {  // nothing measured (a 4096^3 GEMM is slow where the backend is the CPU's)
    p.flops = given;
    p.source = "--peak-flops";
    return p;
  }
  p.measured = measured_gemm_peak(backend, dtype);
  if (std::optional<DeviceSpec> d = datasheet_device(backend.device_name())) {
    p.flops = d->peak_flops(dtype);
    p.source = d->name + " datasheet, " + dtype_name(dtype);
  } else {
    p.flops = p.measured;
    p.source = "this rank's measured GEMM rate";
  }
  return p;
}

double measured_gemm_peak(Backend& backend, DType dt) {
  if (backend.memory() == MemSpace::host) {
    const int64_t n = 1024;
    std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a.size(), 0.25f), c(a.size());
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      auto t0 = Clock::now();
      cpu::sgemm(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n, 0.0f);
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return 2.0 * static_cast<double>(n * n * n) / best;
  }
  const int64_t n = 4096;
  Graph g;
  Builder bld(&g);
  bld.matmul(bld.input("a", Shape{n, n}, dt), bld.input("b", Shape{n, n}, dt));
  Executor ex(g, backend);  // inputs as allocated (zeros): the rate does not depend on values
  double best = 1e30;
  for (int r = 0; r < 4; ++r) {  // the first run warms up (kernel selection, clocks)
    auto t0 = Clock::now();
    ex.run();
    backend.synchronize();
    if (r > 0) best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(n * n * n) / best;
}

}  // namespace tessera
