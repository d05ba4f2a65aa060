// The CUDA backend's matmul (cuBLASLt, f32 accumulation) on the GEMMs of a GPT-2 124M training
// step at B*T = 16384 tokens, in the three layouts a linear layer runs (forward y = x W^T,
// input gradient dx = dy W, weight gradient dW = dy^T x), and an 8192^3 square: TFLOP/s per
// GEMM, median of --reps timed runs of 10 calls each, on random data. Each call includes what
// the backend does on the host per call today (cuBLASLt descriptors and heuristic), which
// shows on the smallest shapes. bench/run_cuda_matmul.sh runs PyTorch on the same GEMMs and
// prints the ratio.
//
//   tessera_cuda_matmul_bench [--reps 20] [--dtype bf16|f32]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "ir/builder.h"

using namespace tessera;

namespace {

struct Gemm {
  const char* name;
  int64_t ar, ac, br, bc;  // A [ar, ac], B [br, bc] as stored
  bool ta, tb;
};

// GPT-2 124M: C = 768, 4C = 3072, 3C = 2304, vocabulary 50304 (padded), 16384 tokens.
constexpr int64_t kT = 16384;
const Gemm kGemms[] = {
    {"qkv", kT, 768, 2304, 768, false, true},
    {"qkv_dx", kT, 2304, 2304, 768, false, false},
    {"qkv_dw", kT, 2304, kT, 768, true, false},
    {"fc", kT, 768, 3072, 768, false, true},
    {"fc_dx", kT, 3072, 3072, 768, false, false},
    {"fc_dw", kT, 3072, kT, 768, true, false},
    {"proj", kT, 3072, 768, 3072, false, true},
    {"attn_out", kT, 768, 768, 768, false, true},
    {"lm_head", kT, 768, 50304, 768, false, true},
    {"lm_head_dw", kT, 50304, kT, 768, true, false},
    {"square", 8192, 8192, 8192, 8192, false, false},
};

double time_one(CudaBackend& gpu, const Gemm& s, DType dt, int reps, std::mt19937& rng) {
  Graph g;
  Builder b(&g);
  Var x = b.parameter("a", Shape{s.ar, s.ac}, Init::zeros, 0.0, dt);
  Var w = b.parameter("b", Shape{s.br, s.bc}, Init::zeros, 0.0, dt);
  Var y = b.matmul(x, w, s.ta, s.tb);
  const Node& node = g.producer(y.id);
  std::vector<void*> bufs;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (Var v : {x, w, y}) {
    const TensorType& t = g.type(v.id);
    std::vector<float> f(static_cast<size_t>(t.shape.numel()));
    for (float& e : f) e = u(rng);
    std::vector<char> stored(static_cast<size_t>(t.bytes()));
    convert_elements(f.data(), DType::f32, stored.data(), dt, t.shape.numel());
    bufs.push_back(gpu.alloc(t.bytes()));
    gpu.to_device(bufs.back(), stored.data(), t.bytes());
  }
  const void* in[] = {bufs[0], bufs[1]};
  void* out[] = {bufs[2]};
  for (int i = 0; i < 3; ++i) gpu.run(g, node, in, out);
  gpu.synchronize();
  std::vector<double> secs;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) gpu.run(g, node, in, out);
    gpu.synchronize();
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                   10);
  }
  for (void* p : bufs) gpu.free(p);
  std::sort(secs.begin(), secs.end());
  const Shape& c = g.type(y.id).shape;
  const int64_t k = s.ta ? s.ar : s.ac;
  return 2.0 * static_cast<double>(c.numel()) * static_cast<double>(k) / secs[secs.size() / 2] /
         1e12;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  DType dt = DType::bf16;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--dtype") == 0)
      dt = std::strcmp(argv[i + 1], "f32") == 0 ? DType::f32 : DType::bf16;
  }
  std::string why;
  if (!cuda_device_present(&why)) {
    std::fprintf(stderr, "error: no usable CUDA device (%s)\n", why.c_str());
    return 1;
  }
  CudaBackend gpu;
  std::mt19937 rng(1);
  std::printf("device: %s, dtype %s\n", gpu.device_name().c_str(), dtype_name(dt));
  for (const Gemm& s : kGemms)
    std::printf("gemm=%s tflops=%.1f\n", s.name, time_one(gpu, s, dt, reps, rng));
  return 0;
}
