// The CPU backend's threads: a fixed pool whose idle threads sleep (a short spin, then a futex
// wait) instead of spinning. OpenMP's and OpenBLAS's idle threads spin for up to milliseconds
// after each parallel region; on a machine with two vCPUs (often one physical core) that
// spinning takes the core away from the thread doing the work and made a GPT-2 step 2.7x slower.
//
//   cpu::parallel_for(rows, /*grain=*/16, [&](int64_t lo, int64_t hi) {
//     for (int64_t r = lo; r < hi; ++r) normalize(r);
//   });
//   cpu::parallel_run([&](int t, int nt) { partial[t] = sum_of_my_share(t, nt); });
//
// The thread count is TESSERA_NUM_THREADS, else OMP_NUM_THREADS, else the hardware's, or what
// set_num_threads() last set. A call made from inside a parallel region runs serially on the
// calling thread.
#pragma once

#include <cstdint>

namespace tessera::cpu {

int num_threads();
// n >= 1; takes effect for the next parallel region.
void set_num_threads(int n);

namespace detail {
using ChunkFn = void (*)(void* ctx, int thread, int threads);
// Runs fn(ctx, t, nt) for t in [0, nt) on nt threads (the caller is thread 0); returns when all
// are done. nt is at most num_threads().
void run_on_threads(int nt, ChunkFn fn, void* ctx);
}  // namespace detail

// Calls f(t, nt) once on each of nt = num_threads() threads.
template <typename F>
void parallel_run(F&& f) {
  detail::run_on_threads(
      num_threads(), [](void* c, int t, int nt) { (*static_cast<F*>(c))(t, nt); },
      static_cast<void*>(&f));
}

// Splits [0, n) into contiguous ranges of at least `grain` items, one per thread, and calls
// f(lo, hi) on each. Runs serially when n < 2 * grain.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  int64_t nt = num_threads();
  if (grain < 1) grain = 1;
  if (n / grain < nt) nt = n / grain;
  if (nt <= 1) return f(int64_t{0}, n);
  struct Ctx {
    F* f;
    int64_t n;
  } ctx{&f, n};
  detail::run_on_threads(
      static_cast<int>(nt),
      [](void* c, int t, int tn) {
        Ctx* x = static_cast<Ctx*>(c);
        int64_t lo = x->n * t / tn, hi = x->n * (t + 1) / tn;
        if (lo < hi) (*x->f)(lo, hi);
      },
      &ctx);
}

}  // namespace tessera::cpu
