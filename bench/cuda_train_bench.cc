// GPT-2 124M training speed on one GPU through Tessera's step runner on the CUDA backend (what
// `tessera train --device cuda` runs: the training graph node by node, one device arena from
// the static memory plan, the micro-step replayed as a CUDA graph unless --graph 0, gradient
// norm, clipping and AdamW as multi-tensor device passes). Random tokens, --warmup steps
// untimed, then the median of --steps timed steps; each step reads the loss and the gradient
// norm, so its wall time is device time. bench/pytorch_gpt2.py --device cuda is the anchor
// (scripts/gpu_check.sh runs both in one call and prints them together).
//
//   tessera_cuda_train_bench [--batch 8] [--seq 1024] [--steps 10] [--warmup 3]
//                            [--precision fp32|bf16] [--peak-tflops 989] [--profile 1]
//                            [--graph 1] [--vocab-rows 50304] [--fuse 1]
//
// --fuse 0 runs the GEMM epilogues (bias, GELU and their gradients) as ops of their own
// (Plan::fuse, parallel/fuse.h). --vocab-rows pads the token table and LM head to that many rows
// (ModelConfig:: padded_vocab_size; the loss is over the 50,257 classes), 50304 by default as llm.c
// does: 50,257-element rows are not 16-byte aligned and cuBLASLt's GEMMs on them run 4-6x slower.
//
// Prints `tessera B=.. T=.. precision=.. vocab_rows=.. cuda_graph=.. s_per_step=.. tokens_per_s=..
// mfu=..`: MFU is the graph's FLOPs per step (Graph::total_flops: matmuls, attention with its
// causal half, the rest) over the step time and --peak-tflops (dense bf16 of an H100/H200 SXM by
// default). --profile 1 then runs one eager step with each node timed on the device (the
// backend's WorkTimer: CUDA events) and prints the time per op and per node kind.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "models/model.h"
#include "runtime/feed.h"
#include "runtime/step_runner.h"

using namespace tessera;

namespace {

// The micro-step's device time per op and per node kind (op and operand types; a matmul's
// transposes): the nodes that run one kernel.
void print_profile(StepRunner& step, const std::vector<double>& seconds) {
  const Graph& g = step.executor().graph();
  const std::vector<Instruction>& list = step.program().micro_step;
  std::map<std::string, std::pair<double, int64_t>> ops, kinds;
  double total = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].kind != Instruction::compute) continue;
    const Node& n = g.node(list[i].node);
    std::string kind = op_name(n.op);
    if (n.op == OpKind::matmul)
      kind += std::string(n.attr<MatmulAttrs>().transpose_a ? " Ta" : "") +
              (n.attr<MatmulAttrs>().transpose_b ? " Tb" : "");
    for (ValueId v : n.inputs) kind += " " + g.type(v).to_string();
    for (auto* table : {&ops, &kinds}) {
      auto& [sec, count] = (*table)[table == &ops ? std::string(op_name(n.op)) : kind];
      sec += seconds[i];
      ++count;
    }
    total += seconds[i];
  }
  auto sorted = [](const std::map<std::string, std::pair<double, int64_t>>& t) {
    std::vector<std::pair<std::string, std::pair<double, int64_t>>> v(t.begin(), t.end());
    std::sort(v.begin(), v.end(),
              [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    return v;
  };
  std::printf("profile of one eager micro-step (device time between the nodes' events, %.2f ms):\n",
              1e3 * total);
  std::printf("%-26s %8s %10s %6s\n", "op", "nodes", "ms", "share");
  for (const auto& [name, t] : sorted(ops))
    std::printf("%-26s %8lld %10.2f %5.1f%%\n", name.c_str(), static_cast<long long>(t.second),
                1e3 * t.first, 100.0 * t.first / std::max(total, 1e-30));
  std::printf("largest node kinds (op, operand types):\n");
  const auto k = sorted(kinds);
  for (size_t i = 0; i < std::min<size_t>(k.size(), 16); ++i)
    std::printf("  %8.2f ms %5lld x %8.1f us  %s\n", 1e3 * k[i].second.first,
                static_cast<long long>(k[i].second.second),
                1e6 * k[i].second.first / static_cast<double>(k[i].second.second),
                k[i].first.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 8, seq = 1024;
  int steps = 10, warmup = 3;
  std::string precision = "fp32";
  double peak_tflops = 989;
  bool profile = false, graph = true, fuse = true;
  int64_t vocab_rows = 50304;
  if (argc % 2 == 0) {
    std::fprintf(stderr, "error: option %s has no value\n", argv[argc - 1]);
    return 2;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    try {
      if (k == "--batch")
        batch = std::stoll(v);
      else if (k == "--seq")
        seq = std::stoll(v);
      else if (k == "--steps")
        steps = std::max(1, std::stoi(v));
      else if (k == "--warmup")
        warmup = std::max(0, std::stoi(v));
      else if (k == "--precision")
        precision = v;
      else if (k == "--profile" || k == "--graph" || k == "--fuse") {
        if (v != "0" && v != "1") {
          std::fprintf(stderr, "error: %s takes 0 or 1, got '%s'\n", k.c_str(), v.c_str());
          return 2;
        }
        (k == "--profile" ? profile : k == "--graph" ? graph : fuse) = v == "1";
      } else if (k == "--vocab-rows")
        vocab_rows = std::stoll(v);
      else if (k == "--peak-tflops")
        peak_tflops = std::stod(v);
      else {
        std::fprintf(stderr, "error: unknown option %s\n", k.c_str());
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "error: %s takes a number, got '%s'\n", k.c_str(), v.c_str());
      return 2;
    }
  }
  if (batch <= 0 || seq <= 0 || seq > 1024) {
    std::fprintf(stderr,
                 "error: --batch must be positive and --seq in 1..1024 (GPT-2's "
                 "context)\n");
    return 2;
  }
  if (precision != "fp32" && precision != "bf16") {
    std::fprintf(stderr, "error: --precision must be fp32 or bf16, got '%s'\n", precision.c_str());
    return 2;
  }
  ModelConfig c = *find_preset("gpt2-small");
  c.dtype = precision == "bf16" ? DType::bf16 : DType::f32;
  if (vocab_rows < c.vocab_size) {
    std::fprintf(stderr, "error: --vocab-rows must be at least the vocabulary, %lld\n",
                 static_cast<long long>(c.vocab_size));
    return 2;
  }
  c.padded_vocab_size = vocab_rows;
  std::string why;
  if (!cuda_device_present(&why)) {
    std::fprintf(stderr, "error: no usable CUDA device (%s)\n", why.c_str());
    return 1;
  }
  ModelGraph m = build_model(c, batch, seq, ModelMode::train);
  CudaBackend gpu;
  Plan plan = Plan::data_parallel(1);
  plan.fuse = fuse;
  MeshComms comms = MeshComms::single(plan).value();
  auto made = StepRunner::create(m.graph, plan, gpu, comms, AdamWConfig{.lr = 6e-4});
  if (!made.ok()) {
    std::fprintf(stderr, "error: %s\n", made.status().to_string().c_str());
    return 1;
  }
  StepRunner& step = **made;
  step.set_record_steps(graph);
  step.init_params(1);
  std::printf("device: %s; %zu nodes; arena %.2f GiB, persistent %.2f GiB\n",
              gpu.device_name().c_str(), m.graph.nodes().size(),
              static_cast<double>(step.executor().plan().arena_bytes) / (1 << 30),
              static_cast<double>(step.state_bytes_allocated()) / (1 << 30));
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(c.vocab_size) - 1);
  std::vector<int32_t> x(static_cast<size_t>(batch * seq)), y(x.size());
  std::vector<double> times;
  float loss = 0;
  auto train_step = [&] {
    for (size_t i = 0; i < x.size(); ++i) x[i] = id(rng), y[i] = id(rng);
    loss = step.forward_backward(token_feed(x.data(), y.data())).value();
    step.apply(6e-4, 1.0).value();
  };
  for (int s = 0; s < warmup + steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    train_step();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= warmup) times.push_back(dt);
  }
  std::sort(times.begin(), times.end());
  const double sec = times[times.size() / 2];
  const double flops = m.graph.total_flops();
  std::printf(
      "tessera B=%lld T=%lld precision=%s vocab_rows=%lld cuda_graph=%d fuse=%d steps=%d "
      "s_per_step=%.4f tokens_per_s=%.2f mfu=%.3f loss=%.4f (graph %.3g FLOP/step)\n",
      static_cast<long long>(batch), static_cast<long long>(seq), precision.c_str(),
      static_cast<long long>(vocab_rows), static_cast<int>(graph), static_cast<int>(fuse), steps,
      sec, static_cast<double>(batch * seq) / sec, flops / sec / (peak_tflops * 1e12), loss, flops);
  if (profile) {  // one more step, eager, each node timed on the device
    std::vector<double> seconds;
    step.time_instructions(&seconds);
    train_step();
    step.time_instructions(nullptr);
    print_profile(step, seconds);
  }
  return 0;
}
