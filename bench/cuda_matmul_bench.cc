// The CUDA backend's matmul (cuBLASLt, bf16 storage, f32 accumulation) on the GEMMs of a
// GPT-2 124M training step at B*T = 16384 tokens, and an 8192^3 square: TFLOP/s per shape,
// median of --reps timed runs. bench/run_cuda_matmul.sh runs PyTorch on the same shapes and
// prints the ratio.
//
//   tessera_cuda_matmul_bench [--reps 20] [--dtype bf16|f32]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "ir/builder.h"

using namespace tessera;

namespace {

struct Gemm {
  const char* name;
  int64_t m, n, k;  // y[m, n] = x[m, k] w[n, k]^T
};

double time_one(CudaBackend& gpu, const Gemm& s, DType dt, int reps) {
  Graph g;
  Builder b(&g);
  Var x = b.parameter("x", Shape{s.m, s.k}, Init::zeros, 0.0, dt);
  Var w = b.parameter("w", Shape{s.n, s.k}, Init::zeros, 0.0, dt);
  Var y = b.matmul(x, w, false, true);
  const Node& node = g.producer(y.id);
  std::vector<void*> bufs;
  for (Var v : {x, w, y}) {
    const int64_t bytes = g.type(v.id).bytes();
    bufs.push_back(gpu.alloc(bytes));
    std::vector<uint16_t> ones(static_cast<size_t>(bytes / 2), 0x3c00);  // small nonzero values
    gpu.to_device(bufs.back(), ones.data(), bytes);
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
  return 2.0 * s.m * s.n * s.k / secs[secs.size() / 2] / 1e12;
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
    std::fprintf(stderr, "error: no CUDA device (%s)\n", why.c_str());
    return 1;
  }
  CudaBackend gpu;
  std::printf("device: %s, dtype %s\n", gpu.device_name().c_str(), dtype_name(dt));
  const Gemm shapes[] = {{"qkv", 16384, 2304, 768},      {"attn_out", 16384, 768, 768},
                         {"fc", 16384, 3072, 768},       {"fc_proj", 16384, 768, 3072},
                         {"lm_head", 16384, 50304, 768}, {"square", 8192, 8192, 8192}};
  for (const Gemm& s : shapes)
    std::printf("gemm=%s m=%lld n=%lld k=%lld tflops=%.1f\n", s.name, static_cast<long long>(s.m),
                static_cast<long long>(s.n), static_cast<long long>(s.k),
                time_one(gpu, s, dt, reps));
  return 0;
}
