#include "runtime/executor.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "base/check.h"

namespace tessera {

namespace {
constexpr uint8_t kPaint = 0xA5;
int64_t align64(int64_t x) { return (x + 63) / 64 * 64; }
}  // namespace

Executor::Executor(const Graph& g, Backend& backend) : g_(g), backend_(backend) {
  plan_ = plan_memory(g);
  param_ptr_.assign(g.values().size(), nullptr);
  int64_t total = 0;
  for (ValueId p : g.params()) total += align64(g.type(p).bytes());
  params_.reset(new uint8_t[static_cast<size_t>(std::max<int64_t>(total, 64))]());
  int64_t off = 0;
  for (ValueId p : g.params()) {
    param_ptr_[static_cast<size_t>(p)] = params_.get() + off;
    off += align64(g.type(p).bytes());
  }
  arena_.reset(new uint8_t[static_cast<size_t>(std::max<int64_t>(plan_.arena_bytes, 64))]);
}

void for_each_initial_param(const Graph& g, uint64_t seed,
                            const std::function<void(size_t, ValueId, std::vector<float>&)>& fn) {
  std::mt19937_64 rng(seed);
  std::vector<float> v;
  for (size_t i = 0; i < g.params().size(); ++i) {
    const ValueId p = g.params()[i];
    const Node& n = g.producer(p);
    v.assign(static_cast<size_t>(g.type(p).shape.numel()), 0.0f);
    if (n.attrs.init == Init::ones) std::fill(v.begin(), v.end(), 1.0f);
    if (n.attrs.init == Init::normal) {
      std::normal_distribution<float> dist(0.0f, static_cast<float>(n.attrs.init_std));
      for (float& x : v) x = dist(rng);
    }
    fn(i, p, v);
  }
}

void Executor::init_params(uint64_t seed) {
  for_each_initial_param(g_, seed, [&](size_t, ValueId p, std::vector<float>& v) {
    convert_elements(v.data(), DType::f32, raw(p), g_.type(p).dtype, g_.type(p).shape.numel());
  });
}

void Executor::run_node(const Node& n) {
  std::vector<const void*> in;
  std::vector<void*> out;
  for (ValueId v : n.inputs) in.push_back(raw(v));
  for (ValueId v : n.outputs) out.push_back(raw(v));
  backend_.run(g_, n, in, out);
}

void Executor::set_input(const std::string& name, const void* data) {
  ValueId v = g_.find_input(name);
  TS_CHECK_GE(v, 0) << "no input named '" << name << "'";
  std::memcpy(raw(v), data, static_cast<size_t>(g_.type(v).bytes()));
}

void* Executor::raw(ValueId v) {
  if (uint8_t* p = param_ptr_[static_cast<size_t>(v)]) return p;
  int64_t off = plan_.offset(v);
  TS_CHECK_GE(off, 0) << "value %" << v << " has no storage";
  return arena_.get() + off;
}

void Executor::run() {
  static const bool profile = std::getenv("TESSERA_PROFILE") != nullptr;
  std::vector<double> seconds(profile ? kNumOps : 0, 0.0);
  std::vector<const void*> in;
  std::vector<void*> out;
  for (const Node& n : g_.nodes()) {
    if (n.op == OpKind::parameter || n.op == OpKind::input) continue;
    in.clear();
    out.clear();
    for (ValueId v : n.inputs) in.push_back(raw(v));
    for (ValueId v : n.outputs) out.push_back(raw(v));
    auto t0 = std::chrono::steady_clock::now();
    backend_.run(g_, n, in, out);
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

void Executor::paint_arena() {
  std::memset(arena_.get(), kPaint, static_cast<size_t>(plan_.arena_bytes));
}

int64_t Executor::measured_high_water() const {
  for (int64_t i = plan_.arena_bytes; i > 0; --i)
    if (arena_[static_cast<size_t>(i - 1)] != kPaint) return i;
  return 0;
}

}  // namespace tessera
