#include "planner/planner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "base/format.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/sharding_search.h"

namespace tessera {

namespace {

std::vector<int> divisors(int64_t n) {
  std::vector<int> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(static_cast<int>(d));
  return out;
}

bool power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// The parameters that multiply activations in a GEMM: all but the embedding table of an untied
// model (a gather) and GPT's position table.
double matmul_params(const ModelConfig& cfg) {
  double n = static_cast<double>(count_params(cfg));
  if (!cfg.tied_embeddings)
    n -= static_cast<double>(cfg.padded_vocab_size > 0 ? cfg.padded_vocab_size : cfg.vocab_size) *
         static_cast<double>(cfg.n_embd);
  if (cfg.family == "gpt")
    n -= static_cast<double>(cfg.max_seq_len) * static_cast<double>(cfg.n_embd);
  return std::max(n, 0.0);
}

// Every plan of the search space for `gpus` devices (bounds not yet computed).
std::vector<PlanCandidate> enumerate(const ModelConfig& cfg, const ClusterSpec& cluster,
                                     const PlannerOptions& o, int64_t batch) {
  std::vector<PlanCandidate> out;
  const int per_node = std::max(1, cluster.node.devices);
  for (int tp : divisors(o.gpus)) {
    // Tensor parallelism within a node, on whole heads (and key/value heads).
    if (!power_of_two(tp) || tp > per_node || cfg.n_head % tp != 0) continue;
    if (cfg.n_kv_head > 0 && cfg.n_kv_head % tp != 0 && tp % cfg.n_kv_head != 0) continue;
    for (int pp : divisors(o.gpus / tp)) {
      if (pp > cfg.n_layer) continue;
      const int dp = o.gpus / (tp * pp);
      if (batch % dp != 0) continue;
      const int64_t rows = batch / dp;  // sequences per data-parallel rank per step
      for (int mb : divisors(rows)) {
        if (mb > o.max_micro_batch) continue;
        const int m = static_cast<int>(rows / mb);
        struct Sched {
          ScheduleKind kind;
          int v;
        };
        std::vector<Sched> scheds = {{ScheduleKind::one_f_one_b, 1}};
        if (pp > 1) {
          scheds.push_back({ScheduleKind::zb_h1, 1});
          if (m % pp == 0 && 2 * pp <= cfg.n_layer)
            scheds.push_back({ScheduleKind::interleaved, 2});
        }
        for (const Sched& s : scheds)
          for (int zero : pp > 1 ? std::vector<int>{1} : std::vector<int>{1, 3})
            for (bool sp :
                 tp > 1 && pp == 1 ? std::vector<bool>{false, true} : std::vector<bool>{false})
              for (RecomputePolicy rc :
                   {RecomputePolicy::none, RecomputePolicy::selective, RecomputePolicy::full}) {
                PlanCandidate c;
                c.plan = pp > 1   ? Plan::pipeline_parallel(pp, dp, tp, zero)
                         : tp > 1 ? Plan::tensor_parallel(dp, tp, zero)
                                  : Plan::data_parallel(dp, zero);
                c.plan.micro_batches = m;
                c.plan.recompute = rc;
                c.plan.sequence_parallel = sp;
                if (pp > 1) {
                  c.plan.schedule = s.kind;
                  c.plan.virtual_stages = s.v;
                }
                c.micro_batch = mb;
                out.push_back(std::move(c));
              }
      }
    }
  }
  return out;
}

struct GraphCache {
  std::mutex mu;
  std::map<int64_t, std::shared_ptr<const ModelGraph>> graphs;  // by global micro-batch
  std::shared_ptr<const ModelGraph> get(const ModelConfig& cfg, int64_t batch, int64_t seq) {
    {
      std::lock_guard<std::mutex> l(mu);
      auto it = graphs.find(batch);
      if (it != graphs.end()) return it->second;
    }
    auto g = std::make_shared<const ModelGraph>(build_model(cfg, batch, seq, ModelMode::train));
    std::lock_guard<std::mutex> l(mu);
    return graphs.emplace(batch, g).first->second;
  }
};

// Lowers and times candidate c (placing its parameters when it has a tensor axis).
void simulate_candidate(const ModelConfig& cfg, const ClusterSpec& cluster, const PlannerOptions& o,
                        int64_t seq, GraphCache& cache, PlanCandidate* c) {
  const int64_t global_mb = c->micro_batch * c->plan.data_group();
  std::shared_ptr<const ModelGraph> m = cache.get(cfg, global_mb, seq);
  if (c->plan.tensor_group() > 1) {
    SearchCost cost{flops_per_intra_byte(cluster, o.precision)};
    Result<BlockLayout> b = place_tensor_parallel(cfg, global_mb, seq, m->graph, cost, &c->plan);
    if (!b.ok()) {
      c->error = b.status().message();
      return;
    }
  }
  SimOptions so;
  so.precision = o.precision;
  Result<SimResult> r = simulate_plan(m->graph, c->plan, cluster, so);
  if (!r.ok()) {
    c->error = r.status().message();
    return;
  }
  c->sim = std::move(r.value());
  c->plan.stage_layers = c->sim.stage_layers;
  c->simulated = true;
}

}  // namespace

std::string PlanCandidate::describe() const {
  const Plan& p = plan;
  std::string s = "tp=" + std::to_string(p.tensor_group()) + " pp=" + std::to_string(p.stages()) +
                  " dp=" + std::to_string(p.data_group()) + " zero=" + std::to_string(p.zero) +
                  " mb=" + std::to_string(micro_batch) + "x" + std::to_string(p.micro_batches);
  if (p.stages() > 1) {
    s += std::string(" ") + schedule_name(p.schedule);
    if (p.virtual_stages > 1) s += " v=" + std::to_string(p.virtual_stages);
  }
  s += std::string(" rc=") + recompute_name(p.recompute);
  if (p.sequence_parallel) s += " sp";
  return s;
}

double plan_memory_bound(const ModelConfig& cfg, const Plan& plan, DType precision) {
  const double per_rank = static_cast<double>(count_params(cfg)) /
                          static_cast<double>(plan.tensor_group() * plan.stages());
  const double dp = static_cast<double>(plan.zero_group());
  const double master = 4.0 / (plan.shards_params() ? dp : 1.0);
  const double moments = 8.0 / (plan.shards_optimizer() ? dp : 1.0);
  const double copy = precision == DType::f32 || plan.shards_params()
                          ? 0.0
                          : static_cast<double>(dtype_size(precision));
  return per_rank * (master + moments + copy);
}

double plan_time_bound(const ModelConfig& cfg, const ClusterSpec& cluster, const Plan& plan,
                       int64_t global_batch, int64_t seq, DType precision) {
  const double tokens = static_cast<double>(global_batch) * static_cast<double>(seq);
  const double passes = plan.recompute == RecomputePolicy::full ? 8.0 : 6.0;  // FLOPs per param
  const double flops = passes * matmul_params(cfg) * tokens;
  const double rate = static_cast<double>(plan.mesh.size()) * cluster.device.peak_flops(precision) *
                      cluster.device.gemm_efficiency;
  double stretch = 1.0;
  if (plan.stages() > 1) {
    double idle = static_cast<double>(plan.stages() - 1);
    if (plan.schedule == ScheduleKind::interleaved) idle /= plan.virtual_stages;
    if (plan.schedule == ScheduleKind::zb_h1) idle /= 3.0;
    stretch = (static_cast<double>(plan.micro_batches) + idle) / plan.micro_batches;
  }
  return flops / rate * stretch;
}

Result<PlanSearch> search_plans(const ModelConfig& cfg, const ClusterSpec& cluster,
                                const PlannerOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  PlannerOptions o = opt;
  if (o.gpus < 1) return error("--gpus must be at least 1, got " + std::to_string(o.gpus));
  if (o.top_k < 1) return error("--top must be at least 1, got " + std::to_string(o.top_k));
  if (o.global_batch < 0)
    return error("--batch (sequences per step) must be positive, got " +
                 std::to_string(o.global_batch));
  const int64_t seq = o.seq > 0 ? o.seq : cfg.max_seq_len;
  if (seq > cfg.max_seq_len)
    return error("--seq " + std::to_string(seq) + " exceeds the model's max_seq_len " +
                 std::to_string(cfg.max_seq_len));
  const int64_t batch = o.global_batch > 0 ? o.global_batch : o.gpus;
  const double capacity = cluster.device.memory_bytes;

  PlanSearch out;
  std::vector<PlanCandidate> cands = enumerate(cfg, cluster, o, batch);
  out.enumerated = static_cast<int>(cands.size());
  if (cands.empty())
    return error("no plan splits a batch of " + std::to_string(batch) + " sequences over " +
                     std::to_string(o.gpus) + " devices",
                 "use a --batch that a power-of-two share of the devices divides (e.g. " +
                     std::to_string(o.gpus) + ")");
  // Memory bound first: what cannot fit is never lowered.
  double smallest_bound = 1e300;
  std::vector<PlanCandidate> alive;
  for (PlanCandidate& c : cands) {
    c.memory_bound = plan_memory_bound(cfg, c.plan, o.precision);
    smallest_bound = std::min(smallest_bound, c.memory_bound);
    if (c.memory_bound > capacity) {
      ++out.pruned_by_memory;
      continue;
    }
    c.time_bound = plan_time_bound(cfg, cluster, c.plan, batch, seq, o.precision);
    alive.push_back(std::move(c));
  }
  std::stable_sort(alive.begin(), alive.end(), [](const PlanCandidate& a, const PlanCandidate& b) {
    return a.time_bound < b.time_bound;
  });

  // Simulate in order of the time bound until the bound cannot beat the K-th fitting plan.
  GraphCache cache;
  std::mutex mu;
  std::vector<double> fitting;  // step times of fitting plans, ascending
  std::atomic<size_t> next{0};
  auto kth = [&] {
    return fitting.size() >= static_cast<size_t>(o.top_k) ? fitting[size_t(o.top_k) - 1] : 1e300;
  };
  auto worker = [&] {
    for (size_t i; (i = next++) < alive.size();) {
      {
        std::lock_guard<std::mutex> l(mu);
        if (alive[i].time_bound >= kth()) return;  // sorted: no later one can win either
      }
      simulate_candidate(cfg, cluster, o, seq, cache, &alive[i]);
      std::lock_guard<std::mutex> l(mu);
      if (alive[i].fits(capacity)) {
        fitting.insert(std::upper_bound(fitting.begin(), fitting.end(), alive[i].sim.step_seconds),
                       alive[i].sim.step_seconds);
      }
    }
  };
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();

  double smallest_peak = 1e300;
  const PlanCandidate* smallest = nullptr;
  for (PlanCandidate& c : alive) {
    if (!c.error.empty()) ++out.failed;
    if (!c.simulated) continue;
    ++out.simulated;
    if (c.sim.peak_memory_bytes < smallest_peak) {
      smallest_peak = c.sim.peak_memory_bytes;
      smallest = &c;
    }
    out.all.push_back(c);
  }
  std::stable_sort(out.all.begin(), out.all.end(),
                   [&](const PlanCandidate& a, const PlanCandidate& b) {
                     if (a.fits(capacity) != b.fits(capacity)) return a.fits(capacity);
                     return a.sim.step_seconds < b.sim.step_seconds;
                   });
  for (const PlanCandidate& c : out.all)
    if (c.fits(capacity) && out.best.size() < static_cast<size_t>(o.top_k)) out.best.push_back(c);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (out.best.empty()) {
    const std::string dev = std::to_string(o.gpus) + " x " + cluster.device.name + " (" +
                            format_bytes(capacity) + " each)";
    if (smallest != nullptr)
      return error("no plan of " + cfg.name + " fits on " + dev + ": the smallest, " +
                       smallest->describe() + ", needs " + format_bytes(smallest_peak) +
                       " per device",
                   "use more devices, a smaller --batch or --seq, or a device with more memory");
    return error(
        "no plan of " + cfg.name + " fits on " + dev +
            ": its parameters and optimizer state alone need at least " +
            format_bytes(smallest_bound) + " per device",
        "use at least " +
            std::to_string(static_cast<int64_t>(std::ceil(smallest_bound / capacity * o.gpus))) +
            " devices, or a device with more memory");
  }
  return out;
}

}  // namespace tessera
