// The GPU trainer against the CPU step runner, and bf16 mixed precision against f32 (label
// gpu: skipped, and reported as skipped, where no CUDA device is present).
#include "runtime/cuda_trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "models/model.h"
#include "runtime/step_runner.h"

namespace tessera {
namespace {

#define REQUIRE_DEVICE()                                 \
  do {                                                   \
    std::string why;                                     \
    if (!cuda_device_present(&why)) GTEST_SKIP() << why; \
  } while (0)

constexpr int64_t kBatch = 2, kSeq = 32;
constexpr double kLr = 1e-3;

ModelConfig tiny(DType dtype) {
  ModelConfig c = *find_preset("gpt-tiny");
  c.dtype = dtype;
  return c;
}

std::vector<int32_t> tokens(int32_t vocab, int salt) {
  std::vector<int32_t> t(kBatch * kSeq);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>((i * 7 + salt * 13) % vocab);
  return t;
}

struct Losses {
  std::vector<float> losses;
  std::vector<double> norms;
};

// Trains c for `steps` steps at kLr (with varying_lr, a rate that changes every step), steps
// replayed as a CUDA graph from the third on unless graph is false.
Losses train_on_gpu(const ModelConfig& c, int steps, int64_t* arena = nullptr, bool graph = true,
                    bool varying_lr = false, std::vector<float>* first_param = nullptr) {
  ModelGraph m = build_model(c, kBatch, kSeq, ModelMode::train);
  CudaBackend gpu;
  CudaTrainer t(m.graph, gpu, {.adamw = {.lr = kLr}, .max_grad_norm = 1.0, .cuda_graph = graph});
  t.init_params(7);
  if (arena != nullptr) *arena = t.plan().arena_bytes;
  Losses r;
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> x = tokens(static_cast<int32_t>(c.vocab_size), s % 2),
                         y = tokens(static_cast<int32_t>(c.vocab_size), s % 2 + 1);
    t.set_input("tokens", x.data());
    t.set_input("targets", y.data());
    r.losses.push_back(t.step(varying_lr ? kLr * (1 + s % 3) : kLr));
    r.norms.push_back(t.last_grad_norm());
  }
  if (first_param != nullptr) *first_param = t.master(0);
  return r;
}

TEST(CudaTrainer, MatchesTheCpuStepRunner) {
  REQUIRE_DEVICE();
  const ModelConfig c = tiny(DType::f32);
  ModelGraph m = build_model(c, kBatch, kSeq, ModelMode::train);
  CpuBackend cpu;
  const Plan plan = Plan::data_parallel(1);
  Result<MeshComms> comms = MeshComms::single(plan);
  ASSERT_TRUE(comms.ok());
  auto made = StepRunner::create(m.graph, plan, cpu, comms.value(), AdamWConfig{.lr = kLr});
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  StepRunner& step = **made;
  step.init_params(7);
  const Losses gpu = train_on_gpu(c, 4);
  for (int s = 0; s < 4; ++s) {
    std::vector<int32_t> x = tokens(static_cast<int32_t>(c.vocab_size), s % 2),
                         y = tokens(static_cast<int32_t>(c.vocab_size), s % 2 + 1);
    Result<float> loss = step.forward_backward(Feed(m, {x.data(), y.data()}));
    ASSERT_TRUE(loss.ok()) << loss.status().to_string();
    Result<double> norm = step.apply(kLr, 1.0);
    ASSERT_TRUE(norm.ok()) << norm.status().to_string();
    std::printf("step %d: loss cpu %.6f gpu %.6f, norm cpu %.6f gpu %.6f\n", s, *loss,
                gpu.losses[s], *norm, gpu.norms[s]);
    EXPECT_NEAR(gpu.losses[s], *loss, 1e-4 * std::fabs(*loss)) << "step " << s;
    EXPECT_NEAR(gpu.norms[s], *norm, 1e-3 * *norm) << "step " << s;
  }
}

// bf16 storage of parameters, activations and gradients with f32 master weights: the losses
// follow f32's within bf16's rounding, training still lowers the loss, and the planned arena
// holds about half the bytes.
TEST(CudaTrainer, Bf16MixedPrecisionFollowsF32) {
  REQUIRE_DEVICE();
  int64_t arena32 = 0, arena16 = 0;
  const Losses f32 = train_on_gpu(tiny(DType::f32), 12, &arena32);
  const Losses bf16 = train_on_gpu(tiny(DType::bf16), 12, &arena16);
  for (size_t s = 0; s < f32.losses.size(); ++s) {
    std::printf("step %zu: loss f32 %.5f bf16 %.5f\n", s, f32.losses[s], bf16.losses[s]);
    EXPECT_NEAR(bf16.losses[s], f32.losses[s], 0.02 * f32.losses[s]) << "step " << s;
  }
  EXPECT_LT(bf16.losses.back(), bf16.losses.front() - 0.1);
  std::printf("arena: f32 %lld bytes, bf16 %lld bytes\n", static_cast<long long>(arena32),
              static_cast<long long>(arena16));
  EXPECT_LT(arena16, 0.6 * static_cast<double>(arena32));
}

// A step replayed from a captured CUDA graph is the eager step: the same kernels on the same
// addresses, with each step's learning rate read from device memory. Losses, gradient norms
// and parameters agree bit for bit over steps whose rate changes.
TEST(CudaTrainer, GraphReplayIsTheEagerStep) {
  REQUIRE_DEVICE();
  for (DType dt : {DType::f32, DType::bf16}) {
    std::vector<float> p_graph, p_eager;
    const Losses graph = train_on_gpu(tiny(dt), 7, nullptr, true, true, &p_graph);
    const Losses eager = train_on_gpu(tiny(dt), 7, nullptr, false, true, &p_eager);
    for (size_t s = 0; s < graph.losses.size(); ++s) {
      EXPECT_EQ(graph.losses[s], eager.losses[s]) << dtype_name(dt) << " step " << s;
      EXPECT_EQ(graph.norms[s], eager.norms[s]) << dtype_name(dt) << " step " << s;
    }
    EXPECT_EQ(p_graph, p_eager) << dtype_name(dt);
    EXPECT_LT(graph.losses.back(), graph.losses.front()) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace tessera
