#include "runtime/executor.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/thread_pool.h"
#include "base/check.h"

namespace tessera {

namespace {
constexpr uint8_t kPaint = 0xA5;
int64_t align64(int64_t x) { return (x + 63) / 64 * 64; }
}  // namespace

SharedArena SharedArena::make(Backend& backend, int64_t bytes) {
  SharedArena a;
  a.bytes = bytes;
  a.buffer = std::make_shared<Buffer>(backend.allocate(std::max<int64_t>(bytes, 64)));
  return a;
}

void SharedArena::paint() { buffer->backend()->fill(data(), kPaint, bytes); }

int64_t SharedArena::high_water() const {
  Backend& b = *buffer->backend();
  if (b.memory() == MemSpace::none) return 0;
  std::vector<uint8_t> copy;
  const uint8_t* p = data();
  if (b.memory() == MemSpace::device) {
    copy.resize(static_cast<size_t>(bytes));
    b.to_host(copy.data(), p, bytes);
    p = copy.data();
  }
  for (int64_t i = bytes; i > 0; --i)
    if (p[i - 1] != kPaint) return i;
  return 0;
}

void Executor::own_params() {
  param_ptr_.assign(g_.values().size(), nullptr);
  int64_t total = 0;
  for (ValueId p : g_.params())
    if (!g_.on_host(p)) total += align64(g_.type(p).bytes());
  if (total > 0) params_ = backend_.allocate(total);  // none: every parameter on the host
  int64_t off = 0;
  for (ValueId p : g_.params()) {
    if (g_.on_host(p)) continue;  // its owner (StepRunner) holds it in host memory
    param_ptr_[static_cast<size_t>(p)] = params_.bytes_at(off);
    off += align64(g_.type(p).bytes());
  }
}

void Executor::share_params(Executor& params_of) {
  TS_CHECK(&params_of.backend() == &backend_)
      << "executors sharing parameters must use the same backend";
  plan_.param_bytes = 0;  // the other executor's
  param_ptr_.assign(g_.values().size(), nullptr);
  const Graph& other = params_of.graph();
  for (ValueId p : g_.params()) {
    const ValueId q = other.find_param(g_.name_of(p));
    TS_CHECK_GE(q, 0) << "parameter " << g_.name_of(p) << " is not in the executor shared with";
    TS_CHECK(other.type(q).shape == g_.type(p).shape && other.type(q).dtype == g_.type(p).dtype)
        << "parameter " << g_.name_of(p) << " differs from the executor shared with";
    if (g_.on_host(p)) continue;
    param_ptr_[static_cast<size_t>(p)] = static_cast<uint8_t*>(params_of.raw(q));
  }
}

Executor::Executor(const Graph& g, Backend& backend) : g_(g), backend_(backend) {
  plan_ = plan_memory(g);
  own_params();
  arena_ = SharedArena::make(backend_, plan_.arena_bytes);
}

Executor::Executor(const Graph& g, Backend& backend, Executor& params_of)
    : g_(g), backend_(backend) {
  plan_ = plan_memory(g);
  share_params(params_of);
  arena_ = SharedArena::make(backend_, plan_.arena_bytes);
}

Executor::Executor(const Graph& g, Backend& backend, Executor* params_of, SharedArena arena)
    : g_(g), backend_(backend) {
  plan_ = plan_memory(g);
  if (params_of) {
    share_params(*params_of);
  } else {
    own_params();
  }
  TS_CHECK_LE(plan_.arena_bytes, arena.bytes) << "shared arena too small";
  TS_CHECK(arena.buffer->backend() == &backend_) << "shared arena of another backend";
  arena_ = std::move(arena);
}

namespace {
// SplitMix64's finalizer: a bijective mix of 64 bits.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
// A uniform double in (0, 1) from 53 bits.
double unit(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1p-53; }

// Draw m of parameter `param`: the standard normals of elements 2m and 2m + 1 (the two
// outputs of one Box-Muller transform of two hashed uniforms).
void normal_pair(uint64_t seed, size_t param, int64_t m, double* even, double* odd) {
  const uint64_t key = mix(mix(seed ^ 0x9e3779b97f4a7c15ULL) + param) ^ static_cast<uint64_t>(m);
  const double r = std::sqrt(-2.0 * std::log(unit(mix(key * 2 + 1))));
  const double angle = 2.0 * M_PI * unit(mix(key * 2 + 2));
  *even = r * std::cos(angle);
  *odd = r * std::sin(angle);
}

}  // namespace

float initial_value(const Graph& g, size_t param, uint64_t seed, int64_t element) {
  float v = 0;
  fill_initial_values(g, param, seed, element, 1, &v);
  return v;
}

void fill_initial_values(const Graph& g, size_t param, uint64_t seed, int64_t first, int64_t count,
                         float* dst) {
  const Node& n = g.producer(g.params()[param]);
  const SourceAttrs& a = n.attr<SourceAttrs>();
  if (a.init != Init::normal) {
    std::fill(dst, dst + count, a.init == Init::ones ? 1.0f : 0.0f);
    return;
  }
  const double sd = a.init_std;
  // Draws [first / 2, (first + count + 1) / 2) in parallel, each writing what of its pair lies
  // in [first, first + count).
  const int64_t m0 = first / 2, m1 = (first + count + 1) / 2;
  cpu::parallel_for(m1 - m0, 1 << 15, [&](int64_t lo, int64_t hi) {
    for (int64_t m = m0 + lo; m < m0 + hi; ++m) {
      double even, odd;
      normal_pair(seed, param, m, &even, &odd);
      const int64_t e = 2 * m - first;
      if (e >= 0 && e < count) dst[e] = static_cast<float>(even * sd);
      if (e + 1 >= 0 && e + 1 < count) dst[e + 1] = static_cast<float>(odd * sd);
    }
  });
}

void Executor::init_params(uint64_t seed) {
  std::vector<float> v;
  std::vector<uint8_t> stored;  // in the parameter's dtype
  for (size_t i = 0; i < g_.params().size(); ++i) {
    const ValueId p = g_.params()[i];
    const TensorType& t = g_.type(p);
    v.resize(static_cast<size_t>(t.shape.numel()));
    fill_initial_values(g_, i, seed, 0, static_cast<int64_t>(v.size()), v.data());
    stored.resize(static_cast<size_t>(t.bytes()));
    convert_elements(v.data(), DType::f32, stored.data(), t.dtype, t.shape.numel());
    backend_.to_device(raw(p), stored.data(), t.bytes());
  }
}

void Executor::run_node(const Node& n) {
  in_.clear();
  out_.clear();
  for (ValueId v : n.inputs) in_.push_back(raw(v));
  for (ValueId v : n.outputs) out_.push_back(raw(v));
  backend_.run(g_, n, in_, out_);
}

void Executor::set_input(const std::string& name, const void* data) {
  ValueId v = g_.find_input(name);
  TS_CHECK_GE(v, 0) << "no input named '" << name << "'";
  backend_.to_device(raw(v), data, g_.type(v).bytes());
}

void Executor::read(ValueId v, void* host_dst) {
  backend_.to_host(host_dst, raw(v), g_.type(v).bytes());
}

float Executor::read_scalar(ValueId v) {
  TS_CHECK(g_.type(v).dtype == DType::f32 && g_.type(v).shape.numel() == 1)
      << "value %" << v << " is not an f32 scalar";
  float x = 0;
  backend_.to_host(&x, raw(v), sizeof(float));
  return x;
}

void Executor::check_host() const {
  TS_CHECK(backend_.memory() == MemSpace::host)
      << "host pointer into the " << backend_.name()
      << " backend's memory: read values with Executor::read";
}

void* Executor::raw(ValueId v) {
  if (uint8_t* p = param_ptr_[static_cast<size_t>(v)]) return p;
  TS_CHECK(!g_.on_host(v)) << "parameter " << g_.name_of(v)
                           << " is in host memory (Plan::offload params): no device storage";
  int64_t off = plan_.offset(v);
  TS_CHECK_GE(off, 0) << "value %" << v << " has no storage";
  return arena_.data() + off;
}

void Executor::run() {
  static const bool profile = std::getenv("TESSERA_PROFILE") != nullptr;
  std::vector<double> seconds(profile ? kNumOps : 0, 0.0);
  for (const Node& n : g_.nodes()) {
    if (n.op == OpKind::parameter || n.op == OpKind::input) continue;
    auto t0 = std::chrono::steady_clock::now();
    run_node(n);
    if (profile)
      seconds[static_cast<size_t>(n.op)] +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (profile) {
    double total = 0;
    for (double s : seconds) total += s;
    std::fprintf(stderr, "TESSERA_PROFILE: %.3f s in kernels\n", total);
    for (OpKind k : all_ops())
      if (seconds[static_cast<size_t>(k)] > 0.005 * total)
        std::fprintf(stderr, "  %-20s %7.3f s  %5.1f%%\n", op_name(k),
                     seconds[static_cast<size_t>(k)],
                     100.0 * seconds[static_cast<size_t>(k)] / total);
  }
}

void Executor::paint_arena() { SharedArena{arena_.buffer, plan_.arena_bytes}.paint(); }

int64_t Executor::measured_high_water() const {
  return SharedArena{arena_.buffer, plan_.arena_bytes}.high_water();
}

}  // namespace tessera
