// Static memory plan of real training graphs: no two simultaneously live buffers share bytes,
// and the planned peak is exactly the arena high-water mark measured in a real run.
#include "parallel/memory_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "ir/autodiff.h"
#include "ir/builder.h"
#include "models/model.h"
#include "parallel/program.h"
#include "runtime/executor.h"

namespace tessera {
namespace {

ModelGraph tiny(const std::string& preset) {
  std::optional<ModelConfig> c = find_preset(preset);
  EXPECT_TRUE(c.has_value()) << preset;
  return build_model(*c, /*batch=*/2, /*seq=*/16, ModelMode::train);
}

void check_plan_is_valid(const Graph& g, const MemoryPlan& plan, bool has_views = false) {
  ASSERT_EQ(plan.buffers.size(), g.values().size());
  const int num_nodes = static_cast<int>(g.nodes().size());
  std::vector<ValueId> in_arena;
  int64_t param_bytes = 0;
  for (ValueId v = 0; v < static_cast<ValueId>(g.values().size()); ++v) {
    const BufferPlan& b = plan.buffers[static_cast<size_t>(v)];
    if (g.producer(v).op == OpKind::parameter) {
      EXPECT_EQ(b.offset, -1) << "parameter %" << v << " placed in the arena";
      param_bytes += g.type(v).bytes();
      continue;
    }
    EXPECT_EQ(b.bytes, g.type(v).bytes()) << "%" << v;
    EXPECT_GE(b.offset, 0) << "%" << v;
    EXPECT_EQ(b.offset % 64, 0) << "%" << v;
    EXPECT_LE(b.offset + b.bytes, plan.arena_bytes) << "%" << v;
    // The lifetime covers the definition and every read.
    EXPECT_LE(b.first, g.value(v).producer) << "%" << v;
    EXPECT_LE(b.first, b.last);
    in_arena.push_back(v);
  }
  for (int i = 0; i < num_nodes; ++i)
    for (ValueId v : g.nodes()[static_cast<size_t>(i)].inputs)
      if (g.producer(v).op != OpKind::parameter) {
        EXPECT_GE(plan.buffers[static_cast<size_t>(v)].last, i)
            << "%" << v << " read by node " << i;
      }
  for (ValueId v : g.outputs())
    if (g.producer(v).op != OpKind::parameter) {
      EXPECT_EQ(plan.buffers[static_cast<size_t>(v)].last, num_nodes) << "output %" << v;
    }
  EXPECT_EQ(plan.param_bytes, param_bytes);

  // No two buffers whose lifetimes overlap share a byte (all pairs), except a reshape view and
  // what it views: they are the same bytes on purpose.
  auto root = [&](ValueId v) {
    for (ValueId in; (in = reshape_view_of(g, v)) >= 0;) v = in;
    return v;
  };
  int views = 0;
  for (ValueId v : in_arena)
    if (root(v) != v) {
      ++views;
      EXPECT_EQ(plan.buffers[static_cast<size_t>(v)].offset,
                plan.buffers[static_cast<size_t>(root(v))].offset);
    }
  if (has_views) {
    EXPECT_GT(views, 0) << "the model's reshapes should be views";
  }
  int conflicts = 0;
  for (size_t i = 0; i < in_arena.size(); ++i) {
    const BufferPlan& a = plan.buffers[static_cast<size_t>(in_arena[i])];
    if (a.bytes == 0) continue;
    for (size_t j = i + 1; j < in_arena.size(); ++j) {
      const BufferPlan& b = plan.buffers[static_cast<size_t>(in_arena[j])];
      if (b.bytes == 0) continue;
      if (root(in_arena[i]) == root(in_arena[j])) continue;
      bool time = a.first <= b.last && b.first <= a.last;
      bool space = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
      if (time && space && ++conflicts <= 5)
        ADD_FAILURE() << "%" << in_arena[i] << " [" << a.offset << ", +" << a.bytes << ") nodes "
                      << a.first << ".." << a.last << " overlaps %" << in_arena[j] << " ["
                      << b.offset << ", +" << b.bytes << ") nodes " << b.first << ".." << b.last;
    }
  }
  EXPECT_EQ(conflicts, 0);

  // The planned peak is at least the bytes live at once, which it bounds from below.
  int64_t live_peak = 0;
  for (int t = 0; t <= num_nodes; ++t) {
    int64_t live = 0;
    for (ValueId v : in_arena) {
      const BufferPlan& b = plan.buffers[static_cast<size_t>(v)];
      if (b.first <= t && t <= b.last) live += b.bytes;
    }
    live_peak = std::max(live_peak, live);
  }
  EXPECT_EQ(plan.live_peak_bytes, live_peak);
  EXPECT_GE(plan.arena_bytes, plan.live_peak_bytes);
  EXPECT_GT(plan.live_peak_bytes, 0);
  std::printf("%zu values in the arena: arena %lld bytes, live peak %lld bytes (%.3fx)\n",
              in_arena.size(), static_cast<long long>(plan.arena_bytes),
              static_cast<long long>(plan.live_peak_bytes),
              static_cast<double>(plan.arena_bytes) / static_cast<double>(plan.live_peak_bytes));
}

void check_high_water(const ModelGraph& m) {
  CpuBackend cpu;
  Executor ex(m.graph, cpu);
  ex.init_params(1);
  ex.paint_arena();
  EXPECT_EQ(ex.measured_high_water(), 0);
  std::vector<int32_t> tokens(static_cast<size_t>(m.batch * m.seq)), targets(tokens.size());
  std::mt19937 rng(5);
  const int64_t vocab = m.graph.type(m.graph.params()[0]).shape[0];
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(vocab - 1));
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = u(rng);
    targets[i] = u(rng);
  }
  ex.set_input("tokens", tokens.data());
  ex.set_input("targets", targets.data());
  ex.run();
  EXPECT_EQ(ex.measured_high_water(), ex.plan().arena_bytes);
  float loss = *ex.data<float>(m.loss);
  EXPECT_NEAR(loss, std::log(static_cast<double>(vocab)), 0.5) << "near-uniform initial loss";
}

TEST(MemoryPlan, GptTinyTrainingPlanHasNoOverlaps) {
  ModelGraph m = tiny("gpt-tiny");
  check_plan_is_valid(m.graph, plan_memory(m.graph), /*has_views=*/true);
}

TEST(MemoryPlan, LlamaTinyTrainingPlanHasNoOverlaps) {
  ModelGraph m = tiny("llama-tiny");
  check_plan_is_valid(m.graph, plan_memory(m.graph), /*has_views=*/true);
}

TEST(MemoryPlan, PlannedPeakEqualsMeasuredHighWaterGpt) { check_high_water(tiny("gpt-tiny")); }

TEST(MemoryPlan, PlannedPeakEqualsMeasuredHighWaterLlama) { check_high_water(tiny("llama-tiny")); }

TEST(MemoryPlan, ReusesFreedBuffers) {
  // A chain of same-sized temporaries: each is dead once the next is computed, so the arena
  // holds two of them at a time, not all.
  Graph g;
  Builder b(&g);
  Var x = b.input("x", Shape{256});
  Var y = x;
  for (int i = 0; i < 10; ++i) y = b.exp(y);
  g.mark_output(y.id);
  MemoryPlan plan = plan_memory(g);
  check_plan_is_valid(g, plan);
  EXPECT_EQ(plan.live_peak_bytes, 2 * 1024);
  EXPECT_EQ(plan.arena_bytes, 2 * 1024);
}

// The placement the planner's occupancy index finds is the one a plain scan over every placed
// buffer finds (the quadratic loop it replaced): largest first, smallest gap that fits among the
// buffers live at some time in the new one's lifetime, lowest offset among equal gaps.
std::vector<int64_t> scan_every_placed_buffer(const Graph& g, const MemoryPlan& plan) {
  std::vector<ValueId> order;
  for (ValueId v = 0; v < static_cast<ValueId>(g.values().size()); ++v)
    if (g.producer(v).op != OpKind::parameter && reshape_view_of(g, v) < 0) order.push_back(v);
  std::stable_sort(order.begin(), order.end(), [&](ValueId a, ValueId b) {
    return plan.buffers[static_cast<size_t>(a)].bytes > plan.buffers[static_cast<size_t>(b)].bytes;
  });
  std::vector<int64_t> offset(g.values().size(), -1);
  std::vector<ValueId> placed;
  for (ValueId v : order) {
    const BufferPlan& b = plan.buffers[static_cast<size_t>(v)];
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (ValueId p : placed) {
      const BufferPlan& o = plan.buffers[static_cast<size_t>(p)];
      if (o.first <= b.last && b.first <= o.last)
        busy.emplace_back(offset[static_cast<size_t>(p)], offset[static_cast<size_t>(p)] + o.bytes);
    }
    std::sort(busy.begin(), busy.end());
    int64_t candidate = 0, best = -1, best_gap = INT64_MAX;
    for (auto [lo, hi] : busy) {
      if (lo >= candidate + b.bytes && lo - candidate < best_gap) {
        best = candidate;
        best_gap = lo - candidate;
      }
      candidate = std::max(candidate, (hi + 63) / 64 * 64);
    }
    offset[static_cast<size_t>(v)] = best >= 0 ? best : candidate;
    placed.push_back(v);
  }
  return offset;
}

TEST(MemoryPlan, PlacementEqualsAScanOverEveryPlacedBuffer) {
  ModelConfig deep = *find_preset("gpt-tiny");
  deep.n_layer = 12;
  std::vector<ModelGraph> graphs;
  for (int64_t batch : {1, 2, 8}) {
    graphs.push_back(build_model(*find_preset("gpt-tiny"), batch, 16, ModelMode::train));
    graphs.push_back(build_model(*find_preset("llama-tiny"), batch, 16, ModelMode::train));
    graphs.push_back(build_model(deep, batch, 32, ModelMode::train));
  }
  for (const ModelGraph& m : graphs) {
    const MemoryPlan plan = plan_memory(m.graph);
    const std::vector<int64_t> scanned = scan_every_placed_buffer(m.graph, plan);
    int64_t compared = 0;
    for (ValueId v = 0; v < static_cast<ValueId>(scanned.size()); ++v) {
      if (scanned[static_cast<size_t>(v)] < 0) continue;
      ASSERT_EQ(plan.offset(v), scanned[static_cast<size_t>(v)])
          << "%" << v << " of a batch-" << m.batch << " graph";
      ++compared;
    }
    EXPECT_GT(compared, 100);
  }
}

// Gradient reductions nobody reads until the optimizer are waited for a bounded number of
// collectives later, so a rank never holds every full-size gradient at once.
TEST(CollectiveWaits, BoundUnreadReductionsInFlight) {
  ModelGraph m = build_model(*find_preset("gpt2-small"), 8, 256, ModelMode::train);
  Result<Program> p = lower(m.graph, Plan::data_parallel(8, 3));
  ASSERT_TRUE(p.ok()) << p.status().message();
  const Graph& g = p->local();
  std::vector<int> waits = collective_waits(g);
  const int num_nodes = static_cast<int>(g.nodes().size());
  int max_open = 0;
  for (int at = 0; at < num_nodes; ++at) {
    int open = 0;
    for (int c = 0; c < at; ++c)
      if (waits[static_cast<size_t>(c)] > at && waits[static_cast<size_t>(c)] == num_nodes) ++open;
    max_open = std::max(max_open, open);
  }
  EXPECT_LE(max_open, kUnreadCollectivesInFlight);
  // Every unread reduction but the last few is waited for inside the step.
  int at_end = 0;
  for (int w : waits) at_end += w == num_nodes;
  EXPECT_LE(at_end, kUnreadCollectivesInFlight);
  // The arena holds far less than the full gradients (dp=1 keeps them all as outputs; a
  // ZeRO-3 rank still holds its activations, in-flight reductions and gathered parameters).
  ModelGraph one = build_model(*find_preset("gpt2-small"), 1, 256, ModelMode::train);
  Result<Program> q = lower(one.graph, Plan::data_parallel(1));
  ASSERT_TRUE(q.ok());
  const double full_grads = 4.0 * static_cast<double>(one.graph.param_count());
  EXPECT_LT(static_cast<double>(p->memory.arena_bytes),
            static_cast<double>(q->memory.arena_bytes) - 0.4 * full_grads);
}

// Zero fills (gradients of slices) are emitted at their reader in its placement: under data
// parallelism they have the local batch, not the global one.
TEST(Partition, FillsTakeTheLocalShapeOfTheirReader) {
  auto fill_bytes = [](const Graph& g) {
    double b = 0;
    for (const Node& n : g.nodes())
      if (n.op == OpKind::fill) b += static_cast<double>(g.type(n.outputs[0]).bytes());
    return b;
  };
  // Half of a projection is used: its gradient is [g, zeros] along the columns.
  Graph g;
  Builder b(&g);
  Var x = b.input("tokens", Shape{8, 16});
  Var w = b.parameter("w", Shape{16, 16}, Init::normal, 0.02);
  Var half = b.slice(b.matmul(x, w), 1, 0, 8);
  Var loss = b.cross_entropy(half, b.input("targets", Shape{8}, DType::i32))[0];
  b.graph().mark_output(loss.id);
  append_backward(b, loss);
  Result<Program> p = lower(g, Plan::data_parallel(4, 0));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_GT(fill_bytes(g), 0);
  EXPECT_LT(fill_bytes(p->local()), 0.3 * fill_bytes(g));
}

}  // namespace
}  // namespace tessera
