#!/usr/bin/env bash
# Installs the Debian 12 packages Tessera builds and tests with (only those missing), or, when
# given package names, just those (bench/run_speed.sh: python3-torch ...).
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config git
          libopenblas-dev libopenblas0-pthread
          nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
          libopenmpi-dev openmpi-bin
          gnuplot-nox zlib1g-dev  # tessera report: plots; its test reads PNGs; IDX images
          dataset-fashion-mnist  # `train --model vit-tiny --data fashion-mnist`
          slurm-wlm slurmdbd munge mariadb-server)  # scripts/slurm_local.sh: the slurm tests
[ $# -gt 0 ] && packages=("$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
