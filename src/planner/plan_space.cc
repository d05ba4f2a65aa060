// PlanSpace: the planner's candidates, their bounds and their simulations (planner/planner.h).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "cost/op_cost.h"
#include "parallel/fuse.h"
#include "parallel/memory_plan.h"
#include "parallel/partition.h"
#include "parallel/pipeline_program.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_stages.h"
#include "parallel/program.h"
#include "parallel/recompute.h"
#include "parallel/sharding_search.h"
#include "planner/plan_enumerate.h"
#include "planner/planner.h"

namespace tessera {

namespace {

// Runs `worker` on `threads` threads and waits for them all.
void on_threads(int threads, const std::function<void()>& worker) {
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
}

// The placement search of one block (the slowest part of creating a space: a LLaMA block
// tries 654 layouts), kept for the process: the spaces of --explain's what-ifs and of the
// tests share it. Searches of different keys run at once; each key runs once.
Result<std::shared_ptr<const BlockLayout>> block_layout(const ModelConfig& cfg, int64_t seq, int tp,
                                                        bool sp, const SearchCost& cost) {
  struct Entry {
    ModelConfig cfg;
    int64_t seq;
    int tp;
    bool sp;
    double flops_per_byte;
    std::once_flag once;
    Result<std::shared_ptr<const BlockLayout>> layout = error("not searched");
  };
  static std::mutex mu;
  static std::list<Entry> memo;  // a list: entries never move
  ModelConfig one = cfg;
  one.n_layer = 1;
  one.name.clear();
  Entry* e = nullptr;
  {
    std::lock_guard<std::mutex> l(mu);
    for (Entry& x : memo)
      if (x.cfg == one && x.seq == seq && x.tp == tp && x.sp == sp &&
          x.flops_per_byte == cost.flops_per_byte)
        e = &x;
    if (e == nullptr) {
      e = &memo.emplace_back();
      e->cfg = one, e->seq = seq, e->tp = tp, e->sp = sp, e->flops_per_byte = cost.flops_per_byte;
    }
  }
  std::call_once(e->once, [&] {
    ModelGraph m = build_model(one, 1, seq, ModelMode::train);
    Plan flat = Plan::tensor_parallel(1, tp);
    flat.sequence_parallel = sp;
    Result<BlockLayout> b = search_block_layout(m.graph, flat, cost);
    if (b.ok())
      e->layout = std::make_shared<const BlockLayout>(std::move(b.value()));
    else
      e->layout = b.status();
  });
  return e->layout;
}

// The tensor-parallel placements of each (tp, sequence parallel) pair, searched on a one-block
// model of one sequence per micro-batch over a mesh {dp: 1, tp} (the search weighs local FLOPs
// against tensor-axis bytes, which both scale with the batch), and laid onto any mesh with that
// tensor axis. Thread-safe; deterministic whatever order candidates ask in.
class Placements {
 public:
  Placements(const ModelConfig& cfg, const ClusterSpec& cluster, int64_t seq, DType precision)
      : cfg_(cfg), seq_(seq), cost_{flops_per_intra_byte(cluster, precision)} {}

  // Writes plan->params for graph g (plan's tensor axis "tp").
  Status place(const Graph& g, Plan* plan) {
    if (plan->tensor_group() == 1) return Status();
    TS_ASSIGN_OR_RETURN(
        std::shared_ptr<const BlockLayout> b,
        block_layout(cfg_, seq_, plan->tensor_group(), plan->sequence_parallel, cost_));
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
  const ModelConfig& cfg_;
  int64_t seq_;
  SearchCost cost_;
};

// What one tensor-parallel rank spends on one micro-batch of `rows` sequences: the compute
// seconds of the whole model (the ops of the graph it executes, partitioned over tp with the
// candidate's placements and sequence parallelism, recomputation applied, collectives left out,
// timed by the cost model) and the activation bytes one block keeps from its forward pass for
// its backward pass. Both from a one-block model lowered for the key: the block's ops times the
// depth, plus the ops outside the blocks (embedding, final norm, head, loss).
struct MicroBatchCost {
  MicroBatchTime time;               // block_seconds: what the second block adds
  double saved_bytes_per_block = 0;  // at the run's precision (the arena's scale)
  std::vector<ParamTensors> params;  // the whole model's, on one tensor-parallel rank
  PipelineCosts pipe;                // per block of the whole model (none for T5)
};

class MicroBatchCosts {
 public:
  MicroBatchCosts(const ModelConfig& cfg, const ClusterSpec& cluster, int64_t seq, DType precision,
                  bool fp8, Placements& placements)
      : cfg_(cfg),
        cluster_(cluster),
        seq_(seq),
        precision_(precision),
        fp8_(fp8),
        placements_(placements) {}

  // Costs every (rows, recompute, tp, sequence parallel, context parallel) the candidates need,
  // on `threads` threads.
  void prepare(const std::vector<PlanCandidate>& cands, int threads) {
    for (const PlanCandidate& c : cands) cache_.emplace(key(c.plan, c.micro_batch), error("none"));
    std::vector<std::map<Key, Result<MicroBatchCost>>::iterator> todo;
    for (auto it = cache_.begin(); it != cache_.end(); ++it) todo.push_back(it);
    std::atomic<size_t> next{0};
    auto worker = [&] {
      for (size_t i; (i = next++) < todo.size();) todo[i]->second = cost(todo[i]->first);
    };
    on_threads(threads, worker);
  }

  // After prepare(); errors when the plan does not lower.
  const Result<MicroBatchCost>& of(const Plan& cand, int64_t rows) const {
    return cache_.at(key(cand, rows));
  }

 private:
  // (rows, recompute, tp, sp, cp, zigzag, ring)
  using Key = std::tuple<int64_t, int, int, bool, int, bool, bool>;
  static Key key(const Plan& p, int64_t rows) {
    return {rows,
            static_cast<int>(p.recompute),
            p.tensor_group(),
            p.sequence_parallel,
            p.context_group(),
            p.context_order == ContextOrder::zigzag,
            p.context_attention == ContextAttention::ring};
  }

  // Compute seconds (all, and the forward pass's) and kept bytes of the ops of a model of
  // `blocks` blocks lowered for key k.
  // Parameter tensors by (local elements, read by the backward pass, split over tp): how many.
  // (and an expert-stacked tensor, which an expert axis splits): how many.
  using Tensors = std::map<std::tuple<int64_t, bool, bool, bool>, double>;
  struct Measured {
    double seconds = 0, forward_seconds = 0, waits = 0, forward_waits = 0, kept = 0;
    double context_comm = 0;  // the context axis's collectives, one after another
    Tensors params;
    LayerCosts flops, forward, backward;  // by block (pipeline_schedule_bound)
  };
  Result<Measured> measure(const Key& k, int64_t blocks) {
    const auto [rows, rc, tp, sp, cp, zigzag, ring] = k;
    ModelConfig c = cfg_;
    c.n_layer = blocks;
    ModelGraph m = build_model(c, rows, seq_, ModelMode::train);
    Plan p = Plan::tensor_parallel(1, tp);
    TS_RETURN_IF_ERROR(add_context_axis(&p, cp));  // one rank's chunk of every sequence
    if (zigzag) p.context_order = ContextOrder::zigzag;
    if (ring) p.context_attention = ContextAttention::ring;
    p.sequence_parallel = sp;
    p.recompute = static_cast<RecomputePolicy>(rc);
    TS_RETURN_IF_ERROR(placements_.place(m.graph, &p));
    // The local graph lower() would build (partitioned after recomputation, then fused),
    // without the memory plan and instructions it adds.
    Graph recomputed;
    if (p.recompute != RecomputePolicy::none) {
      TS_ASSIGN_OR_RETURN(recomputed, apply_recompute(m.graph, p.recompute));
    }
    TS_ASSIGN_OR_RETURN(Partitioned part,
                        partition(p.recompute == RecomputePolicy::none ? m.graph : recomputed, p));
    if (p.fuse) TS_RETURN_IF_ERROR(fuse_epilogues(&part));
    const Graph& local = part.local;
    const std::vector<Node>& nodes = local.nodes();
    const size_t boundary = static_cast<size_t>(
        std::find_if(nodes.begin(), nodes.end(), in_backward_pass) - nodes.begin());
    Measured out;
    const double scale = static_cast<double>(dtype_size(precision_)) / 4.0;
    // The compute stream as the simulator runs the micro-step (sim/simulator.cc), every
    // collective started once the stream has issued it and its input is ready, never queued
    // behind another: the ops, and the waits on the tensor-parallel collectives.
    const std::vector<Instruction> list = lower_instructions(local, {});
    std::vector<double> end(list.size(), 0.0);
    std::vector<double> op_seconds(nodes.size(), 0.0);
    double compute = 0;
    for (size_t i = 0; i < list.size(); ++i) {
      const Instruction& in = list[i];
      double ready = 0;
      for (int d : in.deps) ready = std::max(ready, end[static_cast<size_t>(d)]);
      const Node& n = local.node(in.node);
      if (in.kind == Instruction::start) {
        const std::vector<std::string> axes = axes_of_key(n.attr<GroupAttrs>().axes);
        const GroupLayout group = group_layout(p.mesh, axes, cluster_.node.devices);
        const double pieces = collective_pieces(n);
        const double t = pieces * collective_time(n.op, collective_bytes(local, n, scale) / pieces,
                                                  group, cluster_)
                                      .seconds;
        end[i] = std::max(ready, compute) + t;
        if (std::count(axes.begin(), axes.end(), p.context_axis)) out.context_comm += t;
      } else if (in.kind == Instruction::wait) {
        const double idle = std::max(0.0, ready - compute);
        // The block's, for its stage; but for the context axis's gathers, which the simulator
        // overlaps with attention in ways these waits do not bound.
        const std::vector<std::string> axes = axes_of_key(n.attr<GroupAttrs>().axes);
        if (!std::count(axes.begin(), axes.end(), p.context_axis))
          op_seconds[static_cast<size_t>(in.node)] += idle;
        out.waits += idle;
        if (!in_backward_pass(n)) out.forward_waits += idle;
        end[i] = compute = std::max(compute, ready);
      } else {
        const double t =
            op_time(local, n, cluster_.device, cluster_.op_efficiency, precision_, fp8_).seconds;
        end[i] = compute = std::max(compute, ready) + t;
        op_seconds[static_cast<size_t>(in.node)] = t;
        if (!in_backward_pass(n)) out.forward_seconds = compute;
      }
    }
    out.seconds = compute;
    auto seconds_of = [&](bool backward) {
      return layer_costs(local, [&](const Node& n) {
        return in_backward_pass(n) == backward ? op_seconds[static_cast<size_t>(&n - nodes.data())]
                                               : 0.0;
      });
    };
    out.forward = seconds_of(false);
    out.backward = seconds_of(true);
    out.flops = layer_costs(local, [&](const Node& n) { return node_flops(local, n); });
    // The parameter tensors, as the data-parallel collectives see them: a backward read (its
    // recomputation's included) makes ZeRO-3 gather a tensor again.
    const Graph& global = p.recompute == RecomputePolicy::none ? m.graph : recomputed;
    std::vector<char> read_backward(global.values().size(), 0);
    for (const Node& n : global.nodes())
      if (in_backward_pass(n))
        for (ValueId v : n.inputs) read_backward[static_cast<size_t>(v)] = 1;
    for (const ParamLayout& pl : part.params)
      out.params[{pl.local_shape.numel(), read_backward[static_cast<size_t>(pl.global)] != 0,
                  pl.local_shape.numel() < pl.global_shape.numel(),
                  global.producer(pl.global).attr<SourceAttrs>().experts}] += 1;
    // Kept for the backward pass: what the blocks produce before the first backward node and a
    // node at or after it reads — all live at that point. Views (reshapes) share their input's
    // bytes and are not counted.
    std::vector<char> read_after(local.values().size(), 0);
    for (size_t i = boundary; i < nodes.size(); ++i)
      for (ValueId v : nodes[i].inputs) read_after[static_cast<size_t>(v)] = 1;
    for (ValueId v = 0; v < static_cast<ValueId>(local.values().size()); ++v) {
      const NodeId at = local.value(v).producer;
      const Node& by = local.node(at);
      if (!read_after[static_cast<size_t>(v)] || static_cast<size_t>(at) >= boundary ||
          by.layer < 0 || by.op == OpKind::parameter || reshape_view_of(local, v) >= 0)
        continue;
      out.kept += static_cast<double>(local.type(v).bytes());
    }
    return out;
  }

  // From models of one and two blocks: what the second block adds is a block's (the first and
  // last blocks also convert layouts at the model's ends, e.g. into sequence parallelism), and
  // the whole model is the one-block model plus n_layer - 1 such blocks.
  Result<MicroBatchCost> cost(const Key& k) {
    TS_ASSIGN_OR_RETURN(Measured one, measure(k, 1));
    TS_ASSIGN_OR_RETURN(Measured two, measure(k, 2));
    const double more = static_cast<double>(cfg_.n_layer - 1);
    const double scale = static_cast<double>(dtype_size(precision_)) / 4.0;
    MicroBatchCost c;
    c.time.block_seconds = two.seconds - one.seconds;
    c.time.seconds = one.seconds + c.time.block_seconds * more;
    c.time.forward_seconds =
        one.forward_seconds + (two.forward_seconds - one.forward_seconds) * more;
    c.time.wait_seconds = one.waits + (two.waits - one.waits) * more;
    c.time.forward_wait_seconds =
        one.forward_waits + (two.forward_waits - one.forward_waits) * more;
    c.time.context_comm_seconds = one.context_comm + (two.context_comm - one.context_comm) * more;
    // T5's pipeline blocks are its encoder's and decoder's, of different costs: no one block.
    if (num_blocks(cfg_) != cfg_.n_layer) c.time.block_seconds = 0;
    c.saved_bytes_per_block = (two.kept - one.kept) * scale;
    // The whole model's tensors: the one-block model's, and n_layer - 1 times what the second
    // block adds.
    const Tensors block = added_tensors(one, two);
    Tensors all = one.params;
    for (const auto& [key, n] : block) all[key] += more * n;
    for (const auto& [key, n] : all)
      c.params.push_back(
          {std::get<0>(key), std::get<1>(key), std::get<2>(key), n, std::get<3>(key)});
    if (num_blocks(cfg_) == cfg_.n_layer) {
      c.pipe = pipeline_costs(one, two);
      for (const auto& [key, n] : block)
        c.pipe.block_param_elems += static_cast<double>(std::get<0>(key)) * n;
    }
    return c;
  }

  // The parameter tensors the second block adds.
  static Tensors added_tensors(const Measured& one, const Measured& two) {
    Tensors out;
    for (const auto& [key, n] : two.params) {
      auto it = one.params.find(key);
      const double more = n - (it == one.params.end() ? 0.0 : it->second);
      if (more > 0) out[key] = more;
    }
    return out;
  }

  // The whole model's blocks from models of one and two: the first block is the two-block
  // model's first (it converts layouts at the model's start), the last its last (at the end),
  // and every block between them what the two-block model's blocks hold less the one-block
  // model's (which converts at both ends).
  PipelineCosts pipeline_costs(const Measured& one, const Measured& two) const {
    PipelineCosts c;
    const size_t depth = static_cast<size_t>(cfg_.n_layer);
    auto expand = [&](const LayerCosts& a, const LayerCosts& b, LayerCosts* out) {
      if (a.block.size() != 1 || b.block.size() != 2) return false;
      out->before = b.before;
      out->after = b.after;
      if (depth == 1) {
        out->block = a.block;
        return true;
      }
      const double middle = std::max(0.0, b.block[0] + b.block[1] - a.block[0]);
      out->block.assign(depth, middle);
      out->block.front() = b.block[0];
      out->block.back() = b.block[1];
      return true;
    };
    if (!expand(one.flops, two.flops, &c.flops) || !expand(one.forward, two.forward, &c.forward) ||
        !expand(one.backward, two.backward, &c.backward))
      return PipelineCosts{};
    return c;
  }

  const ModelConfig& cfg_;
  const ClusterSpec& cluster_;
  int64_t seq_;
  DType precision_;
  bool fp8_;
  Placements& placements_;
  std::map<Key, Result<MicroBatchCost>> cache_;
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

  // The blocks' costs on one tensor rank that cut a pipeline (rank_layer_flops: the whole
  // graph partitioned), once per (micro-batch graph, tp, sp, recomputation): the candidates
  // sharing them differ only in stages, schedule and micro-batch count.
  using CostKey = std::tuple<int64_t, int, bool, int, int>;
  std::map<CostKey, std::shared_ptr<const Result<LayerCosts>>> costs;
  std::shared_ptr<const Result<LayerCosts>> rank_costs(int64_t batch, const Graph& g,
                                                       const Plan& plan) {
    const CostKey key{batch, plan.tensor_group(), plan.sequence_parallel,
                      static_cast<int>(plan.recompute), plan.recompute_layers};
    {
      std::lock_guard<std::mutex> l(mu);
      auto it = costs.find(key);
      if (it != costs.end()) return it->second;
    }
    auto c = std::make_shared<const Result<LayerCosts>>(rank_layer_flops(g, plan));
    std::lock_guard<std::mutex> l(mu);
    return costs.emplace(key, c).first->second;
  }
};

// The simulator's options for the search's precision.
SimOptions sim_options(const PlannerOptions& o) {
  SimOptions so;
  so.precision = o.precision;
  so.fp8 = o.fp8;
  return so;
}

// Lowers and times candidate c (its parameters placed by `placements`). A pipeline's first stage
// (the most micro-batches in flight) is lowered alone first, for a fraction of the whole
// pipeline's cost: a candidate whose first stage does not fit in `capacity` is not simulated.
void simulate_candidate(const ModelConfig& cfg, const ClusterSpec& cluster, const PlannerOptions& o,
                        int64_t seq, double capacity, GraphCache& cache, Placements& placements,
                        PlanCandidate* c) {
  const int64_t global_mb = c->micro_batch * c->plan.data_group();
  std::shared_ptr<const ModelGraph> m = cache.get(cfg, global_mb, seq);
  Status placed = placements.place(m->graph, &c->plan);
  if (!placed.ok()) {
    c->error = placed.message();
    return;
  }
  const SimOptions so = sim_options(o);
  if (c->plan.stages() > 1) {
    // The cut lower_pipeline would make (as the runtime does), from the shared block costs.
    std::shared_ptr<const Result<LayerCosts>> costs =
        cache.rank_costs(global_mb, m->graph, c->plan);
    Result<std::vector<int>> cut =
        costs->ok() ? balance_stages(costs->value(), c->plan.chunks()) : costs->status();
    if (!cut.ok()) {
      c->error = cut.status().message();
      return;
    }
    c->plan.stage_layers = cut.value();
    Result<double> first = simulate_stage_memory(m->graph, c->plan, cluster, so, 0);
    if (!first.ok()) {
      c->error = first.status().message();
      return;
    }
    c->first_stage_bytes = first.value();
    if (c->beyond_memory(capacity)) return;
  }
  Result<SimResult> r = simulate_plan(m->graph, c->plan, cluster, so);
  if (!r.ok()) {
    c->error = r.status().message();
    return;
  }
  c->sim = std::move(r.value());
  c->plan.stage_layers = c->sim.stage_layers;
  c->simulated = true;
  // Offloaded state the node's ranks hold in its host memory, as simulated (the bound that
  // let the candidate through leaves out the blocks' padding).
  c->host_fits = cluster.node.host_memory_bytes <= 0 ||
                 c->sim.host_bytes * cluster.node.ranks_per_node(c->plan.mesh.size()) <=
                     cluster.node.host_memory_bytes;
}

}  // namespace

struct PlanSpace::Impl {
  ModelConfig cfg;
  ClusterSpec cluster;
  PlannerOptions opt;
  std::vector<PlanCandidate> alive;  // within the memory bound, by time bound
  int enumerated = 0, pruned_by_memory = 0, failed_bounds = 0;
  double smallest_memory_bound = 1e300;
  double create_seconds = 0;
  std::unique_ptr<Placements> placements;
  std::unique_ptr<MicroBatchCosts> costs;  // the bounds' costs, kept for the schedule bound
  GraphCache graphs;
};

PlanSpace::PlanSpace(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PlanSpace::~PlanSpace() = default;

Result<std::unique_ptr<PlanSpace>> PlanSpace::create(const ModelConfig& cfg,
                                                     const ClusterSpec& cluster,
                                                     const PlannerOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  PlannerOptions o = opt;
  if (o.gpus < 1) return error("--gpus must be at least 1, got " + std::to_string(o.gpus));
  if (o.top_k < 1) return error("--top must be at least 1, got " + std::to_string(o.top_k));
  if (o.global_batch < 0)
    return error("--batch (sequences per step) must be positive, got " +
                 std::to_string(o.global_batch));
  if (o.seq > cfg.max_seq_len)
    return error("--seq " + std::to_string(o.seq) + " exceeds the model's max_seq_len " +
                 std::to_string(cfg.max_seq_len));
  if (o.seq <= 0) o.seq = cfg.max_seq_len;
  if (o.global_batch == 0) o.global_batch = o.gpus;
  TS_RETURN_IF_ERROR(check_precision(cluster, sim_options(o)));
  if (o.threads <= 0)
    o.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));

  auto impl = std::make_unique<Impl>();
  impl->cfg = cfg;
  impl->cluster = cluster;
  impl->opt = o;
  Impl& s = *impl;
  std::vector<PlanCandidate> cands = enumerate_plans(s.cfg, s.cluster, o, o.global_batch);
  s.enumerated = static_cast<int>(cands.size());
  if (cands.empty())
    return error("no plan splits a batch of " + std::to_string(o.global_batch) +
                     " sequences over " + std::to_string(o.gpus) + " devices",
                 "use a --batch that a power-of-two share of the devices divides (e.g. " +
                     std::to_string(o.gpus) + ")");
  // Memory bound first: what cannot fit is never lowered.
  s.placements = std::make_unique<Placements>(s.cfg, s.cluster, o.seq, o.precision);
  // The state's memory bound first: what cannot fit is never lowered; then the activations'.
  const double capacity = s.cluster.device.memory_bytes;
  std::vector<PlanCandidate> within;
  // Offloaded state the node's host memory (shared by its ranks) cannot hold is out too.
  const double host_capacity = s.cluster.node.host_memory_bytes;
  const int ranks_per_node = s.cluster.node.ranks_per_node(o.gpus);
  for (PlanCandidate& c : cands) {
    c.memory_bound = plan_memory_bound(s.cfg, c.plan, o.precision);
    const double host =
        params_per_rank(s.cfg, c.plan) * host_bytes_per_param(c.plan, o.precision) * ranks_per_node;
    if (host_capacity > 0 && host > host_capacity) {
      ++s.pruned_by_memory;
      continue;
    }
    if (c.memory_bound <= capacity) {
      within.push_back(std::move(c));
      continue;
    }
    ++s.pruned_by_memory;
    s.smallest_memory_bound = std::min(s.smallest_memory_bound, c.memory_bound);
  }
  // A block's parameters (the count is linear in the depth).
  ModelConfig one = s.cfg, two = s.cfg;
  one.n_layer = 1;
  two.n_layer = 2;
  const double experts_per_block =
      static_cast<double>(count_expert_params(two) - count_expert_params(one));
  const double params_per_block =
      static_cast<double>(count_params(two) - count_params(one)) - experts_per_block;
  s.costs =
      std::make_unique<MicroBatchCosts>(s.cfg, s.cluster, o.seq, o.precision, o.fp8, *s.placements);
  MicroBatchCosts& costs = *s.costs;
  costs.prepare(within, o.threads);
  for (PlanCandidate& c : within) {
    const Result<MicroBatchCost>& mb = costs.of(c.plan, c.micro_batch);
    if (!mb.ok()) {  // the plan does not lower (an op refuses the layout): not a candidate
      ++s.failed_bounds;
      continue;
    }
    const double state_per_block = (params_per_block + experts_per_block / c.plan.expert_group()) /
                                   static_cast<double>(c.plan.tensor_group()) *
                                   state_bytes_per_param(c.plan, o.precision);
    c.memory_bound = with_activations(c.plan, c.memory_bound, state_per_block,
                                      mb->saved_bytes_per_block, s.cfg.n_layer);
    if (c.memory_bound > capacity) {
      ++s.pruned_by_memory;
      s.smallest_memory_bound = std::min(s.smallest_memory_bound, c.memory_bound);
      continue;
    }
    const double sync = param_sync_time_bound(mb->params, s.cluster, c.plan, o.precision);
    // Context parallelism: the ops alone, or the context axis's comm stream if it is busier
    // (the keys' and values' gathers or ring shifts overlap attention in the simulator in ways the
    // waits measured above do not bound).
    MicroBatchTime time = mb->time;
    if (c.plan.context_group() > 1) {
      time.seconds = std::max(time.seconds - time.wait_seconds, time.context_comm_seconds);
      time.forward_seconds -= time.forward_wait_seconds;
      time.wait_seconds = time.forward_wait_seconds = 0;
    }
    c.time_bound =
        plan_time_bound(c.plan, time, num_blocks(s.cfg),
                        c.plan.offloads_optimizer()
                            ? offload_time_bound(s.cfg, s.cluster, c.plan, o.precision, sync)
                            : optimizer_time_bound(s.cfg, s.cluster, c.plan) + sync,
                        data_comm_time_bound(mb->params, s.cluster, c.plan, o.precision),
                        accumulate_time_bound(mb->params, s.cluster, c.plan));
    s.alive.push_back(std::move(c));
  }
  std::stable_sort(
      s.alive.begin(), s.alive.end(),
      [](const PlanCandidate& a, const PlanCandidate& b) { return a.time_bound < b.time_bound; });
  s.create_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::unique_ptr<PlanSpace>(new PlanSpace(std::move(impl)));
}

std::vector<const PlanCandidate*> PlanSpace::fastest(int k, const Filter& keep) {
  Impl& s = *impl_;
  const double capacity = s.cluster.device.memory_bytes;
  std::vector<size_t> order;  // the candidates `keep` accepts, by time bound
  for (size_t i = 0; i < s.alive.size(); ++i)
    if (!keep || keep(s.alive[i])) order.push_back(i);
  std::mutex mu;
  std::vector<std::pair<double, size_t>> fitting;  // (step seconds, index), ascending
  std::atomic<size_t> next{0};
  auto kth = [&] {
    return fitting.size() >= static_cast<size_t>(k) ? fitting[k - 1].first : 1e300;
  };
  // PlanCandidate::schedule_bound of pipeline candidate c.
  auto schedule_bound = [&](const PlanCandidate& c) {
    const Result<MicroBatchCost>& mb = s.costs->of(c.plan, c.micro_batch);
    if (!mb.ok()) return 0.0;
    const double optimizer = optimizer_time_bound(s.cfg, s.cluster, c.plan) +
                             param_sync_time_bound(mb->params, s.cluster, c.plan, s.opt.precision);
    return pipeline_schedule_bound(
        c.plan, mb->pipe, s.cluster, optimizer,
        data_comm_time_bound(mb->params, s.cluster, c.plan, s.opt.precision));
  };
  auto worker = [&] {
    for (size_t j; (j = next++) < order.size();) {
      PlanCandidate& c = s.alive[order[j]];
      {
        std::lock_guard<std::mutex> l(mu);
        if (c.time_bound >= kth()) return;  // sorted: no later one can win either
      }
      if (!c.simulated && c.error.empty() && !c.beyond_memory(capacity)) {
        // A pipeline's turn: its schedule replayed on its chunks' bounds may already show that
        // it cannot beat the K-th plan found.
        if (c.plan.stages() > 1 && c.schedule_bound == 0) {
          c.schedule_bound = schedule_bound(c);
          std::lock_guard<std::mutex> l(mu);
          if (c.schedule_bound >= kth()) continue;
        }
        simulate_candidate(s.cfg, s.cluster, s.opt, s.opt.seq, capacity, s.graphs, *s.placements,
                           &c);
      }
      if (!c.fits(capacity)) continue;
      std::lock_guard<std::mutex> l(mu);
      const std::pair<double, size_t> e{c.sim.step_seconds, order[j]};
      fitting.insert(std::upper_bound(fitting.begin(), fitting.end(), e), e);
    }
  };
  on_threads(s.opt.threads, worker);
  std::vector<const PlanCandidate*> out;
  for (size_t i = 0; i < fitting.size() && i < static_cast<size_t>(k); ++i)
    out.push_back(&s.alive[fitting[i].second]);
  return out;
}

const std::vector<PlanCandidate>& PlanSpace::candidates() const { return impl_->alive; }
const ModelConfig& PlanSpace::model() const { return impl_->cfg; }
const ClusterSpec& PlanSpace::cluster() const { return impl_->cluster; }
const PlannerOptions& PlanSpace::options() const { return impl_->opt; }
int PlanSpace::enumerated() const { return impl_->enumerated; }
int PlanSpace::pruned_by_memory() const { return impl_->pruned_by_memory; }
int PlanSpace::failed_bounds() const { return impl_->failed_bounds; }
double PlanSpace::smallest_memory_bound() const { return impl_->smallest_memory_bound; }
double PlanSpace::create_seconds() const { return impl_->create_seconds; }

}  // namespace tessera
