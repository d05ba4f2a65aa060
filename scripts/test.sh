#!/usr/bin/env bash
# The test suite on a fresh Debian 12 machine: install, check the style (clang-format, 800-line
# files: scripts/check_style.sh), build, run every CPU test but the
# timing ones (label `timing`: they measure wall-clock accuracy and need a quiet machine;
# scripts/test_timing.sh runs them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
# The report test renders its page in a headless browser.
scripts/install_deps.sh chromium
scripts/check_style.sh
scripts/build.sh
scripts/make_tokenizers.sh  # Llama 3/2 tokenizer.json for the tokenizer tests (needs npm)
ctest --test-dir build --output-on-failure -j "$(nproc)" -LE timing "$@"
