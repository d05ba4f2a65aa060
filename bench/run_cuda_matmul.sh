#!/usr/bin/env bash
# The CUDA backend's GEMMs against PyTorch's on the same GPU, in one run: TFLOP/s of each and
# the ratio Tessera / PyTorch per shape. Needs a CUDA device, the binary built with
# -DTESSERA_CUDA=ON (BIN=path/to/tessera_cuda_matmul_bench) and python3 with CUDA PyTorch.
#
#   BIN=build-cuda/bench/tessera_cuda_matmul_bench bash bench/run_cuda_matmul.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build-cuda/bench/tessera_cuda_matmul_bench}
REPS=${REPS:-20}
for dt in bf16 f32; do
  t=$("$BIN" --reps "$REPS" --dtype "$dt")
  p=$(python3 bench/pytorch_matmul.py --reps "$REPS" --dtype "$dt")
  echo "$t"
  echo "$p"
  paste <(grep '^gemm=' <<<"$t") <(grep '^gemm=' <<<"$p") | awk '{
    split($1, a, "="); split($2, t, "="); split($4, p, "=");
    printf "%s %s: tessera %.1f TFLOP/s, pytorch %.1f TFLOP/s, ratio %.2f\n", "'"$dt"'", a[2], t[2], p[2], t[2] / p[2] }'
done
