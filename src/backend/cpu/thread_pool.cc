#include "backend/cpu/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TS_CPU_RELAX() _mm_pause()
#else
#define TS_CPU_RELAX() ((void)0)
#endif

namespace tessera::cpu {

namespace {

// Spin iterations (each a pause, ~50-150 cycles; tens of microseconds in all) before sleeping:
// long enough to catch the next region of a back-to-back sequence (a region then costs ~2 us
// instead of ~17 us through the futex; B=4,T=64 steps 5% faster than with 64), short enough
// not to starve a sibling vCPU the way OpenMP's millisecond spins did.
constexpr int kSpins = 512;

int default_threads() {
  for (const char* var : {"TESSERA_NUM_THREADS", "OMP_NUM_THREADS"})
    if (const char* s = std::getenv(var)) {
      int n = std::atoi(s);
      if (n >= 1) return n;
    }
  // The CPUs this process may run on (mpirun's core binding, cpusets), as OpenMP counts them.
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= 1) return CPU_COUNT(&set);
  unsigned hw = std::thread::hardware_concurrency();
  return hw >= 1 ? static_cast<int>(hw) : 1;
}

std::atomic<int> g_threads{0};  // 0: not yet read from the environment
thread_local bool t_in_region = false;

// Waits until `a` no longer holds `old`: a short spin, then a futex wait.
template <typename T>
T wait_change(const std::atomic<T>& a, T old) {
  for (int i = 0; i < kSpins; ++i) {
    T v = a.load(std::memory_order_acquire);
    if (v != old) return v;
    TS_CPU_RELAX();
  }
  T v;
  while ((v = a.load(std::memory_order_acquire)) == old) a.wait(old, std::memory_order_acquire);
  return v;
}

// Workers 1..size-1 (the caller is thread 0). Every worker acknowledges every region, taking
// part or not, so no worker can still be reading one region's job when the next is posted.
class Pool {
 public:
  void run(int nt, detail::ChunkFn fn, void* ctx) {
    std::lock_guard<std::mutex> lock(submit_);
    while (static_cast<int>(workers_.size()) + 1 < nt) {
      // A new worker starts from the current generation: it must not take the last region
      // (already finished) for a new one while this one is being posted.
      int index = static_cast<int>(workers_.size()) + 1;
      uint64_t now = generation_.load(std::memory_order_relaxed);
      workers_.emplace_back([this, index, now] { loop(index, now); });
    }
    fn_ = fn;
    ctx_ = ctx;
    nt_ = nt;
    const int n = static_cast<int>(workers_.size());
    pending_.store(n, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    // Whatever fn does, the workers are waited for (they use the caller's ctx) and the thread
    // leaves the region; an exception is rethrown after that.
    std::exception_ptr error;
    t_in_region = true;
    try {
      fn(ctx, 0, nt);
    } catch (...) {
      error = std::current_exception();
    }
    t_in_region = false;
    for (int p = pending_.load(std::memory_order_acquire); p != 0;) p = wait_change(pending_, p);
    if (!error) error = std::exchange(worker_error_, nullptr);
    if (error) std::rethrow_exception(error);
  }

 private:
  void loop(int index, uint64_t seen) {
    t_in_region = true;  // a kernel on a worker never opens a nested region
    for (;;) {
      seen = wait_change(generation_, seen);
      if (index < nt_) {
        try {
          fn_(ctx_, index, nt_);
        } catch (...) {  // handed to the caller of run()
          std::lock_guard<std::mutex> lock(error_mu_);
          if (!worker_error_) worker_error_ = std::current_exception();
        }
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  std::mutex error_mu_;
  std::exception_ptr worker_error_;  // the first exception a worker caught in this region

  std::mutex submit_;  // one region at a time
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  detail::ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int nt_ = 1;
};

// Never destroyed: workers sleep in a futex wait until the process exits. A forked child gets
// a fresh pool (the parent's workers do not exist there).
Pool* g_pool = nullptr;
std::once_flag g_pool_once;

Pool& pool() {
  std::call_once(g_pool_once, [] {
    g_pool = new Pool;
    pthread_atfork(nullptr, nullptr, [] { g_pool = new Pool; });
  });
  return *g_pool;
}

}  // namespace

int num_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n == 0) {
    n = default_threads();
    g_threads.store(n, std::memory_order_relaxed);
  }
  return n;
}

void set_num_threads(int n) { g_threads.store(n >= 1 ? n : 1, std::memory_order_relaxed); }

namespace detail {
void run_on_threads(int nt, ChunkFn fn, void* ctx) {
  if (nt <= 1 || t_in_region) return fn(ctx, 0, 1);
  pool().run(nt, fn, ctx);
}
}  // namespace detail

}  // namespace tessera::cpu
