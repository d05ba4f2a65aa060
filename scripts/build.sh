#!/usr/bin/env bash
# Configures and builds Tessera (Release, Ninja) into build/. With the CUDA toolkit under
# /usr/local/cuda the CUDA backend is built too (TESSERA_CUDA=auto; set TESSERA_CUDA=OFF to
# skip it, ON to require it): its tests, label `gpu`, are skipped where no device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=${TESSERA_CUDA:-auto}
if [ "$cuda" = auto ]; then
  cuda=$([ -x /usr/local/cuda/bin/nvcc ] && echo ON || echo OFF)
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA="$cuda" >/dev/null
cmake --build build -j "$(nproc)"
