#include "cost/collective_cost.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tessera {

const char* coll_algo_name(CollAlgo a) {
  switch (a) {
    case CollAlgo::automatic:
      return "auto";
    case CollAlgo::ring:
      return "ring";
    case CollAlgo::tree:
      return "tree";
    case CollAlgo::hierarchical:
      return "hierarchical";
  }
  return "?";
}

bool parse_coll_algo(const std::string& s, CollAlgo* out) {
  for (CollAlgo a : {CollAlgo::automatic, CollAlgo::ring, CollAlgo::tree, CollAlgo::hierarchical})
    if (s == coll_algo_name(a)) return *out = a, true;
  return false;
}

namespace {

struct Links {
  double intra_bw, intra_lat;  // per device, inside a node
  double inter_bw, inter_lat;  // the group's share of one node's NICs
};

Links links_of(const GroupLayout& grp, const ClusterSpec& c) {
  Links l;
  l.intra_bw = c.node.intra_bandwidth * c.node.intra_efficiency;
  l.intra_lat = c.node.intra_latency;
  // node.devices / per_node groups run the same collective at once and share the NICs.
  double share = static_cast<double>(grp.per_node) / std::max(1, c.node.devices);
  l.inter_bw = c.network.node_bandwidth() * std::min(1.0, share);
  l.inter_lat = c.network.latency;
  return l;
}

// One phase (reduce_scatter or all_gather) of a ring over p members moving S bytes in total.
double ring_phase(double S, double p, double bw, double lat) {
  if (p <= 1) return 0;
  return (p - 1) * (lat + S / p / bw);
}

double phases(OpKind kind) { return kind == OpKind::all_reduce ? 2.0 : 1.0; }

double ring(OpKind kind, double S, const GroupLayout& grp, const Links& l) {
  bool spans = grp.nodes() > 1;
  double bw = spans ? std::min(l.intra_bw, l.inter_bw) : l.intra_bw;
  double lat = spans ? std::max(l.intra_lat, l.inter_lat) : l.intra_lat;
  return phases(kind) * ring_phase(S, grp.size, bw, lat);
}

double tree(OpKind kind, double S, const GroupLayout& grp, const Links& l) {
  if (kind != OpKind::all_reduce) return std::numeric_limits<double>::infinity();
  bool spans = grp.nodes() > 1;
  double bw = spans ? std::min(l.intra_bw, l.inter_bw) : l.intra_bw;
  double lat = spans ? std::max(l.intra_lat, l.inter_lat) : l.intra_lat;
  return 2.0 * std::ceil(std::log2(std::max(2, grp.size))) * lat + 2.0 * S / bw;
}

double hierarchical(OpKind kind, double S, const GroupLayout& grp, const Links& l) {
  double k = grp.per_node, n = grp.nodes();
  if (n <= 1 || k <= 1) return ring(kind, S, grp, l);
  // Intra-node phase(s) on the whole tensor, then an inter-node ring in which each of the k
  // devices owns S/k and gets 1/k of the group's NIC share.
  double intra = phases(kind) * ring_phase(S, k, l.intra_bw, l.intra_lat);
  double inter = phases(kind) * ring_phase(S / k, n, l.inter_bw / k, l.inter_lat);
  return intra + inter;
}

// All-to-all as a pairwise exchange: p-1 steps, each rank sending S/p to every other member,
// the k-1 on its node over the intra-node links while the p-k beyond it share its part of the
// NICs (inter_bw / k per device): the slower of the two, plus a latency per step.
double all_to_all(double S, const GroupLayout& grp, const Links& l) {
  const double p = grp.size, k = grp.per_node;
  const bool spans = grp.nodes() > 1;
  const double lat = spans ? std::max(l.intra_lat, l.inter_lat) : l.intra_lat;
  const double intra = (k - 1) * S / p / l.intra_bw;
  const double inter = spans ? (p - k) * S / p / (l.inter_bw / k) : 0.0;
  return (p - 1) * lat + std::max(intra, inter);
}

// A ring shift: every rank sends its S bytes to the next at once; the step takes the slowest
// hop's (an inter-node one when the group spans nodes).
double ring_shift(double S, const GroupLayout& grp, const Links& l) {
  const bool spans = grp.nodes() > 1;
  const double bw = spans ? std::min(l.intra_bw, l.inter_bw) : l.intra_bw;
  return (spans ? std::max(l.intra_lat, l.inter_lat) : l.intra_lat) + S / bw;
}

}  // namespace

CollTime collective_time(OpKind kind, double bytes, const GroupLayout& grp, const ClusterSpec& c,
                         CollAlgo algo) {
  CollTime t;
  if (grp.size <= 1 || bytes <= 0) return t;
  Links l = links_of(grp, c);
  if (kind == OpKind::all_to_all) {  // one algorithm whatever `algo` says
    t.seconds = all_to_all(bytes, grp, l);
    return t;
  }
  if (kind == OpKind::ring_shift) {
    t.seconds = ring_shift(bytes, grp, l);
    return t;
  }
  auto eval = [&](CollAlgo a) {
    switch (a) {
      case CollAlgo::ring:
        return ring(kind, bytes, grp, l);
      case CollAlgo::tree:
        return tree(kind, bytes, grp, l);
      case CollAlgo::hierarchical:
        return hierarchical(kind, bytes, grp, l);
      case CollAlgo::automatic:
        break;
    }
    return std::numeric_limits<double>::infinity();
  };
  if (algo != CollAlgo::automatic) {
    t.algo = algo;
    t.seconds = eval(algo);
    if (std::isinf(t.seconds)) t.seconds = eval(CollAlgo::ring), t.algo = CollAlgo::ring;
    return t;
  }
  t.seconds = std::numeric_limits<double>::infinity();
  for (CollAlgo a : {CollAlgo::ring, CollAlgo::tree, CollAlgo::hierarchical}) {
    double s = eval(a);
    if (s < t.seconds) t.seconds = s, t.algo = a;
  }
  return t;
}

}  // namespace tessera
