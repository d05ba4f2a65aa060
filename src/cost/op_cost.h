// The time of one compute op on one device: a roofline (FLOPs at peak vs bytes at memory
// bandwidth) scaled by an efficiency, plus the fixed launch overhead of a kernel.
//
//   OpTime t = op_time(graph, node, cluster.device, cluster.op_efficiency, DType::bf16);
//   t.seconds;  t.flops;  t.bytes;  t.bound == OpTime::compute
//
// GEMMs (matmul, and the GEMMs inside embedding_grad) get a shape-dependent efficiency:
//   eff = device.gemm_efficiency * tile_util * wave_util * k_util, where
//   tile_util = (m*n) / (ceil(m/tm)*tm * ceil(n/tn)*tn)   (partial edge tiles do full work)
//   wave_util = tiles / (ceil(tiles / sm_count) * sm_count)  (the last wave is partly idle)
//   k_util    = k / (k + 128)                               (prologue/epilogue per tile)
// times device.unaligned_gemm_efficiency for a bf16/f16 GEMM with a dimension that is not a
// multiple of 8 (an unpadded 50,257-row vocabulary: ~0.15 of the rate on an H100).
// FP8 GEMMs (Transformer Engine's recipe, beside bf16: the GEMMs inside transformer blocks;
// the LM head stays bf16) run at device.peak_flops_fp8 *
// device.fp8_gemm_efficiency * the shape factors, read one byte per operand element, and first
// cast their left (activation) operand in a pass of its own: 2 bytes read and 1 written per
// element at memory bandwidth, not overlapped (weights keep an FP8 copy, cast once per step).
// Fused attention (FlashAttention's kind: no score matrix in memory) uses
// device.attention_efficiency. A materialized attention (AttentionKernel::materialized: the
// frameworks before FlashAttention, e.g. Megatron-LM of 2021-22) is the kernels it ran instead:
// batched GEMMs Q K^T and P V (the full Tq x Tk rectangle, causal or not) at the GEMM efficiency
// and shape factors of each (off the 8-element alignment: the lesser of
// device.unaligned_gemm_efficiency and unaligned_attention_efficiency), with the score matrix S = B
// x H x Tq x Tk elements at the compute dtype written, softmaxed in a memory-bound pass (read S,
// write P) and read back; its backward is four batched GEMMs (dP = dO V^T, dV = P^T dO, dQ = dS K,
// dK = dS^T Q) around a softmax gradient pass (read P and dP, write dS). Each kernel is its own
// roofline plus a launch. Everything else is memory-bound work at device.memory_bandwidth *
// memory_efficiency (bytes from op_bytes, scaled to the compute dtype: activations move in bf16
// under mixed precision; an op with bf16/f16 operands, from a graph stored in low precision, counts
// its bytes as stored). An entry in `op_efficiency` (op name -> fraction) replaces the default
// efficiency of that op kind — `tessera calibrate` measures them.
#pragma once

#include <map>
#include <string>

#include "cost/cluster_spec.h"
#include "ir/graph.h"

namespace tessera {

struct OpTime {
  enum Bound : uint8_t { compute, memory, overhead };
  double seconds = 0;
  double flops = 0;  // arithmetic work (op_flops)
  double bytes = 0;  // memory traffic at the compute dtype
  Bound bound = overhead;
};

// How attention runs (see above): one fused kernel, or kernels around a score matrix in memory.
enum class AttentionKernel : uint8_t { fused, materialized };

// `compute` is the dtype arithmetic runs in (f32 on CPU; bf16 under mixed precision);
// `fp8_gemms`: GEMMs in FP8 beside bf16 (see above); `attention`: its kernel (see above).
OpTime op_time(const Graph& g, const Node& n, const DeviceSpec& dev,
               const std::map<std::string, double>& op_efficiency, DType compute,
               bool fp8_gemms = false, AttentionKernel attention = AttentionKernel::fused);

// Shape efficiency of an m x n x k GEMM on `dev` (the product of the factors above, without
// device.gemm_efficiency).
double gemm_shape_efficiency(double m, double n, double k, const DeviceSpec& dev);

}  // namespace tessera
