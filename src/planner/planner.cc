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
#include "cost/op_cost.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/recompute.h"
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

// The time bound extrapolates a rank's compute from models of one and two blocks and assumes
// stages of equal cost; it leaves this much room for what that misses.
constexpr double kShapeMargin = 0.95;

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

// The tensor-parallel placements of each (tp, sequence parallel) pair, searched once on a
// one-block model of one sequence per micro-batch over a mesh {dp: 1, tp} (the search weighs
// local FLOPs against tensor-axis bytes, which both scale with the batch), and laid onto any
// mesh with that tensor axis. Thread-safe; deterministic whatever order candidates ask in.
class Placements {
 public:
  Placements(const ModelConfig& cfg, const ClusterSpec& cluster, int64_t seq, DType precision)
      : cfg_(cfg), seq_(seq), cost_{flops_per_intra_byte(cluster, precision)} {}

  // Writes plan->params for graph g (plan's tensor axis "tp").
  Status place(const Graph& g, Plan* plan) {
    if (plan->tensor_group() == 1) return Status();
    TS_ASSIGN_OR_RETURN(std::shared_ptr<const BlockLayout> b,
                        layout(plan->tensor_group(), plan->sequence_parallel));
    Plan flat = Plan::tensor_parallel(1, plan->tensor_group());
    flat.sequence_parallel = plan->sequence_parallel;
    TS_ASSIGN_OR_RETURN(auto params, expand_block_layout(*b, g, flat));
    const int tp_axis = plan->mesh.axis_index("tp");
    plan->params.clear();
    for (const auto& [name, pl] : params) {
      std::vector<Placement> on(plan->mesh.axes().size(), Placement::replicate());
      on[static_cast<size_t>(tp_axis)] = pl[1];
      plan->params[name] = on;
    }
    return Status();
  }

 private:
  Result<std::shared_ptr<const BlockLayout>> layout(int tp, bool sp) {
    std::lock_guard<std::mutex> l(mu_);  // one search at a time; each runs once
    const auto key = std::make_pair(tp, sp);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    ModelConfig one = cfg_;
    one.n_layer = 1;
    ModelGraph m = build_model(one, 1, seq_, ModelMode::train);
    Plan flat = Plan::tensor_parallel(1, tp);
    flat.sequence_parallel = sp;
    TS_ASSIGN_OR_RETURN(BlockLayout b, search_block_layout(m.graph, flat, cost_));
    return cache_[key] = std::make_shared<const BlockLayout>(std::move(b));
  }

  const ModelConfig& cfg_;
  int64_t seq_;
  SearchCost cost_;
  std::mutex mu_;
  std::map<std::pair<int, bool>, std::shared_ptr<const BlockLayout>> cache_;
};

// One tensor-parallel rank's compute seconds for one micro-batch of `rows` sequences of the
// whole model: the ops of the graph it executes (partitioned over tp with the candidate's
// placements and sequence parallelism, recomputation applied; collectives left out) timed by the
// cost model, from models of one and two blocks (the time is linear in the depth).
class ComputeTimes {
 public:
  ComputeTimes(const ModelConfig& cfg, const ClusterSpec& cluster, int64_t seq, DType precision,
               Placements& placements)
      : cfg_(cfg), cluster_(cluster), seq_(seq), precision_(precision), placements_(placements) {}

  Result<double> seconds(const Plan& cand, int64_t rows) {
    const auto key = std::make_tuple(rows, static_cast<int>(cand.recompute), cand.tensor_group(),
                                     cand.sequence_parallel);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    double t[2];
    for (int blocks = 1; blocks <= 2; ++blocks) {
      ModelConfig c = cfg_;
      c.n_layer = blocks;
      ModelGraph m = build_model(c, rows, seq_, ModelMode::train);
      Plan p = Plan::tensor_parallel(1, cand.tensor_group());
      p.sequence_parallel = cand.sequence_parallel;
      p.recompute = cand.recompute;
      TS_RETURN_IF_ERROR(placements_.place(m.graph, &p));
      TS_ASSIGN_OR_RETURN(Program prog, lower(m.graph, p));
      const Graph& local = prog.local();
      double sum = 0;
      for (const Node& n : local.nodes())
        if (!is_collective(n.op))
          sum += op_time(local, n, cluster_.device, cluster_.op_efficiency, precision_).seconds;
      t[blocks - 1] = sum;
    }
    const double block = t[1] - t[0], outside = t[0] - block;
    return cache_[key] = outside + block * static_cast<double>(cfg_.n_layer);
  }

 private:
  const ModelConfig& cfg_;
  const ClusterSpec& cluster_;
  int64_t seq_;
  DType precision_;
  Placements& placements_;
  std::map<std::tuple<int64_t, int, int, bool>, double> cache_;
};

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

// Lowers and times candidate c (its parameters placed by `placements`).
void simulate_candidate(const ModelConfig& cfg, const ClusterSpec& cluster, const PlannerOptions& o,
                        int64_t seq, GraphCache& cache, Placements& placements, PlanCandidate* c) {
  const int64_t global_mb = c->micro_batch * c->plan.data_group();
  std::shared_ptr<const ModelGraph> m = cache.get(cfg, global_mb, seq);
  Status placed = placements.place(m->graph, &c->plan);
  if (!placed.ok()) {
    c->error = placed.message();
    return;
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

double optimizer_time_bound(const ModelConfig& cfg, const ClusterSpec& cluster, const Plan& plan) {
  // AdamW reads the parameter, gradient and two moments and writes three (fp32) per element of
  // this rank's share (ZeRO-1 and up: 1 / dp of it), at the device's streaming bandwidth.
  const double elems = static_cast<double>(count_params(cfg)) /
                       static_cast<double>(plan.tensor_group() * plan.stages()) /
                       (plan.shards_optimizer() ? static_cast<double>(plan.zero_group()) : 1.0);
  return 7.0 * 4.0 * elems / (cluster.device.memory_bandwidth * cluster.device.memory_efficiency);
}

double plan_time_bound(const Plan& plan, double micro_batch_seconds, double optimizer_seconds) {
  double stretch = 1.0;
  if (plan.stages() > 1) {
    double idle = static_cast<double>(plan.stages() - 1);
    if (plan.schedule == ScheduleKind::interleaved) idle /= plan.virtual_stages;
    if (plan.schedule == ScheduleKind::zb_h1) idle /= 3.0;
    stretch = (static_cast<double>(plan.micro_batches) + idle) / plan.micro_batches;
  }
  return kShapeMargin *
         (micro_batch_seconds * plan.micro_batches / plan.stages() * stretch + optimizer_seconds);
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
  Placements placements(cfg, cluster, seq, o.precision);
  ComputeTimes times(cfg, cluster, seq, o.precision, placements);
  for (PlanCandidate& c : cands) {
    c.memory_bound = plan_memory_bound(cfg, c.plan, o.precision);
    smallest_bound = std::min(smallest_bound, c.memory_bound);
    if (c.memory_bound > capacity) {
      ++out.pruned_by_memory;
      continue;
    }
    Result<double> t = times.seconds(c.plan, c.micro_batch);
    if (!t.ok()) {  // the plan does not lower (an op refuses the layout): not a candidate
      ++out.failed;
      continue;
    }
    c.time_bound = plan_time_bound(c.plan, t.value(), optimizer_time_bound(cfg, cluster, c.plan));
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
      simulate_candidate(cfg, cluster, o, seq, cache, placements, &alive[i]);
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
        "use more devices (this state spread over about " +
            std::to_string(static_cast<int64_t>(std::ceil(smallest_bound / capacity * o.gpus))) +
            " of them would fit), or a device with more memory");
  }
  return out;
}

}  // namespace tessera
