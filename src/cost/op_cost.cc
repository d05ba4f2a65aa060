#include "cost/op_cost.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tessera {

namespace {

double ceil_div(double a, double b) { return std::ceil(a / b); }

double efficiency_or(const std::map<std::string, double>& table, OpKind k, double fallback) {
  auto it = table.find(op_name(k));
  return it == table.end() ? fallback : it->second;
}

// Scales bytes counted at each tensor's stored dtype (f32 in the Program) to the compute dtype:
// under mixed precision activations move as bf16.
double bytes_at(double f32_bytes, DType compute) {
  return f32_bytes * static_cast<double>(dtype_size(compute)) / 4.0;
}

// The rate a bf16/f16 GEMM of m x n x k keeps off the tensor cores' 8-element alignment:
// `unaligned` (1 when aligned or in another dtype).
double alignment_factor(double m, double n, double k, DType compute, double unaligned) {
  auto aligned = [](double d) { return std::fmod(d, 8.0) == 0; };
  return dtype_size(compute) == 2 && !(aligned(m) && aligned(n) && aligned(k)) ? unaligned : 1.0;
}

// Attention as the kernels of a framework that keeps the score matrix in memory (op_cost.h):
// q [B,H,Tq,D], k and v [B,Hkv,Tk,D]; the backward's inputs begin with the same three. Each
// kernel is a roofline of its own plus a launch; the sum is the op's time (FLOPs excluded: the
// caller counts them by op_flops).
OpTime materialized_attention(bool backward, const std::vector<TensorType>& in,
                              const DeviceSpec& dev, double gemm_eff, DType compute) {
  const Shape &q = in[0].shape, &k = in[1].shape;
  const double bh = static_cast<double>(q[0] * q[1]), tq = static_cast<double>(q[2]),
               tk = static_cast<double>(k[2]), d = static_cast<double>(q[3]);
  const double elem = static_cast<double>(dtype_size(compute));
  const double scores = bh * tq * tk * elem;  // S, P, dP or dS
  const double q_bytes = bh * tq * d * elem, kv_bytes = static_cast<double>(k.numel()) * elem;
  const double bw = dev.memory_bandwidth * dev.memory_efficiency;
  const double peak = dev.peak_flops(compute);
  OpTime t;
  double compute_s = 0, memory_s = 0;
  auto kernel = [&](double flops, double bytes, double eff) {
    const double c = flops > 0 ? flops / (peak * std::max(eff, 1e-6)) : 0, m = bytes / bw;
    t.seconds += std::max(c, m) + dev.launch_overhead;
    t.bytes += bytes;
    compute_s += c, memory_s += m;
  };
  // A batched GEMM whose per-head products are rows x cols x depth; heads' tiles add up.
  const double unaligned =
      std::min(dev.unaligned_gemm_efficiency, dev.unaligned_attention_efficiency);
  auto gemm = [&](double rows, double cols, double depth, double bytes) {
    kernel(2.0 * bh * rows * cols * depth, bytes,
           gemm_eff * gemm_shape_efficiency(bh * rows, cols, depth, dev) *
               alignment_factor(rows, cols, depth, compute, unaligned));
  };
  if (!backward) {
    gemm(tq, tk, d, q_bytes + kv_bytes + scores);  // S = Q K^T
    kernel(0, 2.0 * scores, 1.0);                  // P = softmax(scale S + mask)
    gemm(tq, d, tk, scores + kv_bytes + q_bytes);  // O = P V
  } else {
    gemm(tq, tk, d, q_bytes + kv_bytes + scores);  // dP = dO V^T
    gemm(tk, d, tq, scores + q_bytes + kv_bytes);  // dV = P^T dO
    kernel(0, 3.0 * scores, 1.0);                  // dS = P * (dP - rowsum(dP * P))
    gemm(tq, d, tk, scores + kv_bytes + q_bytes);  // dQ = dS K
    gemm(tk, d, tq, scores + q_bytes + kv_bytes);  // dK = dS^T Q
  }
  t.bound = compute_s >= memory_s ? OpTime::compute : OpTime::memory;
  return t;
}

}  // namespace

double gemm_shape_efficiency(double m, double n, double k, const DeviceSpec& dev) {
  if (m <= 0 || n <= 0 || k <= 0) return 1.0;
  double tm = std::max(1, dev.gemm_tile_m), tn = std::max(1, dev.gemm_tile_n);
  double tiles = ceil_div(m, tm) * ceil_div(n, tn);
  double tile_util = (m * n) / (tiles * tm * tn);
  double wave_util = 1.0;
  if (dev.sm_count > 0) {
    double waves = ceil_div(tiles, dev.sm_count);
    wave_util = tiles / (waves * dev.sm_count);
  }
  double k_util = k / (k + 128.0);
  return tile_util * wave_util * k_util;
}

OpTime op_time(const Graph& g, const Node& n, const DeviceSpec& dev,
               const std::map<std::string, double>& op_efficiency, DType compute, bool fp8_gemms,
               AttentionKernel attention) {
  std::vector<TensorType> in, out;
  for (ValueId v : n.inputs) in.push_back(g.type(v));
  for (ValueId v : n.outputs) out.push_back(g.type(v));
  OpTime t;
  if (n.op == OpKind::parameter || n.op == OpKind::input || is_collective(n.op)) return t;
  // A reshape is a view on GPU backends; a spec that measured it (the CPU backend copies)
  // names it in [efficiency].
  if (n.op == OpKind::reshape && !op_efficiency.count("reshape")) return t;

  t.flops = op_flops(n.op, n.attrs, in, out);
  // An f32 Program's tensors move at the compute dtype; a graph already stored in bf16/f16
  // (ModelConfig::dtype) is counted as stored.
  auto low = [](const TensorType& x) { return is_low_precision(x.dtype); };
  const bool stored_low =
      std::any_of(in.begin(), in.end(), low) || std::any_of(out.begin(), out.end(), low);
  const double stored = op_bytes(n.op, n.attrs, in, out);
  t.bytes = stored_low ? stored : bytes_at(stored, compute);
  double peak = dev.peak_flops(compute);
  double bw = dev.memory_bandwidth;
  double compute_s = 0, memory_s = 0, cast_s = 0;

  if (is_gemm(n.op)) {
    // A fused epilogue (ops_fused.cc) is its product's GEMM: the epilogue's arithmetic runs on
    // the tile in registers, and its bytes (bias, pre) are counted in t.bytes.
    const Shape& os = out[0].shape;
    double cols = static_cast<double>(os[-1]);
    double numel = static_cast<double>(os.numel());
    const double gemm_flops =
        op_flops(OpKind::matmul, n.attrs, std::span(in).first(2), std::span(out).first(1));
    double k = numel > 0 ? gemm_flops / (2.0 * numel) : 0;
    double rows = os.rank() >= 2 ? static_cast<double>(os[-2]) : 1.0;
    double batch = numel / std::max(1.0, rows * cols);
    // A shared 2-D weight lets the batch fold into rows (one GEMM); otherwise a batched GEMM
    // whose tiles add up over the batch.
    if (in[1].shape.rank() == 2) rows *= batch, batch = 1;
    const double shape = gemm_shape_efficiency(rows * batch, cols, k, dev);
    const double alignment =
        alignment_factor(rows, cols, k, compute, dev.unaligned_gemm_efficiency);
    // A fused kind the spec did not calibrate runs at matmul's efficiency.
    double eff = efficiency_or(op_efficiency, n.op,
                               efficiency_or(op_efficiency, OpKind::matmul, dev.gemm_efficiency)) *
                 shape * alignment;
    memory_s = t.bytes / (bw * dev.memory_efficiency);
    if (fp8_gemms && n.layer >= 0 && dev.peak_flops_fp8 > 0) {
      // A transformer block's GEMM: FP8 operands and a bf16 output; the left operand cast
      // first (2 bytes read, 1 written). The LM head stays bf16, as Megatron-Core's does.
      const double left = static_cast<double>(in[0].shape.numel());
      double gemm_bytes = left + static_cast<double>(in[1].shape.numel()) + 2.0 * numel;
      // A fused epilogue's bias or pre read, and pre or the bias gradient written, in bf16.
      for (size_t i = 2; i < in.size(); ++i) gemm_bytes += 2.0 * in[i].shape.numel();
      for (size_t i = 1; i < out.size(); ++i) gemm_bytes += 2.0 * out[i].shape.numel();
      peak = dev.peak_flops_fp8;
      eff = dev.fp8_gemm_efficiency * shape * alignment;
      memory_s = gemm_bytes / (bw * dev.memory_efficiency);
      cast_s = 3.0 * left / (bw * dev.memory_efficiency) + dev.launch_overhead;
      t.bytes = gemm_bytes + 3.0 * left;
    }
    compute_s = gemm_flops / (peak * std::max(eff, 1e-6));
  } else if ((n.op == OpKind::attention || n.op == OpKind::attention_grad) &&
             attention == AttentionKernel::materialized) {
    const OpTime m = materialized_attention(
        n.op == OpKind::attention_grad, in, dev,
        efficiency_or(op_efficiency, OpKind::matmul, dev.gemm_efficiency), compute);
    t.seconds = m.seconds, t.bytes = m.bytes, t.bound = m.bound;
    return t;
  } else if (n.op == OpKind::attention || n.op == OpKind::attention_grad) {
    // FLOPs are counted as full attention (the MFU convention); a causal kernel skips the
    // masked part of the score matrix, a bidirectional one (encoders) computes all of it. The
    // masked part is half of a square; of a context-parallel chunk's Tq x Tk rectangle it
    // depends on the chunk, and the last one, the slowest (the others wait for it at the next
    // collective), skips only Tq x Tq / 2: the fraction computed is 1 - Tq / (2 Tk).
    double eff = efficiency_or(op_efficiency, n.op, dev.attention_efficiency);
    const double tq = static_cast<double>(in[0].shape[2]), tk = static_cast<double>(in[1].shape[2]);
    // A zigzag order gives every chunk half of its rectangle. Ring attention's step over one
    // key chunk (a key block, from axis_index with GroupAttrs::back = the step): on the last
    // rank, the slowest, step 0 is its own chunk (half masked) and every later one an earlier
    // chunk (none masked).
    const AttentionAttrs& at = n.attr<AttentionAttrs>();
    const int key_block = optional_inputs(in, n.op == OpKind::attention ? 3 : 6).key_block;
    bool later_step = false;
    if (key_block >= 0) {
      const Node& index = g.node(g.value(n.inputs[static_cast<size_t>(key_block)]).producer);
      later_step = index.op == OpKind::axis_index && index.attr<GroupAttrs>().back > 0;
    }
    const double computed = !at.causal || tk <= 0 ? 1.0
                            : at.zigzag > 0       ? 0.5
                            : key_block >= 0      ? (later_step ? 1.0 : 0.5)
                                                  : 1.0 - tq / (2.0 * tk);
    compute_s = computed * t.flops / (peak * eff);
    memory_s = t.bytes / (bw * dev.memory_efficiency);
  } else {
    double eff = efficiency_or(op_efficiency, n.op, dev.memory_efficiency);
    memory_s = t.bytes / (bw * eff);
    // Elementwise arithmetic runs on the vector units (f32 peak), never on tensor cores.
    compute_s = t.flops / std::max(dev.peak_flops_f32, 1.0);
  }
  t.seconds = std::max(compute_s, memory_s) + cast_s + dev.launch_overhead;
  t.bound = compute_s >= memory_s ? OpTime::compute : OpTime::memory;
  if (compute_s == 0 && memory_s == 0) t.bound = OpTime::overhead;
  return t;
}

}  // namespace tessera
