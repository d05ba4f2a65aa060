# PyTorch's matmul on the GEMMs of bench/cuda_matmul_bench.cc (same shapes and layouts, random
# data, 10 products per timed run, median of --reps), for bench/run_cuda_matmul.sh.
import argparse
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--reps", type=int, default=20)
p.add_argument("--dtype", default="bf16")
a = p.parse_args()
dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
torch.backends.cuda.matmul.allow_tf32 = False
T = 16384
# name, A [ar, ac], B [br, bc], transpose A, transpose B (as in the C++ bench)
gemms = [("qkv", T, 768, 2304, 768, False, True), ("qkv_dx", T, 2304, 2304, 768, False, False),
         ("qkv_dw", T, 2304, T, 768, True, False), ("fc", T, 768, 3072, 768, False, True),
         ("fc_dx", T, 3072, 3072, 768, False, False), ("fc_dw", T, 3072, T, 768, True, False),
         ("proj", T, 3072, 768, 3072, False, True), ("attn_out", T, 768, 768, 768, False, True),
         ("lm_head", T, 768, 50304, 768, False, True),
         ("lm_head_dw", T, 50304, T, 768, True, False),
         ("square", 8192, 8192, 8192, 8192, False, False)]
print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, dtype {a.dtype}")
for name, ar, ac, br, bc, ta, tb in gemms:
    x = torch.rand(ar, ac, device="cuda", dtype=dt) * 2 - 1
    w = torch.rand(br, bc, device="cuda", dtype=dt) * 2 - 1
    xa = x.t() if ta else x
    wb = w.t() if tb else w
    for _ in range(3):
        y = xa @ wb
    torch.cuda.synchronize()
    secs = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        for _ in range(10):
            y = xa @ wb
        torch.cuda.synchronize()
        secs.append((time.perf_counter() - t0) / 10)
    secs.sort()
    flops = 2 * y.numel() * xa.shape[1]
    print(f"gemm={name} tflops={flops / secs[len(secs) // 2] / 1e12:.1f}")
