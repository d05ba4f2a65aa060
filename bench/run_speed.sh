#!/usr/bin/env bash
# GPT-2 124M training speed on the CPU: Tessera (bench/train_speed.cc) against PyTorch
# (bench/pytorch_gpt2.py) at B=4,T=64 and B=8,T=256 with 2 threads, REPS interleaved
# repetitions, medians; Tessera's FLOP/s as a fraction of the OpenBLAS SGEMM peak measured in
# the same process. Run from anywhere:
#
#   bash bench/run_speed.sh                 # REPS=3 BUILD=build THREADS=2
#
# Installs python3-torch and libopenblas0-pthread if missing (apt-get, through sudo when not
# root) and builds tessera_train_speed if it is not there.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
REPS=${REPS:-3}
THREADS=${THREADS:-2}
# PyTorch runs with OpenMP's passive wait policy: its idle OpenMP threads otherwise spin against
# OpenBLAS's and the step is ~1.5x slower (measured here). Set TORCH_ENV= to run it as is.
TORCH_ENV=${TORCH_ENV-OMP_WAIT_POLICY=passive}

bash scripts/install_deps.sh python3-torch libopenblas0-pthread
if [ ! -x "$BUILD/bench/tessera_train_speed" ]; then
  cmake -S . -B "$BUILD" -G Ninja >/dev/null
  cmake --build "$BUILD" --target tessera_train_speed
fi

# OpenBLAS 0.3.21 does not know some newer CPUs (e.g. Xeon model 207) and falls back to its
# Prescott (SSE3) kernels, 5-7x slower. Both programs then get the same, right, kernels.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  core=$(/usr/bin/python3 -c 'import ctypes; l = ctypes.CDLL("libopenblas.so.0"); l.openblas_get_corename.restype = ctypes.c_char_p; print(l.openblas_get_corename().decode())')
  flags=$(grep -m1 '^flags' /proc/cpuinfo)
  if [ "$core" = "Prescott" ] && [[ $flags == *avx512f* ]]; then
    export OPENBLAS_CORETYPE=SkylakeX
  elif [ "$core" = "Prescott" ] && [[ $flags == *avx2* ]]; then
    export OPENBLAS_CORETYPE=Haswell
  fi
  [ -n "${OPENBLAS_CORETYPE:-}" ] && echo "OpenBLAS detected $core; using OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"
fi

field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p"; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs; load: $(cut -d' ' -f1-3 /proc/loadavg)"
rows=()
for shape in "4 64 3" "8 256 2"; do
  read -r B T STEPS <<<"$shape"
  ts=() pt=() gf=() pk=() fr=()
  for rep in $(seq "$REPS"); do
    out=$("$BUILD/bench/tessera_train_speed" --batch "$B" --seq "$T" --steps "$STEPS" --threads "$THREADS")
    echo "$out"
    ts+=("$(field tokens_per_s <<<"$out")") gf+=("$(field gflops <<<"$out")")
    pk+=("$(field peak_gflops <<<"$out")") fr+=("$(field fraction <<<"$out")")
    out=$(env $TORCH_ENV /usr/bin/python3 bench/pytorch_gpt2.py --batch "$B" --seq "$T" \
      --steps "$STEPS" --threads "$THREADS")
    echo "$out"
    pt+=("$(field tokens_per_s <<<"$out")")
  done
  t=$(printf '%s\n' "${ts[@]}" | median) p=$(printf '%s\n' "${pt[@]}" | median)
  g=$(printf '%s\n' "${gf[@]}" | median) k=$(printf '%s\n' "${pk[@]}" | median)
  f=$(printf '%s\n' "${fr[@]}" | median)
  rows+=("$(awk -v b="$B" -v t="$T" -v ts="$t" -v pt="$p" -v g="$g" -v k="$k" -v f="$f" 'BEGIN {
    printf "| B=%s, T=%s | %.1f | %.1f | %.2fx | %.1f | %.1f | %.0f%% |", b, t, ts, pt, ts / pt, g, k, 100 * f }')")
done
echo
echo "GPT-2 124M, fp32, AdamW, $THREADS threads; medians of $REPS interleaved runs (fraction: the"
echo "median of each run's Tessera GFLOP/s over the SGEMM peak measured in that run)"
echo "| shape | Tessera tok/s | PyTorch tok/s | ratio | Tessera GFLOP/s | SGEMM peak GFLOP/s | fraction |"
echo "|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
