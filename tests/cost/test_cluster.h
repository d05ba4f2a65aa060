// A small hand-written ClusterSpec for cost and simulator tests: round numbers, so that
// expected times can be computed by hand.
#pragma once

#include "cost/cluster_spec.h"

namespace tessera::testing {

inline ClusterSpec round_cluster(int devices_per_node = 8, int nics = 8) {
  ClusterSpec c;
  c.name = "round";
  c.device.name = "R100";
  c.device.peak_flops_f32 = 100e12;
  c.device.peak_flops_bf16 = 200e12;
  c.device.memory_bytes = 80e9;
  c.device.memory_bandwidth = 2e12;
  c.device.launch_overhead = 5e-6;
  c.device.gemm_efficiency = 0.8;
  c.device.memory_efficiency = 0.5;
  c.device.attention_efficiency = 0.5;
  c.device.sm_count = 100;
  c.node.devices = devices_per_node;
  c.node.intra_bandwidth = 200e9;
  c.node.intra_latency = 2e-6;
  c.network.nics = nics;
  c.network.nic_bandwidth = 25e9;
  c.network.latency = 5e-6;
  return c;
}

}  // namespace tessera::testing
