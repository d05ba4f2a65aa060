#include "sim/simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "../cost/test_cluster.h"
#include "cost/op_cost.h"
#include "models/model.h"
#include "parallel/sharding_search.h"
#include "sim/sim_internal.h"

namespace tessera {
namespace {

using testing::round_cluster;

Program lowered_config(const ModelConfig& cfg, int64_t batch, int64_t seq, const Plan& plan) {
  ModelGraph m = build_model(cfg, batch, seq, ModelMode::train);
  Result<Program> p = lower(m.graph, plan);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return std::move(*p);
}

Program lowered(const std::string& preset, int64_t batch, int64_t seq, const Plan& plan) {
  return lowered_config(*find_preset(preset), batch, seq, plan);
}

TEST(Simulator, OneDeviceIsTheSumOfItsOps) {
  ClusterSpec c = round_cluster(1, 0);
  Program p = lowered("gpt-tiny", 4, 32, Plan::data_parallel(1));
  SimOptions o;
  Result<SimResult> r = simulate(p, c, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  double ops = 0;
  for (const Instruction& in : p.micro_step)
    ops += op_time(p.local(), p.local().node(in.node), c.device, {}, DType::f32).seconds;
  // One micro-batch: the optimizer reads the gradients where the micro-step left them.
  EXPECT_EQ(r->seconds_by_op.count("accumulate_grads"), 0u);
  EXPECT_NEAR(r->compute_seconds - r->optimizer_seconds, ops, 1e-12);
  EXPECT_GT(r->optimizer_seconds, 0);
  EXPECT_NEAR(r->step_seconds, r->compute_seconds, 1e-12);
  EXPECT_EQ(r->exposed_comm_seconds, 0);
  EXPECT_EQ(r->tokens_per_step, 4 * 32);
  EXPECT_NEAR(r->model_flops_per_step, p.local().total_flops(), 1e-6 * p.local().total_flops());
  EXPECT_DOUBLE_EQ(r->peak_memory_bytes,
                   static_cast<double>(p.persistent_bytes() + p.memory.arena_bytes));
}

// A group that does not fill whole nodes (12 ranks on nodes of 8: 8 + 4) is timed as equal
// nodes of 4, not as 12 nodes of one (every hop inter-node, ~3x too slow before), so 12 GPUs
// land between 8 and 16 on the same per-GPU work.
TEST(Simulator, RaggedNodesAreTimedAsTheirCommonDivisor) {
  const Mesh dp12({MeshAxis{"dp", 12}});
  EXPECT_EQ(group_layout(dp12, {"dp"}, 8).per_node, 4);
  EXPECT_EQ(group_layout(dp12, {"dp"}, 8).nodes(), 3);
  EXPECT_EQ(group_layout(Mesh({MeshAxis{"dp", 16}}), {"dp"}, 8).per_node, 8);
  EXPECT_EQ(group_layout(Mesh({MeshAxis{"dp", 6}}), {"dp"}, 8).per_node, 6);
  const ClusterSpec c = *load_cluster("dgx-a100");
  ModelConfig cfg = *find_preset("gpt2-small");
  auto step = [&](int gpus) {
    ModelGraph m = build_model(cfg, gpus, 256, ModelMode::train);
    Result<Program> p = lower(m.graph, Plan::data_parallel(gpus, 3));
    EXPECT_TRUE(p.ok());
    Result<SimResult> r = simulate(*p, c, SimOptions{});
    EXPECT_TRUE(r.ok());
    return r->step_seconds;
  };
  const double s8 = step(8), s12 = step(12), s16 = step(16);
  EXPECT_GT(s12, s8);
  EXPECT_LT(s12, s16 * 1.5) << "8: " << s8 << " s, 12: " << s12 << " s, 16: " << s16 << " s";
}

TEST(Simulator, GradientAccumulationRepeatsTheMicroStep) {
  ClusterSpec c = round_cluster(1, 0);
  Plan one = Plan::data_parallel(1), four = one;
  four.micro_batches = 4;
  SimResult a = *simulate(lowered("gpt-tiny", 4, 32, one), c, {});
  SimResult b = *simulate(lowered("gpt-tiny", 4, 32, four), c, {});
  // Four micro-steps; the gradients are copied into persistent buffers after the first and
  // added after the others (2 and 3 passes over them); one micro-step copies nothing.
  const Program p = lowered("gpt-tiny", 4, 32, four);
  double grads = 0;
  for (const ParamLayout& pl : p.part.params)
    grads += static_cast<double>(p.local().type(pl.local_grad).bytes());
  const double pass = grads / (c.device.memory_bandwidth * c.device.optimizer_efficiency);
  EXPECT_EQ(a.seconds_by_op.count("accumulate_grads"), 0u);
  const double b_acc = b.seconds_by_op.at("accumulate_grads");
  EXPECT_NEAR(b_acc, pass * (2 + 3 + 3 + 3), 1e-12);
  EXPECT_NEAR(b.step_seconds - b.optimizer_seconds - b_acc,
              4 * (a.step_seconds - a.optimizer_seconds), 1e-9);
  EXPECT_EQ(b.tokens_per_step, 4 * a.tokens_per_step);
  // Four micro-batches are four times the FLOPs of one (not sixteen: MFU stays below 100%).
  EXPECT_NEAR(b.model_flops_per_step, 4 * a.model_flops_per_step, 1e-9 * b.model_flops_per_step);
  EXPECT_NEAR(b.hardware_flops_per_step, 4 * a.hardware_flops_per_step,
              1e-9 * b.hardware_flops_per_step);
  EXPECT_NEAR(b.mfu / a.mfu, 4 * a.step_seconds / b.step_seconds, 1e-9);
}

// A framework whose weight-gradient GEMMs add into the sums themselves (Megatron's gradient-
// accumulation fusion) has no accumulation pass: four micro-steps, then the optimizer.
TEST(Simulator, FusedGradientAccumulationHasNoPassOfItsOwn) {
  ClusterSpec c = round_cluster(1, 0);
  Plan one = Plan::data_parallel(1), four = one;
  four.micro_batches = 4;
  SimOptions fused;
  fused.fused_grad_accumulation = true;
  SimResult a = *simulate(lowered("gpt-tiny", 4, 32, one), c, fused);
  SimResult b = *simulate(lowered("gpt-tiny", 4, 32, four), c, fused);
  SimResult unfused = *simulate(lowered("gpt-tiny", 4, 32, four), c, {});
  EXPECT_EQ(b.seconds_by_op.count("accumulate_grads"), 0u);
  EXPECT_NEAR(b.step_seconds - b.optimizer_seconds, 4 * (a.step_seconds - a.optimizer_seconds),
              1e-9);
  EXPECT_NEAR(unfused.step_seconds - b.step_seconds, unfused.seconds_by_op.at("accumulate_grads"),
              1e-9);
}

// A framework that sums fp16 gradients in fp16 (SimOptions::f16_gradient_sums) holds 2 bytes
// per parameter for them, not f32's 4: without stages (several micro-batches) and in a
// pipeline's stages alike; bf16 runs and the step's time are unchanged.
TEST(Simulator, F16GradientSumsHoldTwoBytesAParameter) {
  ClusterSpec c = round_cluster(2, 0);
  ModelGraph m = build_model(*find_preset("gpt-tiny"), 8, 32, ModelMode::train);
  Plan flat = Plan::data_parallel(1);
  flat.micro_batches = 4;
  Plan piped = Plan::pipeline_parallel(2, 1, 1);
  piped.micro_batches = 4;
  for (const Plan& plan : {flat, piped}) {
    SCOPED_TRACE(plan.describe());
    SimOptions o;
    o.precision = DType::f16;
    const Result<SimResult> f32_sums = simulate_plan(m.graph, plan, c, o);
    o.f16_gradient_sums = true;
    const Result<SimResult> f16_sums = simulate_plan(m.graph, plan, c, o);
    o.precision = DType::bf16;
    const Result<SimResult> bf16_flag = simulate_plan(m.graph, plan, c, o);
    o.f16_gradient_sums = false;
    const Result<SimResult> bf16 = simulate_plan(m.graph, plan, c, o);
    ASSERT_TRUE(f32_sums.ok() && f16_sums.ok() && bf16.ok() && bf16_flag.ok());
    const double saved = f32_sums->persistent_bytes - f16_sums->persistent_bytes;
    EXPECT_GT(saved, 0);
    EXPECT_EQ(f16_sums->step_seconds, f32_sums->step_seconds);
    EXPECT_EQ(bf16_flag->persistent_bytes, bf16->persistent_bytes);
    if (plan.stages() == 1)
      EXPECT_DOUBLE_EQ(saved, 2.0 * static_cast<double>(m.graph.param_count()));
    else  // each stage holds part of the parameters: the fullest one saves less than all
      EXPECT_LT(saved, 2.0 * static_cast<double>(m.graph.param_count()));
  }
}

TEST(Simulator, DataParallelOverlapsGradientReductionWithBackward) {
  ClusterSpec c = round_cluster();
  SimOptions o;
  o.precision = DType::bf16;
  SimResult dp = *simulate(lowered("gpt2-small", 16, 1024, Plan::data_parallel(16, 0)), c, o);
  SimResult one = *simulate(lowered("gpt2-small", 1, 1024, Plan::data_parallel(1)), c, o);
  EXPECT_EQ(dp.devices, 16);
  EXPECT_GT(dp.comm_seconds, 0);
  // Buckets overlap the backward pass: far less is exposed than the comm stream's busy time.
  EXPECT_LT(dp.exposed_comm_seconds, 0.5 * dp.comm_seconds);
  // Each rank computes what one device does on its 1/16 of the batch, plus the zero fills of
  // the gradient buffers the partition pass adds.
  double dp_micro = dp.compute_seconds - dp.optimizer_seconds;
  double one_micro = one.compute_seconds - one.optimizer_seconds;
  EXPECT_GE(dp_micro, one_micro);
  EXPECT_LT(dp_micro, 1.2 * one_micro);
  EXPECT_NEAR(dp.step_seconds, dp.compute_seconds + dp.exposed_comm_seconds, 1e-9);
  EXPECT_NEAR(dp.tokens_per_second, 16 * 1024 / dp.step_seconds, 1e-6 * dp.tokens_per_second);
  EXPECT_GT(dp.mfu, 0.05);
  EXPECT_LT(dp.mfu, 0.8);
}

TEST(Simulator, SlowerNetworkExposesMoreCommunication) {
  ClusterSpec fast = round_cluster(), slow = round_cluster(8, 1);
  SimOptions o;
  o.precision = DType::bf16;
  Program p = lowered("gpt2-small", 32, 1024, Plan::data_parallel(32, 3));
  SimResult a = *simulate(p, fast, o), b = *simulate(p, slow, o);
  EXPECT_GT(b.step_seconds, a.step_seconds);
  EXPECT_GT(b.exposed_comm_seconds, a.exposed_comm_seconds);
  EXPECT_NEAR(a.compute_seconds, b.compute_seconds, 1e-12);
}

TEST(Simulator, MixedPrecisionHalvesActivationsAndSpeedsUpGemms) {
  ClusterSpec c = round_cluster();
  Program p = lowered("gpt2-small", 8, 512, Plan::data_parallel(8, 3));
  SimOptions f32, bf;
  bf.precision = DType::bf16;
  SimResult a = *simulate(p, c, f32), b = *simulate(p, c, bf);
  EXPECT_LT(b.step_seconds, 0.75 * a.step_seconds);
  EXPECT_DOUBLE_EQ(b.arena_bytes, a.arena_bytes / 2);
  // ZeRO-3: the f32 master and AdamW state as in f32, plus the bf16 parameter shard.
  EXPECT_DOUBLE_EQ(b.persistent_bytes, a.persistent_bytes + static_cast<double>(p.param_bytes) / 2);
  EXPECT_DOUBLE_EQ(a.peak_memory_bytes,
                   static_cast<double>(p.persistent_bytes() + p.memory.arena_bytes));
}

// FP8 GEMMs: faster than bf16 on a device with an FP8 peak, an FP8 copy of every local
// parameter element in memory, MFU against the FP8 peak; refused on a device without one and
// beside a precision other than bf16.
TEST(Simulator, Fp8GemmsRunFasterWithAnFp8CopyOfTheWeights) {
  ClusterSpec c = round_cluster();
  c.device.peak_flops_fp8 = 400e12;
  c.device.fp8_gemm_efficiency = 0.6;
  // 8 x 1024 tokens per rank: GEMMs large enough for FP8 to pay for its casts' launches.
  Program p = lowered("gpt2-small", 64, 1024, Plan::data_parallel(8, 1));
  SimOptions bf, f8;
  ASSERT_TRUE(parse_sim_precision("bf16", &bf).ok());
  ASSERT_TRUE(parse_sim_precision("fp8", &f8).ok());
  EXPECT_EQ(f8.precision, DType::bf16);
  EXPECT_STREQ(sim_precision_name(f8), "fp8");
  SimResult a = *simulate(p, c, bf), b = *simulate(p, c, f8);
  // (The casts of 768-wide activations cost about half the FP8 GEMM time at this device's
  // bandwidth: OpTime.Fp8GemmsInTheBlocksRunAtTheFp8PeakAfterACast checks the formula.)
  EXPECT_LT(b.step_seconds, a.step_seconds);
  // Every GEMM, the fused epilogues' too (parallel/fuse.h).
  auto gemm_seconds = [](const SimResult& r) {
    double s = 0;
    OpKind k;
    for (const auto& [name, sec] : r.seconds_by_op)
      if (op_from_name(name, &k) && is_gemm(k)) s += sec;
    return s;
  };
  EXPECT_GT(b.seconds_by_op.at("matmul_bias_gelu"), 0);
  EXPECT_LT(gemm_seconds(b), 0.95 * gemm_seconds(a));
  EXPECT_DOUBLE_EQ(b.persistent_bytes - a.persistent_bytes,
                   static_cast<double>(p.param_bytes) / 4);  // one byte per f32 element
  EXPECT_DOUBLE_EQ(b.arena_bytes, a.arena_bytes);
  EXPECT_NEAR(b.mfu, b.model_tflops_per_device * 1e12 / 400e12, 1e-12);
  c.device.peak_flops_fp8 = 0;
  Result<SimResult> none = simulate(p, c, f8);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no FP8 peak"), std::string::npos)
      << none.status().message();
  EXPECT_FALSE(parse_sim_precision("fp4", &f8).ok());
}

// Under mixed precision the f32 master copy is optimizer state: ZeRO-1 shards it with the
// moments (DeepSpeed's ZeRO, Megatron's distributed optimizer), and every rank keeps the
// parameters in bf16.
TEST(Simulator, MixedPrecisionZero1ShardsTheMasterCopy) {
  ClusterSpec c = round_cluster();
  Program p = lowered("gpt2-small", 8, 512, Plan::data_parallel(8, 1));
  SimOptions f32, bf;
  bf.precision = DType::bf16;
  SimResult a = *simulate(p, c, f32), b = *simulate(p, c, bf);
  const double params = static_cast<double>(p.param_bytes);  // f32, replicated
  EXPECT_DOUBLE_EQ(a.persistent_bytes, static_cast<double>(p.persistent_bytes()));
  EXPECT_DOUBLE_EQ(b.persistent_bytes, params / 2 + static_cast<double>(p.optim_bytes) / 2 +
                                           static_cast<double>(p.grad_bytes + p.optim_bytes));
  EXPECT_NEAR(static_cast<double>(p.optim_bytes) / 2, params / 8, 0.01 * params / 8);
  EXPECT_LT(b.persistent_bytes, a.persistent_bytes - 0.35 * params);  // 5 -> 3.5 bytes each
}

// The optimizer offloaded to host memory: after the backward pass the gradients go out over
// the host link one tensor after another, the host sums their squares and runs AdamW tensor
// by tensor at its share of the node's memory bandwidth, and each updated tensor comes back
// over the link beside the next tensors' AdamW (the runner's link thread): each copy starts
// when its tensor is updated and the link is free. The device holds the parameters alone; the
// host, the f32 master, the moments and the gradient's copy.
TEST(Simulator, OffloadedOptimizerRunsOnTheHostAfterTheBackward) {
  ClusterSpec c = round_cluster(1, 0);
  c.node.host_memory_bandwidth = 100e9;  // AdamW at 50 GB/s (efficiency 0.5)
  c.node.host_link_bandwidth = 25e9;     // copies at 20 GB/s (efficiency 0.8)
  Plan plan = Plan::data_parallel(1);
  const Program dev = lowered("gpt-tiny", 4, 32, plan);
  plan.offload = OffloadPolicy::optimizer;
  const Program off = lowered("gpt-tiny", 4, 32, plan);
  SimOptions o;
  o.trace = true;
  const SimResult a = *simulate(dev, c, o), b = *simulate(off, c, o);
  const double host = 50e9, link = 20e9;
  double elems = 0;
  for (const ParamLayout& pl : off.part.params)
    elems += static_cast<double>(pl.local_shape.numel());
  // Out; the norm; then tensor by tensor AdamW on the host, each one's copy back on the link as
  // soon as it is updated and the link is free (gpt-tiny's token table, updated first, is most
  // of it: its copy goes on while the others are updated).
  const double start = 4 * elems / link + 4 * elems / host;
  double host_free = start, link_free = start;
  for (const Instruction& in : off.optimizer) {
    if (in.kind != Instruction::optimizer) continue;
    const double e =
        static_cast<double>(off.part.params[static_cast<size_t>(in.param)].local_shape.numel());
    host_free += 28 * e / host;
    link_free = std::max(link_free, host_free) + 4 * e / link;
  }
  const double want = std::max(host_free, link_free);
  EXPECT_LT(want, start + 28 * elems / host + 4 * elems / link);  // less than one after another
  EXPECT_NEAR(b.offload_seconds, want, 1e-9 * want);
  EXPECT_NEAR(b.step_seconds, a.compute_seconds - a.optimizer_seconds + want, 1e-9 * want);
  EXPECT_EQ(b.optimizer_seconds, 0);  // nothing of the optimizer on the device
  EXPECT_NEAR(b.host_cpu_seconds, 32 * elems / host, 1e-9 * want);
  EXPECT_NEAR(b.host_link_seconds, 8 * elems / link, 1e-9 * want);
  EXPECT_EQ(b.exposed_comm_seconds, 0);
  EXPECT_DOUBLE_EQ(b.persistent_bytes, 4 * elems);
  EXPECT_DOUBLE_EQ(a.persistent_bytes, 12 * elems);
  EXPECT_DOUBLE_EQ(b.host_bytes, 16 * elems);
  EXPECT_NE(std::find(b.streams.begin(), b.streams.end(), "host"), b.streams.end());
  EXPECT_NE(std::find(b.streams.begin(), b.streams.end(), "host link"), b.streams.end());
  EXPECT_NE(format_sim_result(b, c).find("offload"), std::string::npos);

  // The micro-step is the same with and without offload: under ZeRO-3 the gathers are still
  // issued as the compute stream reaches them (they were all issued at once when offloaded).
  Plan z3 = Plan::data_parallel(4, 3);
  const Program dev3 = lowered("gpt-tiny", 8, 32, z3);
  z3.offload = OffloadPolicy::optimizer;
  const Program off3 = lowered("gpt-tiny", 8, 32, z3);
  ClusterSpec node = round_cluster(4, 0);
  node.node.host_memory_bandwidth = 100e9;
  node.node.host_link_bandwidth = 25e9;
  auto micro_end = [](const SimResult& r) {
    double end = 0;
    for (const TraceEvent& e : r.events)
      if ((e.category == "compute" || e.category == "comm") && e.name != "grad_norm")
        end = std::max(end, e.start + e.duration);
    return end;
  };
  const SimResult d3 = *simulate(dev3, node, o), o3 = *simulate(off3, node, o);
  EXPECT_NEAR(micro_end(o3), micro_end(d3), 1e-12);
  EXPECT_NEAR(o3.step_seconds - o3.offload_seconds, micro_end(d3), 1e-12);

  // A spec without its host side cannot time it; nor is a pipeline offloaded yet.
  Result<SimResult> unknown = simulate(off, round_cluster(1, 0), o);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().hint().find("host_link_gbs"), std::string::npos);
  Plan pp = Plan::pipeline_parallel(2, 1, 1);
  pp.offload = OffloadPolicy::optimizer;
  EXPECT_FALSE(check_sim_inputs(pp, c, o).ok());
}

TEST(Simulator, RecomputationCountsAsHardwareNotModelFlops) {
  ClusterSpec c = round_cluster();
  Plan plain = Plan::data_parallel(8, 3), rc = plain;
  rc.recompute = RecomputePolicy::full;
  SimResult a = *simulate(lowered("gpt2-small", 8, 1024, plain), c, {});
  SimResult b = *simulate(lowered("gpt2-small", 8, 1024, rc), c, {});
  EXPECT_NEAR(b.model_flops_per_step, a.model_flops_per_step, 1e-9 * a.model_flops_per_step);
  // The clones re-run each block's forward except what its backward never reads (the MLP
  // output projection): about +18% on gpt2-small.
  EXPECT_GT(b.hardware_flops_per_step, 1.12 * a.hardware_flops_per_step);
  EXPECT_GT(b.step_seconds, a.step_seconds);
  EXPECT_LT(b.arena_bytes, a.arena_bytes);
  EXPECT_GT(b.hfu, b.mfu);
}

TEST(Simulator, TraceHasBothStreamsInOrder) {
  ClusterSpec c = round_cluster();
  SimOptions o;
  o.trace = true;
  SimResult r = *simulate(lowered("gpt-tiny", 8, 32, Plan::data_parallel(4, 3)), c, o);
  nlohmann::json j = nlohmann::json::parse(chrome_trace(r, "gpt-tiny \"test\""));
  int compute = 0, comm = 0;
  double last_end = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    (e["tid"] == 0 ? compute : comm)++;
    last_end = std::max(last_end, e["ts"].get<double>() + e["dur"].get<double>());
    EXPECT_GE(e["dur"].get<double>(), 0);
  }
  EXPECT_GT(compute, 10);
  EXPECT_GT(comm, 2);
  EXPECT_NEAR(last_end, r.step_seconds * 1e6, 1e-3);
}

// Every stream runs one thing at a time, in the order the runner issues it: no two events of a
// stream overlap, no collective starts before the compute stream has reached its start
// instruction, and the step lasts at least as long as each stream is busy. HSDP over a slow
// network: the replicas' all-reduces queue far behind the backward pass, and the waits that
// the ZeRO-3 gathers need in between must not pull that queue forward.
TEST(Simulator, EachStreamRunsOneThingAtATimeInIssueOrder) {
  ClusterSpec c = round_cluster(2, 1);
  SimOptions o;
  o.trace = true;
  Result<Program> p =
      lower(build_model(*find_preset("gpt2-small"), 16, 256, ModelMode::train).graph,
            Plan::hybrid_sharded(2, 2));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  SimResult r = *simulate(*p, c, o);
  int busy_streams = 0;  // compute, the shard group's and the replicas' (and the norm's)
  for (size_t s = 0; s < r.streams.size(); ++s) {
    std::vector<const TraceEvent*> on;
    double busy = 0;
    for (const TraceEvent& e : r.events)
      if (e.stream == static_cast<int>(s)) on.push_back(&e), busy += e.duration;
    busy_streams += on.size() > 10;
    std::sort(on.begin(), on.end(),
              [](const TraceEvent* a, const TraceEvent* b) { return a->start < b->start; });
    for (size_t i = 1; i < on.size(); ++i)
      ASSERT_GE(on[i]->start, on[i - 1]->start + on[i - 1]->duration - 1e-12)
          << r.streams[s] << ": " << on[i - 1]->name << " and " << on[i]->name << " overlap";
    EXPECT_GE(r.step_seconds, busy * (1 - 1e-12)) << r.streams[s];
  }
  EXPECT_EQ(busy_streams, 3);
}

// Each rank group has its own comm stream, as the runtime has one comm thread per
// communicator: a tensor-parallel all-reduce of the backward runs while a data-parallel
// gradient bucket is still in flight, rather than queueing behind it (review R10).
TEST(Simulator, TensorAndDataAxesHaveTheirOwnCommStreams) {
  ClusterSpec c = round_cluster(2, 1);  // tp inside a node; dp over a slow network
  SimOptions o;
  o.trace = true;
  const ModelConfig cfg = *find_preset("gpt2-small");
  ModelGraph m = build_model(cfg, 8, 512, ModelMode::train);
  Plan plan = Plan::tensor_parallel(4, 2);
  ASSERT_TRUE(place_tensor_parallel(cfg, 8, 512, m.graph, SearchCost{}, &plan).ok());
  Result<Program> p = lower(m.graph, plan);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  SimResult r = *simulate(*p, c, o);
  ASSERT_EQ(r.streams.size(), 3u) << nlohmann::json(r.streams).dump();
  EXPECT_EQ(r.streams[0], "compute");
  auto id = [&](const std::string& name) {
    return static_cast<int>(std::find(r.streams.begin(), r.streams.end(), name) -
                            r.streams.begin());
  };
  const int tp = id("comm tp"), dp = id("comm dp");
  ASSERT_LT(tp, 3);
  ASSERT_LT(dp, 3);
  int overlapping = 0;
  for (const TraceEvent& a : r.events) {
    if (a.stream != tp) continue;
    for (const TraceEvent& b : r.events)
      if (b.stream == dp && a.start < b.start + b.duration && b.start < a.start + a.duration)
        ++overlapping;
  }
  EXPECT_GT(overlapping, 0);
  // The trace names every stream's thread.
  nlohmann::json j = nlohmann::json::parse(chrome_trace(r, "tp x dp"));
  int names = 0;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") ++names;
  EXPECT_EQ(names, 3);
}

// Megatron's --overlap-param-gather (SimOptions::overlap_param_gather): ZeRO-1's parameter
// all-gathers no longer hold the optimizer phase; only what one micro-batch's forward does not
// cover is added. Each gather still runs (the comm stream's busy time is the same).
TEST(Simulator, OverlappedParameterGathersCostOnlyWhatTheForwardLeaves) {
  ClusterSpec c = round_cluster(8, 1);  // a slow network: the gathers take a while
  SimOptions o;
  o.precision = DType::bf16;
  const Program p = lowered("gpt2-small", 16, 1024, Plan::data_parallel(16, 1));
  SimResult waits = *simulate(p, c, o);
  o.overlap_param_gather = true;
  SimResult hidden = *simulate(p, c, o);
  EXPECT_NEAR(hidden.comm_seconds, waits.comm_seconds, 1e-12);
  EXPECT_NEAR(hidden.compute_seconds, waits.compute_seconds, 1e-12);
  EXPECT_LT(hidden.step_seconds, waits.step_seconds);
  EXPECT_GE(hidden.step_seconds, hidden.compute_seconds);
  // On a fast network the gathers fit beside the forward: the step ends with the optimizer.
  ClusterSpec fast = round_cluster();
  SimResult quick = *simulate(p, fast, o);
  o.overlap_param_gather = false;
  SimResult quick_waits = *simulate(p, fast, o);
  EXPECT_LT(quick.step_seconds, quick_waits.step_seconds);
  // ZeRO-3 has no optimizer-phase gathers: nothing changes.
  const Program z3 = lowered("gpt2-small", 16, 1024, Plan::data_parallel(16, 3));
  SimResult a = *simulate(z3, c, o);
  o.overlap_param_gather = true;
  EXPECT_NEAR(simulate(z3, c, o)->step_seconds, a.step_seconds, 1e-12);
}

// Megatron's --tp-comm-overlap (SimOptions::tp_comm_overlap): a tensor-parallel collective
// chunked against the GEMM beside it costs the step only what that GEMM does not cover. The
// same collectives run (comm busy time unchanged), the step is shorter, and never shorter than
// its compute.
TEST(Simulator, TensorParallelCollectivesOverlappedWithTheirGemms) {
  ClusterSpec c = round_cluster();
  SimOptions o;
  o.precision = DType::bf16;
  const ModelConfig cfg = *find_preset("gpt2-small");
  ModelGraph m = build_model(cfg, 8, 1024, ModelMode::train);
  Plan plan = Plan::tensor_parallel(1, 4);
  plan.sequence_parallel = true;
  ASSERT_TRUE(place_tensor_parallel(cfg, 8, 1024, m.graph, SearchCost{}, &plan).ok());
  Result<Program> p = lower(m.graph, plan);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  SimResult serial = *simulate(*p, c, o);
  o.tp_comm_overlap = true;
  SimResult overlapped = *simulate(*p, c, o);
  EXPECT_NEAR(overlapped.comm_seconds, serial.comm_seconds, 1e-12);
  EXPECT_NEAR(overlapped.compute_seconds, serial.compute_seconds, 1e-12);
  EXPECT_LT(overlapped.step_seconds, serial.step_seconds - 0.25 * serial.exposed_comm_seconds);
  EXPECT_GE(overlapped.step_seconds, overlapped.compute_seconds);
  std::printf("tp 4 with sp: %.2f ms a step, exposed comm %.2f ms; overlapped: %.2f ms, %.2f ms\n",
              1e3 * serial.step_seconds, 1e3 * serial.exposed_comm_seconds,
              1e3 * overlapped.step_seconds, 1e3 * overlapped.exposed_comm_seconds);
}

TEST(Simulator, MoreRanksThanANodeWithoutANetworkIsAnError) {
  ClusterSpec c = round_cluster(2);
  c.network.nics = 0;
  Result<SimResult> r = simulate(lowered("gpt-tiny", 4, 32, Plan::data_parallel(4)), c, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("one node of 2 devices with no network"), std::string::npos)
      << r.status().to_string();
  EXPECT_TRUE(simulate(lowered("gpt-tiny", 2, 32, Plan::data_parallel(2)), c, {}).ok());
}

TEST(Simulator, Gpt3OnAThousandDevicesInUnderASecond) {
  ClusterSpec c = round_cluster();
  auto t0 = std::chrono::steady_clock::now();
  ModelGraph m = build_model(*find_preset("gpt3-175b"), 1024, 2048, ModelMode::train);
  Result<Program> p = lower(m.graph, Plan::data_parallel(1024, 3));
  ASSERT_TRUE(p.ok()) << p.status().message();
  SimOptions o;
  o.precision = DType::bf16;
  Result<SimResult> r = simulate(*p, c, o);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.ok());
  // 0.25 s on a quiet machine; the bound catches a blow-up with size, not load (the speed itself
  // is printed by `tessera simulate`).
  EXPECT_LT(secs, 20.0);
  EXPECT_GT(r->step_seconds, 1.0);
  EXPECT_EQ(r->devices, 1024);
}

// Context parallelism on 8 H100s (llama3-8b, one sequence of 8,192 tokens): each rank holds a
// chunk of the sequence, so the activations per GPU fall with cp; the step still counts every
// token and the model's FLOPs once (MFU as every other run reports it); the last chunk's
// causal attention, which reads every key before it, is what the step waits for.
TEST(Simulator, ContextParallelSplitsActivationsAndCountsEachTokenOnce) {
  const ClusterSpec c = *load_cluster("dgx-h100");
  SimOptions o;
  o.precision = DType::bf16;
  std::vector<SimResult> r;
  for (int cp : {1, 2, 4}) {
    Plan plan = Plan::tensor_parallel(1, 8 / cp);
    ASSERT_TRUE(add_context_axis(&plan, cp).ok());
    ModelConfig cfg = *find_preset("llama3-8b");
    cfg.n_layer = 2;
    Result<SimResult> s = simulate(lowered_config(cfg, 1, 8192, plan), c, o);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    r.push_back(*s);
  }
  for (size_t i = 1; i < r.size(); ++i) {
    EXPECT_EQ(r[i].tokens_per_step, 8192) << i;
    EXPECT_NEAR(r[i].model_flops_per_step, r[0].model_flops_per_step,
                1e-9 * r[0].model_flops_per_step)
        << i;
    EXPECT_LT(r[i].arena_bytes, r[i - 1].arena_bytes) << i;
  }
  EXPECT_EQ(r[0].tokens_per_step, 8192);
  // The zigzag order gives each of 4 ranks the same causal work: the step no longer waits for
  // the last chunk's 7/8 of the score rectangle, only for half of it.
  Plan zz = Plan::tensor_parallel(1, 2);
  ASSERT_TRUE(add_context_axis(&zz, 4).ok());
  zz.context_order = ContextOrder::zigzag;
  ModelConfig cfg = *find_preset("llama3-8b");
  cfg.n_layer = 2;
  Result<SimResult> z = simulate(lowered_config(cfg, 1, 8192, zz), c, o);
  ASSERT_TRUE(z.ok()) << z.status().to_string();
  EXPECT_LT(z->compute_seconds, r[2].compute_seconds);
  EXPECT_EQ(z->tokens_per_step, 8192);
  // Ring attention: the same tokens, FLOPs and causal work, the shifts on the cp group's
  // point-to-point stream; no gathers of keys and values.
  zz.context_attention = ContextAttention::ring;
  Result<SimResult> ring = simulate(lowered_config(cfg, 1, 8192, zz), c, o);
  ASSERT_TRUE(ring.ok()) << ring.status().to_string();
  EXPECT_EQ(ring->tokens_per_step, 8192);
  EXPECT_NEAR(ring->model_flops_per_step, z->model_flops_per_step, 1e-9 * z->model_flops_per_step);
  EXPECT_GT(ring->seconds_by_op.at("ring_shift"), 0);
  EXPECT_EQ(ring->seconds_by_op.count("all_gather"), 0u);
  EXPECT_NE(std::find(ring->streams.begin(), ring->streams.end(), "p2p cp"), ring->streams.end());
  EXPECT_NEAR(ring->seconds_by_op.at("attention"), z->seconds_by_op.at("attention"),
              0.05 * z->seconds_by_op.at("attention"));
}

}  // namespace
}  // namespace tessera
