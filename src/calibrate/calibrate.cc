#include "calibrate/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/thread_pool.h"
#include "base/format.h"
#include "cost/op_cost.h"
#include "io/model_config.h"
#include "ir/builder.h"
#include "runtime/step_runner.h"
#include "sim/simulator.h"

namespace tessera {

namespace {

std::string format_string(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string format_string(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over `reps` runs of fn, every rank starting together.
Result<double> timed(Communicator& world, int reps, const std::function<Status()>& fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    TS_RETURN_IF_ERROR(world.barrier("calibrate"));
    double t0 = now();
    TS_RETURN_IF_ERROR(fn());
    t.push_back(now() - t0);
  }
  return median(t);
}

// The mean over ranks (every rank gets the same value).
Result<double> mean(Communicator& world, double x, const std::string& what) {
  TS_ASSIGN_OR_RETURN(double sum, world.all_reduce_scalar(x, false, what));
  return sum / world.size();
}

// Seconds of one run of a graph holding a single op after its inputs (all ranks at once), on
// `b` (a device's: until the work is done). The inputs hold small numbers (bytes 0x3C: about
// 0.0115 in f32 and bf16); the values do not change the speed.
Result<double> one_op_seconds(Communicator& world, Graph& g, int reps, Backend& b) {
  Executor ex(g, b);
  for (ValueId in : g.inputs()) {
    std::vector<uint8_t> x(static_cast<size_t>(g.type(in).bytes()), 0x3C);
    ex.set_input(g.name_of(in), x.data());
  }
  ex.run();  // warm-up: page faults, thread start, library handles
  b.synchronize();
  return timed(world, reps, [&] {
    ex.run();
    b.synchronize();
    return Status();
  });
}

bool on_device(const Backend& b) { return b.memory() == MemSpace::device; }

// The backend's GEMM throughput on a large square product in `dtype`, in FLOP/s; with
// `unaligned`, on the same product with one more output column (a row of n + 1 elements, off
// the 16-byte alignment tensor-core kernels load).
Result<double> gemm_peak(Communicator& world, int reps, Backend& be, DType dtype,
                         bool unaligned = false) {
  const int64_t n = on_device(be) ? 4096 : 1024, cols = unaligned ? n + 1 : n;
  Graph g;
  Builder b(&g);
  b.matmul(b.input("x", Shape{n, n}, dtype), b.input("w", Shape{n, cols}, dtype));
  TS_ASSIGN_OR_RETURN(double s, one_op_seconds(world, g, reps, be));
  return 2.0 * static_cast<double>(n * n * cols) / s;
}

// The backend's streaming bandwidth (read + write of 32 MiB; 1 GiB on a device, beyond its
// caches), in bytes/s.
Result<double> stream_bandwidth(Communicator& world, int reps, Backend& be) {
  const int64_t n = on_device(be) ? int64_t{256} << 20 : int64_t{8} << 20;
  Graph g;
  Builder b(&g);
  b.scale(b.input("x", Shape{n}), 0.5);
  TS_ASSIGN_OR_RETURN(double s, one_op_seconds(world, g, reps, be));
  return 2.0 * 4.0 * static_cast<double>(n) / s;
}

// The host side an offloaded optimizer uses (all ranks at once, as they share the host): the
// host's streaming rate and its AdamW's (the CPU backend's passes over 16 Mi f32 elements, as
// bench/host_adamw_bench.cc measures them), and the link between `be` and host memory (64 MiB
// each way, the slower; on the CPU backend a memcpy). Rates per rank in bytes/s.
struct HostRates {
  double stream = 0, adamw = 0, link = 0;
};

Result<HostRates> host_rates(Communicator& world, int reps, Backend& be) {
  const int64_t n = int64_t{16} << 20;
  CpuBackend cpu;
  std::vector<float> p(static_cast<size_t>(n), 0.5f), g(static_cast<size_t>(n), 1e-3f),
      m(static_cast<size_t>(n), 0.0f), v(static_cast<size_t>(n), 0.0f);
  AdamWUpdate u;
  u.step_size = 1e-4f;
  auto adamw = [&] {
    cpu.adamw(u, p.data(), g.data(), DType::f32, m.data(), v.data(), n);
    return Status();
  };
  auto stream = [&] {
    cpu.scale(g.data(), n, 1.0f);
    return Status();
  };
  TS_RETURN_IF_ERROR(adamw());  // warm-up: pages and threads
  HostRates r;
  TS_ASSIGN_OR_RETURN(const double adamw_s, timed(world, reps, adamw));
  TS_ASSIGN_OR_RETURN(const double stream_s, timed(world, reps, stream));
  r.adamw = 28.0 * static_cast<double>(n) / adamw_s;  // reads p, g, m, v; writes p, m, v
  r.stream = 8.0 * static_cast<double>(n) / stream_s;
  const int64_t bytes = int64_t{64} << 20;
  Buffer dev = be.allocate(bytes);
  std::vector<uint8_t> host(static_cast<size_t>(bytes), 1);
  be.to_device(dev.data(), host.data(), bytes);  // warm-up
  TS_ASSIGN_OR_RETURN(const double out_s, timed(world, reps, [&] {
                        be.to_host(host.data(), dev.data(), bytes);
                        return Status();
                      }));
  TS_ASSIGN_OR_RETURN(const double in_s, timed(world, reps, [&] {
                        be.to_device(dev.data(), host.data(), bytes);
                        be.synchronize();
                        return Status();
                      }));
  r.link = static_cast<double>(bytes) / std::max(out_s, in_s);
  return r;
}

// all_reduce over the world at several sizes, fitted to T = 2(p-1)·α + 2(p-1)/p · S/B.
Status fit_collectives(Communicator& world, int reps, ClusterSpec* spec,
                       std::vector<std::string>* notes) {
  const double p = world.size();
  std::vector<double> S, T;
  for (int64_t count : {1 << 10, 1 << 14, 1 << 17, 1 << 20}) {
    std::vector<float> buf(static_cast<size_t>(count), 1.0f);
    TS_ASSIGN_OR_RETURN(double t, timed(world, reps, [&] {
                          return world.wait(world.all_reduce(buf.data(), count, "calibrate"));
                        }));
    TS_ASSIGN_OR_RETURN(t, mean(world, t, "calibrate all_reduce time"));
    S.push_back(4.0 * static_cast<double>(count));
    T.push_back(t);
  }
  double n = static_cast<double>(S.size()), sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < S.size(); ++i)
    sx += S[i], sy += T[i], sxx += S[i] * S[i], sxy += S[i] * T[i];
  double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  double intercept = (sy - slope * sx) / n;
  if (slope <= 0)
    return error(
        "calibrate: all_reduce time does not grow with size; the machine is "
        "too noisy to fit a bandwidth — run again on a quieter machine");
  spec->node.intra_bandwidth = 2.0 * (p - 1) / p / slope;
  spec->node.intra_latency = std::max(0.0, intercept / (2.0 * (p - 1)));
  spec->node.intra_efficiency = 1.0;
  notes->push_back(
      format_string("all_reduce over %d ranks: latency %.1f us per ring step, "
                    "bandwidth %s/s per rank (4 KiB .. 4 MiB, %d reps)",
                    world.size(), 1e6 * spec->node.intra_latency,
                    format_bytes(spec->node.intra_bandwidth).c_str(), reps));
  return Status();
}

// A real training step of `cfg` under `plan` on this rank, with a random batch.
struct RealStep {
  ModelGraph model;
  MeshComms comms;
  Backend* backend = nullptr;
  std::unique_ptr<StepRunner> step;
  std::vector<int32_t> tokens, targets;

  Status run() {
    TS_RETURN_IF_ERROR(step->forward_backward(token_feed(tokens.data(), targets.data())).status());
    TS_RETURN_IF_ERROR(step->apply(1e-4, 1.0).status());
    backend->synchronize();  // a device's optimizer passes are done
    return Status();
  }
};

Result<std::unique_ptr<RealStep>> real_step(Communicator& world, ModelConfig cfg, int64_t batch,
                                            int64_t seq, int zero, Backend& backend,
                                            DType precision, bool offload = false) {
  const int ranks = world.size();
  if (batch % ranks != 0)
    return error("calibrate: batch " + std::to_string(batch) + " does not split over " +
                 std::to_string(ranks) + " ranks");
  if (seq > cfg.max_seq_len) return error("calibrate: --seq exceeds the model's max_seq_len");
  auto r = std::make_unique<RealStep>();
  cfg.dtype = precision;
  r->model = build_model(cfg, batch, seq, ModelMode::train);
  r->backend = &backend;
  Plan plan = Plan::data_parallel(ranks, zero);
  if (offload) plan.offload = OffloadPolicy::optimizer;
  TS_ASSIGN_OR_RETURN(r->comms, MeshComms::create(world, plan));
  TS_ASSIGN_OR_RETURN(r->step, StepRunner::create(r->model.graph, plan, backend, r->comms, {}));
  r->step->init_params(1);
  r->tokens.resize(static_cast<size_t>(batch / ranks * seq));
  r->targets.resize(r->tokens.size());
  std::mt19937 rng(static_cast<uint32_t>(world.rank() + 1));
  for (size_t i = 0; i < r->tokens.size(); ++i) {
    r->tokens[i] = static_cast<int32_t>(rng() % static_cast<uint32_t>(cfg.vocab_size));
    r->targets[i] = static_cast<int32_t>(rng() % static_cast<uint32_t>(cfg.vocab_size));
  }
  for (int i = 0; i < 2; ++i) TS_RETURN_IF_ERROR(r->run());  // warm-up
  return r;
}

struct OpFit {
  double roofline = 0;  // seconds at efficiency 1 and no launch overhead
  double measured = 0;  // seconds minus the launch overhead
};

}  // namespace

Result<Calibration> calibrate(Communicator& world, const CalibrationOptions& o) {
  // Every count checked before any measurement: --reps 0 used to write a spec of inf and NaN.
  for (auto [flag, v, least] : {std::tuple<const char*, int64_t, int64_t>{"--reps", o.reps, 1},
                                {"--seq", o.seq, 1},
                                {"--batch", o.batch, 0},
                                {"--check", o.check_steps, 0},
                                {"--check-batch", o.check_batch, 0}})
    if (v < least)
      return error(std::string(flag) + " must be at least " + std::to_string(least) + ", got " +
                   std::to_string(v));
  if (o.zero < 0 || o.zero > 3 || o.check_zero < -1 || o.check_zero > 3)
    return error("--zero and --check-zero take a ZeRO stage 0-3, got " + std::to_string(o.zero) +
                 " and " + std::to_string(o.check_zero));
  if (o.precision == DType::i32) return error("calibrate: precision must be f32, bf16 or f16");
  CpuBackend host_backend;
  Backend& be = o.backend ? *o.backend : host_backend;
  const bool device = on_device(be), low = is_low_precision(o.precision);
  Calibration c;
  ClusterSpec& spec = c.spec;
  const int ranks = world.size();
  if (device && ranks > 1)
    return error("calibrate measures one device in one process (no device collectives yet)");
  const int threads = cpu::num_threads();  // the backend's (TESSERA_NUM_THREADS, ...)
  char host[256] = "this machine";
  gethostname(host, sizeof host - 1);
  spec.name = device ? "device-local" : "cpu-local";
  spec.description =
      format_string("calibrated by `tessera calibrate` on %s: %s, model %s in %s", host,
                    device ? o.device_name.c_str()
                           : format_string("%d rank(s) x %d thread(s)", ranks, threads).c_str(),
                    o.model.c_str(), dtype_name(o.precision));
  spec.device.name = device ? o.device_name : format_string("CPU rank (%d threads)", threads);
  // The ranks of this machine are one node (its links are fitted in step 3).
  spec.node.devices = ranks;
  spec.network.nics = 0;

  // 1. Peak and bandwidth of the backend, all ranks at once.
  TS_ASSIGN_OR_RETURN(double peak, gemm_peak(world, o.reps, be, DType::f32));
  TS_ASSIGN_OR_RETURN(peak, mean(world, peak, "calibrate peak"));
  double peak_low = 0, unaligned = 1;
  if (low) {
    TS_ASSIGN_OR_RETURN(peak_low, gemm_peak(world, o.reps, be, o.precision));
    TS_ASSIGN_OR_RETURN(peak_low, mean(world, peak_low, "calibrate low-precision peak"));
    TS_ASSIGN_OR_RETURN(const double unaligned_rate,
                        gemm_peak(world, o.reps, be, o.precision, /*unaligned=*/true));
    TS_ASSIGN_OR_RETURN(unaligned, mean(world, unaligned_rate / peak_low, "calibrate unaligned"));
    spec.device.unaligned_gemm_efficiency = std::clamp(unaligned, 1e-3, 1.0);
  }
  TS_ASSIGN_OR_RETURN(double bw, stream_bandwidth(world, o.reps, be));
  TS_ASSIGN_OR_RETURN(bw, mean(world, bw, "calibrate bandwidth"));
  spec.device.peak_flops_f32 = peak;
  spec.device.peak_flops_bf16 = spec.device.peak_flops_f16 = peak_low;  // 0: the f32 peak
  spec.device.memory_bandwidth = bw;
  spec.device.memory_bytes = device ? static_cast<double>(be.free_memory())
                                    : static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                                          static_cast<double>(sysconf(_SC_PAGE_SIZE)) / ranks;
  spec.device.sm_count = 0;
  spec.device.gemm_tile_m = spec.device.gemm_tile_n = 1;
  c.notes.push_back(
      format_string("GEMM %s: %.1f GFLOP/s f32%s per rank; streaming: %s/s per rank",
                    device ? "4096^3" : "1024^3", peak / 1e9,
                    low ? format_string(", %.1f %s (%.2f of it with an unaligned row)",
                                        peak_low / 1e9, dtype_name(o.precision), unaligned)
                              .c_str()
                        : "",
                    format_bytes(bw).c_str()));

  // 2. Every compute instruction of the real Program, timed one by one.
  TS_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(o.model));
  const int64_t batch = o.batch > 0 ? o.batch : 4 * ranks;
  TS_ASSIGN_OR_RETURN(std::unique_ptr<RealStep> real,
                      real_step(world, cfg, batch, o.seq, o.zero, be, o.precision));
  StepRunner* step = real->step.get();

  const Program& prog = step->program();
  const Graph& g = prog.local();
  std::vector<size_t> compute;
  for (size_t i = 0; i < prog.micro_step.size(); ++i)
    if (prog.micro_step[i].kind == Instruction::compute) compute.push_back(i);
  // Timed in place during real steps (collectives running, the comm thread competing), and the
  // optimizer's apply() after each.
  std::vector<std::vector<double>> t(compute.size());
  std::vector<double> seconds, apply_seconds;
  step->time_instructions(&seconds);
  for (int r = 0; r < o.reps; ++r) {
    TS_RETURN_IF_ERROR(world.barrier("calibrate ops"));
    TS_RETURN_IF_ERROR(
        step->forward_backward(token_feed(real->tokens.data(), real->targets.data())).status());
    for (size_t j = 0; j < compute.size(); ++j) t[j].push_back(seconds[compute[j]]);
    double t0 = now();  // forward_backward has waited for its work (it read the loss)
    TS_RETURN_IF_ERROR(step->apply(1e-4, 1.0).status());
    be.synchronize();
    apply_seconds.push_back(now() - t0);
  }
  step->time_instructions(nullptr);
  // Per op kind: efficiency = roofline time / measured time (minus the launch overhead). Where
  // a GEMM-bound kind beats the 1024^3 GEMM, the peak is raised until its efficiency is 1 (the
  // products peak x efficiency stay what was measured). Memory-bound kinds may exceed 1: their
  // tensors often stay in cache and beat the 32 MiB streaming bandwidth.
  std::vector<double> meas(compute.size());
  for (size_t j = 0; j < compute.size(); ++j) meas[j] = median(t[j]);
  const std::map<std::string, double> costed{{"reshape", 1.0}};  // the CPU backend copies
  auto is_compute_kind = [](OpKind k) {
    return is_gemm(k) || k == OpKind::attention || k == OpKind::attention_grad;
  };
  std::map<std::string, OpFit> fit;
  OpFit memory_ops;
  double launch = 0;
  for (int pass = 0; pass < 4; ++pass) {
    DeviceSpec ideal = spec.device;
    ideal.gemm_efficiency = ideal.memory_efficiency = ideal.attention_efficiency = 1.0;
    ideal.launch_overhead = 0;
    std::vector<double> roof(compute.size()), tiny;
    for (size_t j = 0; j < compute.size(); ++j) {
      roof[j] =
          op_time(g, g.node(prog.micro_step[compute[j]].node), ideal, costed, o.precision).seconds;
      if (roof[j] < 2e-7) tiny.push_back(meas[j]);
    }
    if (pass == 0) {
      launch = tiny.size() >= 3 ? median(tiny) : *std::min_element(meas.begin(), meas.end());
      TS_ASSIGN_OR_RETURN(launch, mean(world, launch, "calibrate launch"));
    }
    fit.clear();
    memory_ops = OpFit{};
    for (size_t j = 0; j < compute.size(); ++j) {
      const Node& n = g.node(prog.micro_step[compute[j]].node);
      OpFit& f = fit[op_name(n.op)];
      double m_s = std::max(meas[j] - launch, 1e-9);
      f.roofline += roof[j];
      f.measured += m_s;
      if (!is_compute_kind(n.op)) memory_ops.roofline += roof[j], memory_ops.measured += m_s;
    }
    double over_compute = 1;
    for (auto& [name, f] : fit) {  // the same kinds, in the same order, on every rank
      TS_ASSIGN_OR_RETURN(double e, mean(world, f.roofline / f.measured, "calibrate " + name));
      spec.op_efficiency[name] = e;
      OpKind k;
      if (op_from_name(name, &k) && is_compute_kind(k)) over_compute = std::max(over_compute, e);
    }
    if (over_compute <= 1.0001) break;
    (low ? spec.device.peak_flops_bf16 : spec.device.peak_flops_f32) *= over_compute;
    spec.device.peak_flops_f16 = spec.device.peak_flops_bf16;
  }
  for (auto& [name, e] : spec.op_efficiency) e = std::clamp(e, 1e-4, 100.0);
  spec.device.launch_overhead = launch;
  TS_ASSIGN_OR_RETURN(double mem_eff, mean(world, memory_ops.roofline / memory_ops.measured,
                                           "calibrate memory ops"));
  spec.device.memory_efficiency = std::clamp(mem_eff, 1e-4, 1.0);  // for kinds not measured
  if (fit.count("matmul"))
    spec.device.gemm_efficiency = std::min(1.0, spec.op_efficiency["matmul"]);
  if (fit.count("attention"))
    spec.device.attention_efficiency = std::min(1.0, spec.op_efficiency["attention"]);
  c.notes.push_back(
      format_string("%zu compute instructions of %s (batch %lld x %lld, %s), "
                    "%d reps: launch %.1f us; efficiency matmul %.2f, memory-bound "
                    "ops %.2f",
                    compute.size(), cfg.name.c_str(), (long long)batch, (long long)o.seq,
                    prog.plan.describe().c_str(), o.reps, 1e6 * launch, spec.device.gemm_efficiency,
                    spec.device.memory_efficiency));

  const SimOptions sim{.precision = o.precision};
  // The optimizer (AdamW over this rank's blocks, the gradient norm): its measured time
  // against the simulator's at efficiency 1.
  {
    TS_ASSIGN_OR_RETURN(double apply_s, mean(world, median(apply_seconds), "calibrate apply"));
    ClusterSpec probe = spec;
    probe.device.optimizer_efficiency = 1.0;
    TS_ASSIGN_OR_RETURN(SimResult pr, simulate(prog, probe, sim));
    spec.device.optimizer_efficiency = std::clamp(pr.optimizer_seconds / apply_s, 1e-3, 1.0);
    c.notes.push_back(format_string("optimizer step %.2f ms: %.2f of the streaming bandwidth",
                                    1e3 * apply_s, spec.device.optimizer_efficiency));
  }

  // The host side, for an offloaded optimizer: the node's streaming bandwidth (every rank's at
  // once), the host AdamW's share of it, and each rank's link to host memory.
  {
    TS_ASSIGN_OR_RETURN(HostRates h, host_rates(world, o.reps, be));
    TS_ASSIGN_OR_RETURN(h.stream, mean(world, h.stream, "calibrate host stream"));
    TS_ASSIGN_OR_RETURN(h.adamw, mean(world, h.adamw, "calibrate host adamw"));
    TS_ASSIGN_OR_RETURN(h.link, mean(world, h.link, "calibrate host link"));
    spec.node.host_memory_bytes =
        static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
    spec.node.host_memory_bandwidth = h.stream * ranks;
    spec.node.host_optimizer_efficiency = std::clamp(h.adamw / h.stream, 1e-3, 1.0);
    spec.node.host_link_bandwidth = h.link;
    spec.node.host_link_efficiency = 1.0;  // the rate above is itself a measured one
    c.notes.push_back(format_string(
        "host (offloaded optimizer): streaming %s/s per rank, AdamW %.2f of it; link %s/s",
        format_bytes(h.stream).c_str(), spec.node.host_optimizer_efficiency,
        format_bytes(h.link).c_str()));
  }

  // 3. The links between the ranks of this machine.
  if (ranks > 1) {
    TS_RETURN_IF_ERROR(fit_collectives(world, o.reps, &spec, &c.notes));
    // How much of the collectives' time the compute stream loses to the comm thread: the real
    // step of the measured plan against the simulator with free overlap.
    TS_ASSIGN_OR_RETURN(double step_s, timed(world, o.reps, [&] { return real->run(); }));
    TS_ASSIGN_OR_RETURN(step_s, mean(world, step_s, "calibrate overlap"));
    spec.node.comm_overlap = 1.0;
    TS_ASSIGN_OR_RETURN(SimResult free_overlap, simulate(prog, spec, sim));
    double gap = step_s - free_overlap.step_seconds;
    spec.node.comm_overlap = free_overlap.comm_seconds > 0
                                 ? std::clamp(1 - gap / free_overlap.comm_seconds, 0.0, 1.0)
                                 : 1.0;
    c.notes.push_back(
        format_string("step %.2f ms against %.2f ms simulated with free overlap: "
                      "comm_overlap %.2f",
                      1e3 * step_s, 1e3 * free_overlap.step_seconds, spec.node.comm_overlap));
  } else {
    spec.node.intra_bandwidth = bw;  // unused with one rank; must be positive
  }

  // 4. The check: the real step against the simulator on the spec just measured.
  if (o.check_steps > 0) {
    const int zero = o.check_zero >= 0 ? o.check_zero : o.zero;
    const int64_t check_batch = o.check_batch > 0 ? o.check_batch : batch;
    real.reset();
    TS_ASSIGN_OR_RETURN(
        real, real_step(world, cfg, check_batch, o.seq, zero, be, o.precision, o.check_offload));
    real->step->executor().paint_arena();
    std::vector<double> optimizer, steps;
    TS_ASSIGN_OR_RETURN(
        double measured, timed(world, o.check_steps, [&]() -> Status {
          double s0 = now();
          TS_RETURN_IF_ERROR(
              real->step->forward_backward(token_feed(real->tokens.data(), real->targets.data()))
                  .status());
          double t0 = now();
          TS_RETURN_IF_ERROR(real->step->apply(1e-4, 1.0).status());
          be.synchronize();
          optimizer.push_back(now() - t0);
          steps.push_back(now() - s0);
          return Status();
        }));
    TS_ASSIGN_OR_RETURN(c.measured_step, mean(world, measured, "calibrate step"));
    const auto [fastest, slowest] = std::minmax_element(steps.begin(), steps.end());
    TS_ASSIGN_OR_RETURN(
        c.measured_step_noise,
        world.all_reduce_scalar((*slowest - *fastest) / median(steps), true, "calibrate noise"));
    TS_ASSIGN_OR_RETURN(c.measured_optimizer,
                        mean(world, median(optimizer), "calibrate optimizer"));
    TS_ASSIGN_OR_RETURN(SimResult r, simulate(real->step->program(), spec, sim));
    c.predicted_step = r.step_seconds;
    c.predicted_optimizer = o.check_offload ? r.offload_seconds : r.optimizer_seconds;
    c.predicted_host_bytes = r.host_bytes;
    c.measured_host_bytes = static_cast<double>(real->step->host_state_bytes_allocated());
    c.predicted_peak_memory = r.peak_memory_bytes;
    c.measured_peak_memory = static_cast<double>(real->step->executor().measured_high_water() +
                                                 real->step->state_bytes_allocated());
    c.notes.push_back(format_string("check: %s, batch %lld x %lld, %d steps",
                                    real->step->program().plan.describe().c_str(),
                                    (long long)check_batch, (long long)o.seq, o.check_steps));
  }
  return c;
}

}  // namespace tessera
