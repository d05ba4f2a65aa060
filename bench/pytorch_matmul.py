# PyTorch's torch.matmul on the GEMMs of bench/cuda_matmul_bench.cc (same shapes, same
# timing: 10 products per timed run, median of --reps), for bench/run_cuda_matmul.sh.
import argparse
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--reps", type=int, default=20)
p.add_argument("--dtype", default="bf16")
a = p.parse_args()
dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
torch.backends.cuda.matmul.allow_tf32 = False
shapes = [("qkv", 16384, 2304, 768), ("attn_out", 16384, 768, 768), ("fc", 16384, 3072, 768),
          ("fc_proj", 16384, 768, 3072), ("lm_head", 16384, 50304, 768),
          ("square", 8192, 8192, 8192)]
print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, dtype {a.dtype}")
for name, m, n, k in shapes:
    x = torch.ones(m, k, device="cuda", dtype=dt)
    w = torch.ones(n, k, device="cuda", dtype=dt)
    for _ in range(3):
        y = x @ w.t()
    torch.cuda.synchronize()
    secs = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        for _ in range(10):
            y = x @ w.t()
        torch.cuda.synchronize()
        secs.append((time.perf_counter() - t0) / 10)
    secs.sort()
    print(f"gemm={name} m={m} n={n} k={k} tflops={2 * m * n * k / secs[len(secs) // 2] / 1e12:.1f}")
