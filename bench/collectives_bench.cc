// The host collectives, ring against the MPI library's, in one run:
//   mpirun --oversubscribe --allow-run-as-root -np 4 build/bench/tessera_collectives_bench [reps]
// For each operation and message size (the bytes of the whole buffer: all_reduce's data,
// reduce_scatter's input, all_gather's output), the three choices (comm/host_comm.h: ring, mpi,
// auto) alternate `reps` times (default 7), each time running the operation enough times to
// take about 20 ms, all ranks starting together after a barrier; rank 0 prints the median
// seconds per operation of each, the bus bandwidth (as nccl-tests defines it: 2(n-1)/n B/t for
// all_reduce, (n-1)/n B/t for the others) and the ratios ring / mpi and ring / auto (above 1:
// faster than the ring).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/host_comm.h"
#include "comm/mpi_comm.h"

namespace tessera {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

enum class Op { all_reduce, reduce_scatter, all_gather };
const char* op_name(Op op) {
  return op == Op::all_reduce       ? "all_reduce"
         : op == Op::reduce_scatter ? "reduce_scatter"
                                    : "all_gather";
}

// Seconds per operation over `iters` back-to-back operations (the slowest rank's).
double time_op(Communicator& c, Op op, std::vector<float>& a, std::vector<float>& b, int iters) {
  const int64_t n = c.size(), total = static_cast<int64_t>(a.size()), block = total / n;
  if (!c.barrier("start").ok()) std::exit(1);
  const double t0 = now();
  for (int i = 0; i < iters; ++i) {
    Request r = op == Op::all_reduce       ? c.all_reduce(a.data(), total, "bench")
                : op == Op::reduce_scatter ? c.reduce_scatter(a.data(), b.data(), block, "bench")
                                           : c.all_gather(b.data(), a.data(), block, "bench");
    if (!c.wait(r).ok()) std::exit(1);
  }
  auto slowest = c.all_reduce_scalar((now() - t0) / iters, /*max=*/true, "time");
  if (!slowest.ok()) std::exit(1);
  return *slowest;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(Communicator& world, int reps) {
  const int n = world.size();
  if (world.rank() == 0)
    std::printf(
        "%d ranks, median of %d alternated repetitions\n%-15s %10s %12s %12s %12s %10s "
        "%10s %9s %9s\n",
        n, reps, "op", "bytes", "ring s/op", "mpi s/op", "auto s/op", "ring GB/s", "mpi GB/s",
        "ring/mpi", "ring/auto");
  for (Op op : {Op::all_reduce, Op::reduce_scatter, Op::all_gather}) {
    for (int64_t bytes : {int64_t{8} << 10, int64_t{32} << 10, int64_t{128} << 10, int64_t{1} << 20,
                          int64_t{8} << 20, int64_t{32} << 20}) {
      const int64_t total = bytes / 4 / n * n;
      std::vector<float> a(static_cast<size_t>(total), 1.0f), b(static_cast<size_t>(total / n));
      // Iterations for about 20 ms, from one ring operation (the same on every rank).
      set_collective_algo(world, CollectiveAlgo::ring);
      const double once = time_op(world, op, a, b, 1);
      const int iters = std::clamp(static_cast<int>(0.02 / std::max(once, 1e-6)), 1, 1000);
      std::vector<double> ring, mpi, automatic;
      for (int k = 0; k < reps; ++k) {
        set_collective_algo(world, CollectiveAlgo::ring);
        ring.push_back(time_op(world, op, a, b, iters));
        set_collective_algo(world, CollectiveAlgo::mpi);
        mpi.push_back(time_op(world, op, a, b, iters));
        set_collective_algo(world, CollectiveAlgo::automatic);
        automatic.push_back(time_op(world, op, a, b, iters));
      }
      const double tr = median(ring), tm = median(mpi), ta = median(automatic);
      const double factor = (op == Op::all_reduce ? 2.0 : 1.0) * (n - 1) / n;
      const double moved = factor * static_cast<double>(total) * 4 / 1e9;
      if (world.rank() == 0)
        std::printf("%-15s %10lld %12.6f %12.6f %12.6f %10.3f %10.3f %9.2f %9.2f\n", op_name(op),
                    static_cast<long long>(total * 4), tr, tm, ta, moved / tr, moved / tm, tr / tm,
                    tr / ta);
    }
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  using namespace tessera;
  auto world = mpi_world(&argc, &argv, CollectiveAlgo::ring);
  if (!world.ok()) {
    std::fprintf(stderr, "error: %s\n", world.status().message().c_str());
    return 1;
  }
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  return run(**world, reps);
}
