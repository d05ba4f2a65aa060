#!/usr/bin/env bash
# The GPU checks in one run, for a machine with an NVIDIA GPU (sm_80+) and CUDA PyTorch:
# the CUDA backend's tests (label gpu), its GEMMs against PyTorch's, and GPT-2 124M training
# speed (Tessera's step runner on the CUDA backend: the bench and, where the CLI is in BIN_DIR,
# `tessera train --device cuda`; PyTorch eager and torch.compile; fp32 and bf16).
# Binaries come from a build with -DTESSERA_CUDA=ON; BIN_DIR holds them, side by side or where
# the build puts them (default build/), and
# LIBS, if set, tar.xz files (space-separated) of the shared libraries they need that the
# machine lacks (OpenBLAS; OpenMPI and toml++ for the CLI).
# Logs go to $OUT (default /tmp/gpu_check). SKIP names parts to leave out (a list of
# tests, matmul, tessera, train, torch, unpadded, offload), PRECISIONS the Tessera runs (default "fp32 bf16"),
# VOCAB_ROWS the token-table rows of both trainers (default 50304).
#
#   BIN_DIR=build bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
BIN_DIR=${BIN_DIR:-build}
bin() {  # a binary in BIN_DIR, or in the build tree's folder for it
  for d in "" bench/ src/cli/ tests/backend/cuda/ tests/runtime/; do
    [[ -x "$BIN_DIR/$d$1" ]] && { echo "$BIN_DIR/$d$1"; return; }
  done
  echo "$BIN_DIR/$1"
}
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
if [[ -n "${LIBS:-}" ]]; then
  mkdir -p /tmp/tessera_libs
  for l in $LIBS; do tar -xJf "$l" -C /tmp/tessera_libs; done
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
  timeout 300 "$(bin "$t")" 2>&1 | tee -a "$OUT/gpu_test.log" | tail -40
done

if [[ -x "$(bin tessera_cuda_matmul_bench)" ]] && ! skipped matmul; then
  step "GEMMs: Tessera (cuBLASLt) / PyTorch"
  BIN=$(bin tessera_cuda_matmul_bench) REPS=10 timeout 180 bash bench/run_cuda_matmul.sh \
    >"$OUT/matmul.log" 2>&1
  grep -E "ratio|rror" "$OUT/matmul.log"
fi

B=${B:-8}
T=${T:-1024}
STEPS=${STEPS:-10}
# Rows of the token table (and LM head): 50304 pads GPT-2's 50,257 to a multiple of 64, as
# llm.c does (same model and loss; aligned GEMMs). Both sides run with the same rows; the
# unpadded section repeats bf16 at 50,257 rows for both.
ROWS=${VOCAB_ROWS:-50304}
tessera() {  # precision, vocab rows, extra flags
  timeout 180 "$(bin tessera_cuda_train_bench)" --batch "$B" --seq "$T" --steps "$STEPS" \
    --precision "$1" --vocab-rows "$2" "${@:3}" 2>&1 | tee -a "$OUT/train.log"
}
torch() {  # precision, vocab rows, extra flags
  timeout 240 python3 bench/pytorch_gpt2.py --device cuda --precision "$1" --vocab-rows "$2" \
    "${@:3}" --batch "$B" --seq "$T" --steps "$STEPS" --warmup 3 2>&1 | tee -a "$OUT/train.log" |
    tail -3
}
if [[ -x "$(bin tessera_cuda_train_bench)" ]] && ! skipped tessera; then
  for p in ${PRECISIONS:-fp32 bf16}; do
    step "GPT-2 124M training, Tessera CUDA, $p, $ROWS rows (CUDA graph; profile of an eager step)"
    tessera "$p" "$ROWS" --profile 1 | grep -v OpenBLAS | head -40
    step "GPT-2 124M training, Tessera CUDA, $p, $ROWS rows, eager (no CUDA graph)"
    tessera "$p" "$ROWS" --graph 0 | grep "^tessera"
    step "GPT-2 124M training, Tessera CUDA, $p, $ROWS rows, epilogues unfused (--fuse 0)"
    tessera "$p" "$ROWS" --fuse 0 | grep "^tessera"
  done
fi
if ! skipped torch; then
  for cfg in "fp32" "bf16" "bf16 --compile"; do
    step "GPT-2 124M training, PyTorch $cfg, $ROWS rows"
    set -- $cfg
    torch "$1" "$ROWS" "${@:2}"
  done
fi
if ! skipped unpadded; then
  step "unpadded vocabulary: bf16 at 50257 rows, Tessera (CUDA graph) and PyTorch eager"
  ! skipped tessera && tessera bf16 50257 | grep "^tessera"
  ! skipped torch && torch bf16 50257
fi
if [[ -x "$(bin tessera)" ]] && ! skipped train; then
  # `tessera train` on the GPU (the shipped corpus: data/corpus's shards, or tokenized on first use).
  printf '[model]\npreset = "gpt2-small"\npadded_vocab_size = %s\n' "$ROWS" >"$OUT/gpt2.toml"
  for p in ${PRECISIONS:-fp32 bf16}; do
    step "GPT-2 124M, tessera train --device cuda, $p, $ROWS rows (steps 3-8)"
    rm -rf "$OUT/train_$p"
    data=(); [[ -f data/corpus/train.bin ]] && data=(--data data/corpus)
    timeout 180 "$(bin tessera)" train --device cuda --model "$OUT/gpt2.toml" --precision "$p" "${data[@]}" \
      --batch "$B" --seq "$T" --steps 8 --eval-every 0 --ckpt-every 0 --sample-tokens 0 \
      --log-every 1 --out "$OUT/train_$p" 2>&1 | tee -a "$OUT/train.log" | grep -E "^step [3-8]/|rror"
  done
fi
if [[ -x "$(bin tessera)" ]] && ! skipped offload; then
  # Offload (issue 49): llama2-7b in bf16 with full recomputation on one GPU, the optimizer (then
  # the ZeRO-3 parameters too) in host memory, measured beside the simulator's prediction of the
  # same plan. The table has the shipped corpus's 50,304 rows (GPT-2's ids), not Llama's 32,000.
  printf '[model]\npreset = "llama2-7b"\nvocab_size = 50304\n' >"$OUT/llama7b.toml"
  data=(); [[ -f data/corpus/train.bin ]] && data=(--data data/corpus)
  for off in optimizer params; do
    z=(); [[ $off == params ]] && z=(--zero 3)
    step "llama2-7b (50,304-row table), train --device cuda --offload $off, bf16, recompute full"
    rm -rf "$OUT/offload_$off"
    timeout 420 "$(bin tessera)" train --device cuda --model "$OUT/llama7b.toml" --precision bf16 \
      --recompute full "${z[@]}" --offload "$off" "${data[@]}" --batch 1 --seq 4096 --steps 5 \
      --eval-every 0 --ckpt-every 0 --sample-tokens 0 --log-every 1 --out "$OUT/offload_$off" 2>&1 |
      tee -a "$OUT/offload.log" | grep -E "^step|trained|planned|peak resident|rror"
    "$(bin tessera)" simulate "$OUT/llama7b.toml" --cluster dgx-h100 --gpus 1 --batch 1 \
      --seq 4096 --precision bf16 --recompute full "${z[@]}" --offload "$off" 2>&1 |
      tee -a "$OUT/offload.log" | grep -E "step time|offload|memory"
  done
fi
