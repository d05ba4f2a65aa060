#include "parallel/memory_plan.h"

#include <algorithm>
#include <array>
#include <iterator>
#include <numeric>

namespace tessera {

namespace {

int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// Byte ranges [lo, hi) kept as disjoint, coalesced intervals (touching ones merge).
class IntervalSet {
 public:
  void add(int64_t lo, int64_t hi) {
    // The spans [lo, hi] meets or touches, from the last one starting at or before lo, become
    // one. A sorted vector: the sets hold few runs, and a map's node per run made the
    // allocator a third of a planner search.
    auto it = std::upper_bound(spans_.begin(), spans_.end(), lo,
                               [](int64_t v, const Span& s) { return v < s.first; });
    if (it != spans_.begin() && std::prev(it)->second >= lo) --it;
    auto end = it;
    for (; end != spans_.end() && end->first <= hi; ++end) {
      lo = std::min(lo, end->first);
      hi = std::max(hi, end->second);
    }
    if (it == end) {
      spans_.insert(it, Span{lo, hi});
    } else {
      *it = Span{lo, hi};
      spans_.erase(std::next(it), end);
    }
  }
  void append_to(std::vector<std::pair<int64_t, int64_t>>* out) const {
    out->insert(out->end(), spans_.begin(), spans_.end());
  }

 private:
  using Span = std::pair<int64_t, int64_t>;  // lo, hi
  std::vector<Span> spans_;                  // disjoint, by lo
};

// Which arena bytes are taken at some time in a window of node indices. A segment tree over
// time: a buffer live over [first, last] is recorded in `whole` at the O(log n) nodes that tile
// its lifetime, and in `some` at those nodes and every node on the two root paths of its end
// points. The buffers live somewhere in a query window are then the `some` sets of the window's
// tiles plus the `whole` sets on its end points' root paths. The sets are coalesced, so a query
// costs the number of separate runs of taken bytes it meets, not the number of buffers: planning
// stays near-linear in the graph's size where a scan over every placed buffer was quadratic.
class OccupancyIndex {
 public:
  explicit OccupancyIndex(int times) {
    while (leaves_ < times) leaves_ *= 2;
    slot_.assign(2 * static_cast<size_t>(leaves_), -1);
  }

  void add(int first, int last, int64_t lo, int64_t hi) {
    for_tiles(first, last, [&](int n) {
      set(n, kWhole).add(lo, hi);
      set(n, kSome).add(lo, hi);
    });
    for_root_paths(first, last, [&](int n) { set(n, kSome).add(lo, hi); });
  }

  // Replaces *out with the taken byte ranges (overlapping, in no order) in [first, last].
  void overlapping(int first, int last, std::vector<std::pair<int64_t, int64_t>>* out) const {
    out->clear();
    for_tiles(first, last, [&](int n) { append(n, kSome, out); });
    for_root_paths(first, last, [&](int n) { append(n, kWhole, out); });
  }

 private:
  enum Kind { kWhole = 0, kSome = 1 };

  template <typename F>
  void for_tiles(int first, int last, F f) const {
    for (int l = first + leaves_, r = last + leaves_ + 1; l < r; l /= 2, r /= 2) {
      if (l & 1) f(l++);
      if (r & 1) f(--r);
    }
  }
  template <typename F>
  void for_root_paths(int first, int last, F f) const {
    for (int a = first + leaves_, b = last + leaves_; a >= 1; a /= 2, b /= 2) {
      f(a);
      if (b != a) f(b);
    }
  }
  IntervalSet& set(int n, Kind k) {
    int& s = slot_[static_cast<size_t>(n)];
    if (s < 0) {
      s = static_cast<int>(sets_.size());
      sets_.emplace_back();
    }
    return sets_[static_cast<size_t>(s)][k];
  }
  void append(int n, Kind k, std::vector<std::pair<int64_t, int64_t>>* out) const {
    const int s = slot_[static_cast<size_t>(n)];
    if (s >= 0) sets_[static_cast<size_t>(s)][k].append_to(out);
  }

  int leaves_ = 1;
  std::vector<int> slot_;  // node -> index into sets_, -1 while nothing is recorded there
  std::vector<std::array<IntervalSet, 2>> sets_;
};

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
  // and an all-gather writes the flattened tensor padded to size * block elements
  // (GroupAttrs::size).
  const std::vector<int> waits = collective_waits(g);
  for (int i = 0; i < num_nodes; ++i) {
    const Node& n = g.nodes()[static_cast<size_t>(i)];
    if (!is_collective(n.op)) continue;
    BufferPlan& in = plan.buffers[static_cast<size_t>(n.inputs[0])];
    BufferPlan& out = plan.buffers[static_cast<size_t>(n.outputs[0])];
    in.last = std::max(in.last, waits[static_cast<size_t>(i)]);
    const int64_t elem = dtype_size(g.type(n.inputs[0]).dtype);
    const int64_t ranks = n.attr<GroupAttrs>().size;
    if (n.op == OpKind::reduce_scatter)
      in.bytes = std::max(in.bytes, g.type(n.outputs[0]).shape.numel() * ranks * elem);
    if (n.op == OpKind::all_gather)
      out.bytes = std::max(out.bytes, g.type(n.inputs[0]).shape.numel() * ranks * elem);
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
    if (g.producer(v).op == OpKind::parameter) {  // in host memory: not the device's
      if (!g.on_host(v)) plan.param_bytes += plan.buffers[static_cast<size_t>(v)].bytes;
      continue;
    }
    if (root[static_cast<size_t>(v)] == v) order.push_back(v);
  }
  std::stable_sort(order.begin(), order.end(), [&](ValueId a, ValueId b) {
    return plan.buffers[static_cast<size_t>(a)].bytes > plan.buffers[static_cast<size_t>(b)].bytes;
  });

  // Best fit, largest first: each buffer takes the smallest gap (lowest offset among equals)
  // between the buffers already placed that are live at some time in its lifetime, or the
  // space above them all.
  OccupancyIndex occupied(num_nodes + 1);
  std::vector<std::pair<int64_t, int64_t>> busy;
  for (ValueId v : order) {
    BufferPlan& b = plan.buffers[static_cast<size_t>(v)];
    occupied.overlapping(b.first, b.last, &busy);
    std::sort(busy.begin(), busy.end());
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
    // Recorded up to the next aligned offset: no buffer can start in the padding, and
    // neighbours then touch and coalesce into one run (with unaligned ends, every small
    // long-lived gradient stayed a run of its own and deep graphs planned quadratically).
    if (b.bytes > 0)
      occupied.add(b.first, b.last, b.offset, align_up(b.offset + b.bytes, alignment));
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
