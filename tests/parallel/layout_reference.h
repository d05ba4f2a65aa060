// A dense reference for tensor layouts, for tests: every rank of a mesh as one buffer in this
// process.
//
//   Buffers b = scatter(layout, mesh, global, seed);   // each rank's stored elements
//   b = execute(step, mesh, b);                        // one CommStep on every rank
//   EXPECT_EQ(gather(layout, mesh, b, &why), global);  // sums Partials, checks replicas
//
// execute() knows only a step's kind, group and local shapes, never the layouts, so a
// redistribute() whose layouts disagree with what its collectives do is caught by gather().
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "parallel/redistribute.h"

namespace tessera::testing_layout {

using Buffer = std::vector<double>;
using Buffers = std::vector<Buffer>;  // per rank

// Row-major offset helpers over a shape, split as [outer, dim, inner].
struct Split3 {
  int64_t outer = 1, mid = 1, inner = 1;
  Split3(const Shape& s, int dim) {
    for (int d = 0; d < s.rank(); ++d) (d < dim ? outer : d == dim ? mid : inner) *= s.dim(d);
  }
};

// Chunk k of n along `dim` of a tensor of shape s.
inline Buffer chunk(const Buffer& x, const Shape& s, int dim, int64_t n, int64_t k) {
  Split3 t(s, dim);
  const int64_t m = t.mid / n;
  Buffer out;
  out.reserve(static_cast<size_t>(t.outer * m * t.inner));
  for (int64_t o = 0; o < t.outer; ++o)
    for (int64_t i = k * m; i < (k + 1) * m; ++i)
      for (int64_t j = 0; j < t.inner; ++j)
        out.push_back(x[static_cast<size_t>((o * t.mid + i) * t.inner + j)]);
  return out;
}

// Pieces of shape s concatenated along `dim`.
inline Buffer concat(const std::vector<Buffer>& pieces, const Shape& s, int dim) {
  Split3 t(s, dim);
  Buffer out;
  for (int64_t o = 0; o < t.outer; ++o)
    for (const Buffer& p : pieces)
      out.insert(out.end(), p.begin() + o * t.mid * t.inner, p.begin() + (o + 1) * t.mid * t.inner);
  return out;
}

inline Buffer extract(const Buffer& g, const Shape& gs, const Box& b) {
  Buffer out;
  std::vector<int64_t> i = b.lo;
  const int r = gs.rank();
  if (b.numel() == 0) return out;
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < r; ++d) off = off * gs.dim(d) + i[static_cast<size_t>(d)];
    out.push_back(g[static_cast<size_t>(off)]);
    int d = r - 1;
    for (; d >= 0; --d) {
      size_t u = static_cast<size_t>(d);
      if (++i[u] < b.hi[u]) break;
      i[u] = b.lo[u];
    }
    if (d < 0) return out;
  }
}

inline void accumulate(Buffer* g, const Shape& gs, const Box& b, const Buffer& piece) {
  std::vector<int64_t> i = b.lo;
  const int r = gs.rank();
  for (double v : piece) {
    int64_t off = 0;
    for (int d = 0; d < r; ++d) off = off * gs.dim(d) + i[static_cast<size_t>(d)];
    (*g)[static_cast<size_t>(off)] += v;
    for (int d = r - 1; d >= 0; --d) {
      size_t u = static_cast<size_t>(d);
      if (++i[u] < b.hi[u]) break;
      i[u] = b.lo[u];
    }
  }
}

// Members of rank r's group over `axes`, in group-index order.
inline std::vector<int> members(const Mesh& m, int r, const std::vector<std::string>& axes) {
  std::vector<int> out(static_cast<size_t>(m.group_size(axes)));
  for (int q = 0; q < m.size(); ++q)
    if (m.group_color(q, axes) == m.group_color(r, axes))
      out[static_cast<size_t>(m.group_index(q, axes))] = q;
  return out;
}

inline Buffer flat_block(Buffer piece, int64_t n, int64_t k) {
  const int64_t block = (static_cast<int64_t>(piece.size()) + n - 1) / n;
  piece.resize(static_cast<size_t>(block * n), 0.0);
  return Buffer(piece.begin() + k * block, piece.begin() + (k + 1) * block);
}

// Each rank's stored elements under `l`. Partial axes split the value into random addends:
// ranks that differ only on Replicate axes hold equal addends.
inline Buffers scatter(const TensorLayout& l, const Mesh& m, const Buffer& global, unsigned seed) {
  Buffers out(static_cast<size_t>(m.size()));
  std::vector<std::string> partial = l.partial_axes(m);
  std::map<std::vector<int>, Buffer> noise;  // by (coords with Replicate axes zeroed)
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(-8, 8);
  for (int r = 0; r < m.size(); ++r) {
    Buffer piece = extract(global, l.global, l.local_box(m, r));
    std::vector<int> c = m.coords(r);
    bool first = true;  // coordinate 0 on every Partial axis: holds value - sum of the others
    for (size_t i = 0; i < c.size(); ++i) {
      if (l.axes[i].is_replicate()) c[i] = 0;
      if (l.axes[i].is_partial() && c[i] != 0) first = false;
    }
    if (!first) {
      auto [it, added] = noise.try_emplace(c);
      if (added)
        for (size_t e = 0; e < piece.size(); ++e) it->second.push_back(u(rng));
      piece = it->second;
    }
    out[static_cast<size_t>(r)] = piece;
  }
  // The first addends: subtract every other addend of their group.
  if (!partial.empty())
    for (int r = 0; r < m.size(); ++r) {
      bool first = true;
      for (size_t i = 0; i < l.axes.size(); ++i)
        first = first && !(l.axes[i].is_partial() && m.coords(r)[i] != 0);
      if (!first) continue;
      for (int q : members(m, r, partial))
        if (q != r)
          for (size_t e = 0; e < out[static_cast<size_t>(r)].size(); ++e)
            out[static_cast<size_t>(r)][e] -= out[static_cast<size_t>(q)][e];
    }
  if (!l.flat_axes.empty())
    for (int r = 0; r < m.size(); ++r)
      out[static_cast<size_t>(r)] = flat_block(
          out[static_cast<size_t>(r)], m.group_size(l.flat_axes), m.group_index(r, l.flat_axes));
  return out;
}

// The global tensor the buffers hold under `l`, or an empty buffer with *why set when replicas
// disagree or a buffer has the wrong size.
inline Buffer gather(const TensorLayout& l, const Mesh& m, const Buffers& b, std::string* why) {
  const int64_t local = l.local_shape(m).value().numel();
  Buffers pieces(b.size());
  for (int r = 0; r < m.size(); ++r) {
    if (static_cast<int64_t>(b[static_cast<size_t>(r)].size()) != l.stored_numel(m)) {
      *why = "rank " + std::to_string(r) + " holds " +
             std::to_string(b[static_cast<size_t>(r)].size()) + " elements, not " +
             std::to_string(l.stored_numel(m));
      return {};
    }
    Buffer& p = pieces[static_cast<size_t>(r)];
    if (l.flat_axes.empty()) {
      p = b[static_cast<size_t>(r)];
    } else {
      for (int q : members(m, r, l.flat_axes))
        p.insert(p.end(), b[static_cast<size_t>(q)].begin(), b[static_cast<size_t>(q)].end());
      p.resize(static_cast<size_t>(local));
    }
  }
  Buffer g(static_cast<size_t>(l.global.numel()), 0.0);
  for (int r = 0; r < m.size(); ++r) {
    std::vector<int> c = m.coords(r), canon = c;
    bool is_canon = true;
    for (size_t i = 0; i < c.size(); ++i)
      if (l.axes[i].is_replicate()) {
        canon[i] = 0;
        is_canon = is_canon && c[i] == 0;
      }
    if (pieces[static_cast<size_t>(r)] != pieces[static_cast<size_t>(m.rank_of(canon))]) {
      *why = "rank " + std::to_string(r) + " differs from its replica rank " +
             std::to_string(m.rank_of(canon));
      return {};
    }
    if (is_canon) accumulate(&g, l.global, l.local_box(m, r), pieces[static_cast<size_t>(r)]);
  }
  return g;
}

// One step on every rank, from its kind, group and local shapes alone.
inline Buffers execute(const CommStep& s, const Mesh& m, const Buffers& in) {
  Buffers out(in.size());
  const int64_t n = s.group;
  for (int r = 0; r < m.size(); ++r) {
    const std::vector<int> g = members(m, r, s.axes);
    const int64_t k = m.group_index(r, s.axes);
    Buffer sum(in[static_cast<size_t>(r)].size(), 0.0);
    for (int q : g)
      for (size_t e = 0; e < sum.size(); ++e) sum[e] += in[static_cast<size_t>(q)][e];
    Buffer& o = out[static_cast<size_t>(r)];
    switch (s.kind) {
      case CommStep::all_reduce:
        o = sum;
        break;
      case CommStep::reduce_scatter:
        o = chunk(sum, s.in_shape, s.dim, n, k);
        break;
      case CommStep::all_gather: {
        std::vector<Buffer> parts;
        for (int q : g) parts.push_back(in[static_cast<size_t>(q)]);
        o = concat(parts, s.in_shape, s.dim);
        break;
      }
      case CommStep::all_to_all: {
        std::vector<Buffer> parts;
        for (int q : g)
          parts.push_back(chunk(in[static_cast<size_t>(q)], s.in_shape, s.to_dim, n, k));
        o = concat(parts, s.in_shape.with_dim(s.to_dim, s.in_shape.dim(s.to_dim) / n), s.dim);
        break;
      }
      case CommStep::local_slice:
        o = chunk(in[static_cast<size_t>(r)], s.in_shape, s.dim, n, k);
        break;
      case CommStep::to_partial:
        o = k == 0 ? in[static_cast<size_t>(r)] : Buffer(in[static_cast<size_t>(r)].size(), 0.0);
        break;
      case CommStep::flat_all_gather:
        for (int q : g)
          o.insert(o.end(), in[static_cast<size_t>(q)].begin(), in[static_cast<size_t>(q)].end());
        o.resize(static_cast<size_t>(s.out_shape.numel()));
        break;
      case CommStep::flat_reduce_scatter:
        o = flat_block(sum, n, k);
        break;
      case CommStep::flat_slice:
        o = flat_block(in[static_cast<size_t>(r)], n, k);
        break;
    }
  }
  return out;
}

}  // namespace tessera::testing_layout
