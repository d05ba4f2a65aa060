#!/usr/bin/env bash
# The GPU checks in one run, for a machine with an NVIDIA GPU (sm_80+) and CUDA PyTorch:
# the CUDA backend's tests (label gpu), its GEMMs against PyTorch's, and GPT-2 124M training
# speed (Tessera's CUDA trainer where built, PyTorch eager and torch.compile, fp32 and bf16).
# Binaries come from a build with -DTESSERA_CUDA=ON; BIN_DIR holds them (default build/), and
# LIBS, if set, a tar.xz of the shared libraries they need that the machine lacks (OpenBLAS).
# Logs go to $OUT (default /tmp/gpu_check). SKIP names parts to leave out (a list of
# tests, matmul, tessera, torch), PRECISIONS the Tessera runs (default "fp32 bf16").
#
#   BIN_DIR=build bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
BIN_DIR=${BIN_DIR:-build}
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
if [[ -n "${LIBS:-}" ]]; then
  mkdir -p /tmp/tessera_libs && tar -xJf "$LIBS" -C /tmp/tessera_libs
  export LD_LIBRARY_PATH=/tmp/tessera_libs:${LD_LIBRARY_PATH:-}
fi
if ! ldconfig -p | grep -q libcublasLt.so.13; then  # pip's nvidia-cublas, or the toolkit's
  lt=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
  [[ -n "$lt" ]] && export LD_LIBRARY_PATH=$(dirname "$lt"):${LD_LIBRARY_PATH:-}
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
step() { echo "== $*"; }
SKIP=" ${SKIP:-} "
skipped() { [[ "$SKIP" == *" $1 "* ]]; }

skipped tests ||
for t in backend_cuda_test runtime_cuda_test; do  # the tests of label gpu
  step "$t"
  timeout 300 "$BIN_DIR/$t" 2>&1 | tee -a "$OUT/gpu_test.log" | tail -40
done

if [[ -x "$BIN_DIR/tessera_cuda_matmul_bench" ]] && ! skipped matmul; then
  step "GEMMs: Tessera (cuBLASLt) / PyTorch"
  BIN=$BIN_DIR/tessera_cuda_matmul_bench REPS=10 timeout 180 bash bench/run_cuda_matmul.sh \
    >"$OUT/matmul.log" 2>&1
  grep -E "ratio|rror" "$OUT/matmul.log"
fi

B=${B:-8}
T=${T:-1024}
STEPS=${STEPS:-10}
if [[ -x "$BIN_DIR/tessera_cuda_train_bench" ]] && ! skipped tessera; then
  for p in ${PRECISIONS:-fp32 bf16}; do
    step "GPT-2 124M training, Tessera CUDA, $p, B=$B T=$T (CUDA graph; profile of an eager step)"
    timeout 180 "$BIN_DIR/tessera_cuda_train_bench" --batch "$B" --seq "$T" --steps "$STEPS" \
      --precision "$p" --profile 1 2>&1 | tee -a "$OUT/train.log" | grep -v OpenBLAS | head -20
    step "GPT-2 124M training, Tessera CUDA, $p, B=$B T=$T, eager (no CUDA graph)"
    timeout 180 "$BIN_DIR/tessera_cuda_train_bench" --batch "$B" --seq "$T" --steps "$STEPS" \
      --precision "$p" --graph 0 2>&1 | tee -a "$OUT/train.log" | grep "^tessera"
  done
fi
if ! skipped torch; then
  for cfg in "fp32" "bf16" "bf16 --compile"; do
    step "GPT-2 124M training, PyTorch $cfg, B=$B T=$T"
    set -- $cfg
    timeout 240 python3 bench/pytorch_gpt2.py --device cuda --precision "$@" --batch "$B" \
      --seq "$T" --steps "$STEPS" --warmup 3 2>&1 | tee -a "$OUT/train.log" | tail -3
  done
fi
