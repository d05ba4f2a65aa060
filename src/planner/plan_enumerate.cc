// The planner's search space (planner/plan_enumerate.h): the degrees of each parallel
// dimension, then every plan of them.
#include "planner/plan_enumerate.h"

#include <algorithm>

namespace tessera {

namespace {

std::vector<int> divisors(int64_t n) {
  std::vector<int> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(static_cast<int>(d));
  return out;
}

bool power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// The degrees of a candidate's parallel dimensions: tensor, pipeline, context and expert
// parallel ranks (the data-parallel ranks are the rest of the devices).
struct Degrees {
  int tp = 1, pp = 1, cp = 1, ep = 1;
};

// Context-parallel candidates are searched with ring attention too from this sequence length.
constexpr int64_t kRingSearchMinSeq = 32768;

// Every combination of degrees the search tries for `gpus` devices and `batch` sequences.
std::vector<Degrees> degrees(const ModelConfig& cfg, const ClusterSpec& cluster,
                             const PlannerOptions& o, int64_t batch) {
  std::vector<Degrees> out;
  const int per_node = std::max(1, cluster.node.devices);
  for (int tp : divisors(o.gpus)) {
    // Tensor parallelism within a node, on whole heads (and key/value heads).
    if (!power_of_two(tp) || tp > per_node || cfg.n_head % tp != 0) continue;
    if (cfg.n_kv_head > 0 && cfg.n_kv_head % tp != 0 && tp % cfg.n_kv_head != 0) continue;
    for (int pp : divisors(o.gpus / tp)) {
      if (pp > cfg.n_layer) continue;
      // Context parallelism (language models of dense blocks): groups of cp ranks, a power of
      // two, each holding a chunk of every sequence (LLaMA: zigzag halves, GPT's position
      // table: contiguous chunks). With a pipeline, tp x cp within a node (the stages' ranks
      // already span nodes).
      const int halves = cfg.family == "llama" ? 2 : 1;
      for (int cp : divisors(o.gpus / (tp * pp))) {
        if (cp > 1 &&
            !(power_of_two(cp) && (pp == 1 || per_node % (tp * cp) == 0) && !cfg.is_moe() &&
              (cfg.family == "llama" || cfg.family == "gpt") && o.seq % (halves * cp) == 0))
          continue;
        const int data = o.gpus / (tp * pp * cp);
        if (batch % data != 0) continue;
        // Expert parallelism (mixtures of experts): the data ranks' groups of ep, each holding
        // 1 / ep of the experts (a power of two dividing the experts).
        for (int ep : divisors(data))
          if (ep == 1 || (cfg.is_moe() && power_of_two(ep) && cfg.n_experts % ep == 0))
            out.push_back({tp, pp, cp, ep});
      }
    }
  }
  return out;
}

}  // namespace

std::vector<PlanCandidate> enumerate_plans(const ModelConfig& cfg, const ClusterSpec& cluster,
                                           const PlannerOptions& o, int64_t batch) {
  std::vector<PlanCandidate> out;
  const int per_node = std::max(1, cluster.node.devices);
  for (const auto [tp, pp, cp, ep] : degrees(cfg, cluster, o, batch)) {
    const int dp = o.gpus / (tp * pp * cp * ep);
    const int64_t rows = batch / (dp * ep);  // sequences per data-parallel rank per step
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
        // Interleaved (its micro-batches a multiple of the stages, each chunk at least one
        // block) with 2 or 4 model chunks per stage, and with every chunk count up to 8 that
        // cuts each stage's blocks evenly (Megatron's rule: 105 blocks over 35 stages
        // interleave 3 ways).
        for (int v : interleavings(cfg.n_layer, pp))
          if (m % pp == 0) scheds.push_back({ScheduleKind::interleaved, v});
      }
      // Data-parallel sharding: ZeRO-1/2/3 over all data ranks (pipelines: ZeRO-1), and HSDP:
      // ZeRO-3 within groups of the data ranks of 1, 2 or 4 nodes, replicated across the groups
      // (one node: the parameter gathers stay on NVLink; more: the shards are smaller, for
      // models one node's memory does not hold); the replicas all-reduce the gradient blocks.
      // An HSDP entry is minus its shard group's size. With one data rank the stages shard
      // nothing: one plan, not three alike.
      std::vector<int> zeros = pp > 1 || dp == 1 ? std::vector<int>{1} : std::vector<int>{1, 2, 3};
      for (int nodes = 1; nodes <= 4 && pp == 1 && ep == 1 && cp == 1; nodes *= 2) {
        const int shards = nodes * per_node / tp;
        if (shards > 1 && dp > shards && dp % shards == 0) zeros.push_back(-shards);
      }
      for (const Sched& s : scheds)
        for (int zero : zeros)
          for (bool sp : tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false})
            for (RecomputePolicy rc :
                 {RecomputePolicy::none, RecomputePolicy::selective, RecomputePolicy::full}) {
              PlanCandidate c;
              c.plan = zero < 0 ? Plan::hybrid_sharded(dp / -zero, -zero, tp)
                       : pp > 1 ? Plan::pipeline_parallel(pp, dp, tp, zero)
                       : tp > 1 ? Plan::tensor_parallel(dp, tp, zero)
                                : Plan::data_parallel(dp, zero);
              if (!add_expert_axis(&c.plan, ep).ok() || !add_context_axis(&c.plan, cp).ok())
                continue;
              if (cp > 1 && cfg.family == "llama") c.plan.context_order = ContextOrder::zigzag;
              c.plan.micro_batches = m;
              c.plan.recompute = rc;
              c.plan.sequence_parallel = sp;
              if (pp > 1) {
                c.plan.schedule = s.kind;
                c.plan.virtual_stages = s.v;
              }
              c.micro_batch = mb;
              // The keys and values gathered, or passed round (ring) at long context only:
              // below it the two differ by little and searching both doubles the context-
              // parallel simulations (gpt3-175b on 1,024 H100s at 2K tokens: 17.5 s to 30.4 s).
              const bool ring = cp > 1 && o.seq >= kRingSearchMinSeq;
              PlanCandidate twin = c;  // (the gathered form first: it wins a tie)
              out.push_back(std::move(c));
              if (ring) {
                twin.plan.context_attention = ContextAttention::ring;
                out.push_back(std::move(twin));
              }
            }
    }
  }
  // Each plan without a pipeline once more with the optimizer in host memory, and a ZeRO-3 one
  // with its parameters too, where the cluster gives its host side: never faster, so simulated
  // only when it is needed to fit.
  if (cluster.node.offload_known()) {
    const size_t n = out.size();
    for (size_t i = 0; i < n; ++i)
      for (OffloadPolicy off : {OffloadPolicy::optimizer, OffloadPolicy::params}) {
        if (out[i].plan.stages() > 1 || (off == OffloadPolicy::params && out[i].plan.zero < 3))
          continue;
        PlanCandidate c = out[i];
        c.plan.offload = off;
        out.push_back(std::move(c));
      }
  }
  return out;
}

}  // namespace tessera
