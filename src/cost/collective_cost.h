// The time of a collective over a group of devices: α-β per topology level.
//
//   GroupLayout grp{.size = 64, .per_node = 8};            // 8 nodes x 8 devices
//   double s = collective_time(OpKind::all_reduce, 1 << 30, grp, cluster, CollAlgo::automatic);
//
// `bytes` is the size of the whole tensor (all_reduce: the operand; reduce_scatter: the
// unreduced input; all_gather: the gathered output; all_to_all and ring_shift: one rank's
// input). A group has `size` members, `per_node` of them on each node it spans (nodes = size /
// per_node). Every device of a node runs the same program, so node.devices / per_node groups
// cross the node's NICs at the same time and share them: one group's inter-node bandwidth is
// node_bandwidth * per_node / node.devices.
//
// Algorithms (p = size, n = nodes, k = per_node, S = bytes, B_intra = per-device link rate,
// B_inter = the group's share of a node's NICs; an all_reduce is reduce_scatter + all_gather):
//   ring          (p-1) steps per phase; every step pays the slowest hop's α and moves S/p
//                 over the slowest link: min(B_intra, B_inter) when the ring spans nodes.
//   tree          double binary tree (all_reduce only): 2*log2(p) α + 2*S/B (pipelined).
//   hierarchical  intra-node reduce_scatter (k-1 steps, B_intra), inter-node ring over n nodes
//                 on S/k per device at B_inter/k each, intra-node all_gather.
//   automatic     the fastest of the three (what NCCL's tuner approximates).
// all_to_all is a pairwise exchange whatever the algorithm: (p-1) α, and S/p to each other
// member, those on the node at B_intra while those beyond share the device's part of the NICs.
// ring_shift (`bytes`: one rank's operand, sent to the next member) is one step of a ring: α
// and S over the slowest hop.
#pragma once

#include <string>

#include "cost/cluster_spec.h"
#include "ir/op.h"

namespace tessera {

enum class CollAlgo : uint8_t { automatic, ring, tree, hierarchical };
const char* coll_algo_name(CollAlgo a);
bool parse_coll_algo(const std::string& s, CollAlgo* out);

struct GroupLayout {
  int size = 1;      // members of the group
  int per_node = 1;  // members on each node the group spans (size % per_node == 0)
  int nodes() const { return size / per_node; }
};

struct CollTime {
  double seconds = 0;
  CollAlgo algo = CollAlgo::ring;  // the algorithm chosen (never automatic)
};

CollTime collective_time(OpKind kind, double bytes, const GroupLayout& group,
                         const ClusterSpec& cluster, CollAlgo algo = CollAlgo::automatic);

}  // namespace tessera
