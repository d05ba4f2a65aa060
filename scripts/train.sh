#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install, build, then `tessera train` with its
# defaults (gpt-mini on the shipped Moby Dick corpus). Extra arguments go to `tessera train`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
exec build/src/cli/tessera train "$@"
