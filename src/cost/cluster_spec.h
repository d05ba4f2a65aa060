// ClusterSpec: what the cost model knows about a cluster — its devices, how they are wired
// inside a node, the network between nodes, and how efficiently real kernels and collectives
// use them. Specs are TOML; presets ship in clusters/*.toml (compiled into the binary) and
// every number in a preset cites its source in a comment.
//
//   TS_ASSIGN_OR_RETURN(ClusterSpec c, load_cluster("dgx-a100"));     // preset name ...
//   TS_ASSIGN_OR_RETURN(ClusterSpec d, load_cluster("my_cluster.toml"));  // ... or a file
//   c.device.peak_flops(DType::bf16);   // 312e12
//   c.nodes_for(1024);                  // 128
//
// Units are SI throughout: FLOP/s, bytes/s, bytes, seconds. Link bandwidths are one
// direction, per device (intra-node) or per NIC (inter-node).
//
// The TOML layout (see clusters/dgx-a100.toml for a commented example):
//   name = "dgx-a100"          description = "..."        price_per_device_hour = 0.0
//   [device]  name, peak_tflops_f32, peak_tflops_bf16, peak_tflops_f16, peak_tflops_fp8,
//             memory_gib, memory_bandwidth_gbs, launch_overhead_us, gemm_efficiency,
//             unaligned_gemm_efficiency, unaligned_attention_efficiency, fp8_gemm_efficiency,
//             memory_efficiency, attention_efficiency, optimizer_efficiency, sm_count,
//             gemm_tile_m, gemm_tile_n
//   [node]    devices, intra_bandwidth_gbs, intra_latency_us, intra_efficiency, comm_overlap
//   [network] nics, nic_gbits, latency_us, efficiency, topology, oversubscription
//   [efficiency]  op_name = fraction   (optional; overrides the defaults per op kind, e.g.
//                 written by `tessera calibrate`)
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "ir/dtype.h"

namespace tessera {

struct DeviceSpec {
  std::string name;
  double peak_flops_f32 = 0;   // dense FLOP/s
  double peak_flops_bf16 = 0;  // dense FLOP/s (tensor cores / matrix cores)
  double peak_flops_f16 = 0;
  double peak_flops_fp8 = 0;    // dense FP8 tensor-core FLOP/s (0: the device has none)
  double memory_bytes = 0;      // capacity
  double memory_bandwidth = 0;  // bytes/s
  double launch_overhead = 0;   // seconds per kernel (fixed cost of every compute op)
  // Achievable fractions of peak for the best-shaped GEMM, of memory bandwidth for streaming
  // kernels, and of peak for fused attention. Shape effects (tile and wave quantization) are
  // applied on top by cost/op_cost.h.
  double gemm_efficiency = 0.8;
  // The fraction of that rate a bf16/f16 GEMM keeps when one of its dimensions is not a
  // multiple of 8 elements (16 bytes: the tensor-core kernels' vector loads), e.g. GPT-2's
  // 50,257-row LM head; 1 where alignment does not matter.
  double unaligned_gemm_efficiency = 1.0;
  // The same for the batched GEMMs of an attention that keeps its score matrix (Q K^T and P V
  // per head, cuBLAS's strided-batched kernels), e.g. heads 108 wide; they keep at most
  // unaligned_gemm_efficiency. 1: as unaligned_gemm_efficiency.
  double unaligned_attention_efficiency = 1.0;
  // Fraction of peak_flops_fp8 the best-shaped FP8 GEMM reaches (Transformer Engine's recipe:
  // e4m3/e5m2 operands with per-tensor scales, bf16 output).
  double fp8_gemm_efficiency = 0.5;
  double memory_efficiency = 0.8;
  double attention_efficiency = 0.5;
  // Fraction of memory_bandwidth the optimizer's passes reach (AdamW over the local blocks,
  // gradient accumulation): their own kernels, outside the op table.
  double optimizer_efficiency = 0.8;
  int sm_count = 0;       // streaming multiprocessors / compute units (0: no wave quantization)
  int gemm_tile_m = 128;  // output tile of one thread block (tile quantization)
  int gemm_tile_n = 128;

  double peak_flops(DType t) const;  // bf16/f16 fall back to f32 when 0
  bool operator==(const DeviceSpec&) const = default;
};

struct NodeSpec {
  int devices = 1;                // devices per node
  double intra_bandwidth = 0;     // bytes/s, one direction, per device (NVLink, xGMI, shm)
  double intra_latency = 0;       // seconds per message
  double intra_efficiency = 1.0;  // achievable fraction of intra_bandwidth for collectives
  // Fraction of a collective's time that overlaps compute for free. GPUs: 1 (DMA engines and a
  // few SMs). CPU ranks: below 1 — the comm thread reduces and copies on the compute cores, so
  // (1 - comm_overlap) of each collective's time is taken from the compute stream.
  double comm_overlap = 1.0;
  // The host side, for offloading the optimizer (Plan::offload): CPU memory per node and its
  // bandwidth (shared by the node's ranks), the host-device link per device (PCIe, or
  // MI250X's Infinity Fabric to the CPU; one direction) and the fraction of it copies reach,
  // and the fraction of the host memory bandwidth the CPU's AdamW reaches (its passes stream
  // the f32 state). 0 bandwidths: unknown, and offload is not planned on the cluster.
  double host_memory_bytes = 0;
  double host_memory_bandwidth = 0;
  double host_link_bandwidth = 0;
  double host_link_efficiency = 0.8;
  double host_optimizer_efficiency = 0.5;
  bool offload_known() const { return host_memory_bandwidth > 0 && host_link_bandwidth > 0; }
  // Bytes/s the host's AdamW streams for one of `ranks` ranks sharing the node (at most its
  // devices), and the host link's achievable bytes/s: the offloaded optimizer's two rates.
  double host_optimizer_rate(int ranks) const;
  // How many of a job's `ranks` share one node (at most its devices, at least 1).
  int ranks_per_node(int ranks) const;
  double host_link_rate() const { return host_link_bandwidth * host_link_efficiency; }
  bool operator==(const NodeSpec&) const = default;
};

struct NetworkSpec {
  int nics = 0;              // per node (0: single node only)
  double nic_bandwidth = 0;  // bytes/s, one direction, per NIC
  double latency = 0;        // seconds per message between nodes
  double efficiency = 1.0;   // achievable fraction (protocol overhead: TCP ~0.6, IB ~0.9)
  std::string topology = "fat-tree";
  double oversubscription = 1.0;  // >1: the fabric above a leaf switch is that much thinner

  // Usable bytes/s leaving one node: nics * nic_bandwidth * efficiency / oversubscription.
  double node_bandwidth() const;
  bool operator==(const NetworkSpec&) const = default;
};

struct ClusterSpec {
  std::string name;
  std::string description;
  DeviceSpec device;
  NodeSpec node;
  NetworkSpec network;
  double price_per_device_hour = 0;
  // Per-op efficiency overrides (op name -> roofline time / achieved time; usually a fraction,
  // above 1 where a CPU op's tensors stay in cache and beat the streaming bandwidth).
  std::map<std::string, double> op_efficiency;

  int nodes_for(int devices) const;  // ceil(devices / node.devices)
  bool operator==(const ClusterSpec&) const = default;
};

// The values [network] topology (NetworkSpec::topology) accepts. Recorded, not yet modelled:
// collectives between nodes are timed on per-node bandwidth and oversubscription whatever the
// topology (`simulate` says so when a spec names another than a fat tree).
inline constexpr const char* kNetworkTopologies[] = {"fat-tree", "dragonfly", "torus"};

// Parses a spec; `source` names it in errors ("clusters/dgx-a100.toml:12: key
// 'device.peak_tflops_bf16' must be a number ..."). Unknown keys are refused.
Result<ClusterSpec> parse_cluster_spec(const std::string& toml_text, const std::string& source);
// A preset name (see cluster_presets()) or a path to a .toml file.
Result<ClusterSpec> load_cluster(const std::string& name_or_path);

// A device's FLOP/s at `precision` over the bytes/s of its intra-node link: what a byte sent
// over a tensor axis (the innermost, one node) costs in FLOPs (SearchCost::flops_per_byte).
double flops_per_intra_byte(const ClusterSpec& c, DType precision);
// The device of the shipped preset whose GPU a driver's product name is ("NVIDIA H100 80GB
// HBM3", "NVIDIA A100-SXM4-40GB", "AMD Instinct MI250X"): its datasheet peaks, for the MFU
// every published run reports. An H200 has the H100 SXM's tensor cores (its name says H200);
// nullopt for a device no preset holds (an H100 PCIe, whose peaks differ, or the CPU).
std::optional<DeviceSpec> datasheet_device(const std::string& product);
// Names of the shipped presets, sorted.
std::vector<std::string> cluster_presets();
// The TOML text of a preset ("" when unknown): the file under clusters/ the binary embeds.
std::string cluster_preset_text(const std::string& name);
// Serializes a spec as TOML that parse_cluster_spec reads back (used by `tessera calibrate`).
// parse(to_toml(c)) == c for every spec that parse produced; a computed *_us value (seconds
// stored, microseconds written) may come back one ulp off.
std::string cluster_spec_to_toml(const ClusterSpec& c);

}  // namespace tessera
