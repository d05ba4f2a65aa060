#include "parallel/memory_plan.h"

#include <algorithm>
#include <numeric>

namespace tessera {

namespace {
int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }
}  // namespace

std::vector<int> collective_waits(const Graph& g) {
  const int num_nodes = static_cast<int>(g.nodes().size());
  std::vector<int> first_reader(g.values().size(), num_nodes);
  for (int j = num_nodes - 1; j >= 0; --j)
    for (ValueId v : g.nodes()[static_cast<size_t>(j)].inputs)
      first_reader[static_cast<size_t>(v)] = j;
  std::vector<int> waits(static_cast<size_t>(num_nodes), -1);
  std::vector<int> unread;  // collectives whose output nobody reads, in start order
  for (int i = 0; i < num_nodes; ++i) {
    const Node& n = g.nodes()[static_cast<size_t>(i)];
    if (!is_collective(n.op)) continue;
    int reader = first_reader[static_cast<size_t>(n.outputs[0])];
    waits[static_cast<size_t>(i)] = reader;
    if (reader < num_nodes) continue;
    unread.push_back(i);
    if (unread.size() > static_cast<size_t>(kUnreadCollectivesInFlight)) {
      int old = unread[unread.size() - 1 - kUnreadCollectivesInFlight];
      waits[static_cast<size_t>(old)] = i;
    }
  }
  return waits;
}

ValueId reshape_view_of(const Graph& g, ValueId v) {
  const Node& n = g.producer(v);
  if (n.op != OpKind::reshape) return -1;
  const ValueId in = n.inputs[0];
  if (g.producer(in).op == OpKind::parameter) return -1;  // parameters live outside the arena
  return g.type(in).dtype == g.type(v).dtype ? in : -1;
}

MemoryPlan plan_memory(const Graph& g, int64_t alignment) {
  MemoryPlan plan;
  const int num_nodes = static_cast<int>(g.nodes().size());
  plan.buffers.resize(g.values().size());
  for (size_t i = 0; i < g.values().size(); ++i) {
    const Value& v = g.values()[i];
    BufferPlan& b = plan.buffers[i];
    b.bytes = v.type.bytes();
    b.first = g.node(v.producer).op == OpKind::input ? 0 : v.producer;
    b.last = b.first;
  }
  for (int i = 0; i < num_nodes; ++i)
    for (ValueId v : g.nodes()[static_cast<size_t>(i)].inputs)
      plan.buffers[static_cast<size_t>(v)].last =
          std::max(plan.buffers[static_cast<size_t>(v)].last, i);
  for (ValueId v : g.outputs()) plan.buffers[static_cast<size_t>(v)].last = num_nodes;

  // Collectives run asynchronously on the comm stream and are waited for just before the
  // first reader of their output: their input stays live until then. A reduce-scatter reads
  // and an all-gather writes the flattened tensor padded to count * block elements.
  const std::vector<int> waits = collective_waits(g);
  for (int i = 0; i < num_nodes; ++i) {
    const Node& n = g.nodes()[static_cast<size_t>(i)];
    if (!is_collective(n.op)) continue;
    BufferPlan& in = plan.buffers[static_cast<size_t>(n.inputs[0])];
    BufferPlan& out = plan.buffers[static_cast<size_t>(n.outputs[0])];
    in.last = std::max(in.last, waits[static_cast<size_t>(i)]);
    const int64_t elem = dtype_size(g.type(n.inputs[0]).dtype);
    if (n.op == OpKind::reduce_scatter)
      in.bytes = std::max(in.bytes, g.type(n.outputs[0]).shape.numel() * n.attrs.count * elem);
    if (n.op == OpKind::all_gather)
      out.bytes = std::max(out.bytes, g.type(n.inputs[0]).shape.numel() * n.attrs.count * elem);
  }

  // A reshape of an arena value is a view: its output shares the input's bytes. Aliases are
  // folded into their root, whose lifetime covers them all.
  std::vector<ValueId> root(g.values().size());
  for (ValueId v = 0; v < static_cast<ValueId>(g.values().size()); ++v) {
    root[static_cast<size_t>(v)] = v;
    if (const ValueId in = reshape_view_of(g, v); in >= 0) {
      const ValueId r = root[static_cast<size_t>(in)];
      root[static_cast<size_t>(v)] = r;
      BufferPlan& rb = plan.buffers[static_cast<size_t>(r)];
      const BufferPlan& vb = plan.buffers[static_cast<size_t>(v)];
      rb.first = std::min(rb.first, vb.first);
      rb.last = std::max(rb.last, vb.last);
      rb.bytes = std::max(rb.bytes, vb.bytes);
    }
  }

  std::vector<ValueId> order;
  for (ValueId v = 0; v < static_cast<ValueId>(g.values().size()); ++v) {
    if (g.producer(v).op == OpKind::parameter) {
      plan.param_bytes += plan.buffers[static_cast<size_t>(v)].bytes;
      continue;
    }
    if (root[static_cast<size_t>(v)] == v) order.push_back(v);
  }
  std::stable_sort(order.begin(), order.end(), [&](ValueId a, ValueId b) {
    return plan.buffers[static_cast<size_t>(a)].bytes > plan.buffers[static_cast<size_t>(b)].bytes;
  });

  // Placed buffers, kept sorted by offset.
  std::vector<ValueId> placed;
  std::vector<std::pair<int64_t, int64_t>> busy;  // (offset, end) of time-overlapping buffers
  for (ValueId v : order) {
    BufferPlan& b = plan.buffers[static_cast<size_t>(v)];
    // `placed` is in offset order, so the time-overlapping ones come out sorted by offset (the
    // order among equal offsets does not change the choice: only the first of them can start
    // a gap).
    busy.clear();
    for (ValueId p : placed) {
      const BufferPlan& o = plan.buffers[static_cast<size_t>(p)];
      if (o.first <= b.last && b.first <= o.last) busy.emplace_back(o.offset, o.offset + o.bytes);
    }
    int64_t candidate = 0, best = -1, best_gap = INT64_MAX;
    for (auto [lo, hi] : busy) {
      if (lo >= candidate + b.bytes && lo - candidate < best_gap) {
        best = candidate;
        best_gap = lo - candidate;
      }
      candidate = std::max(candidate, align_up(hi, alignment));
    }
    b.offset = best >= 0 ? best : candidate;
    plan.arena_bytes = std::max(plan.arena_bytes, b.offset + b.bytes);
    placed.insert(std::upper_bound(placed.begin(), placed.end(), v,
                                   [&](ValueId x, ValueId y) {
                                     return plan.buffers[static_cast<size_t>(x)].offset <
                                            plan.buffers[static_cast<size_t>(y)].offset;
                                   }),
                  v);
  }

  for (ValueId v = 0; v < static_cast<ValueId>(g.values().size()); ++v)
    if (root[static_cast<size_t>(v)] != v)
      plan.buffers[static_cast<size_t>(v)].offset =
          plan.buffers[static_cast<size_t>(root[static_cast<size_t>(v)])].offset;

  // Live-bytes profile: +bytes at first, -bytes after last.
  std::vector<int64_t> delta(static_cast<size_t>(num_nodes) + 2, 0);
  for (ValueId v : order) {
    const BufferPlan& b = plan.buffers[static_cast<size_t>(v)];
    delta[static_cast<size_t>(b.first)] += b.bytes;
    delta[static_cast<size_t>(b.last) + 1] -= b.bytes;
  }
  int64_t live = 0;
  for (int64_t d : delta) {
    live += d;
    plan.live_peak_bytes = std::max(plan.live_peak_bytes, live);
  }
  return plan;
}

}  // namespace tessera
