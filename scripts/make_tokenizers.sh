#!/usr/bin/env bash
# Writes Llama 3's and Llama 2's tokenizers as tokenizer.json into build/tokenizers/ (or $1)
# from the npm packages that ship their vocabularies (tools/make_hf_tokenizers.mjs; the files
# are Meta's, so they are not committed). The tests that read them (data_test's
# HfTokenizer.Llama*) report themselves skipped when the files are absent, so this script
# never fails the test run: without node and npm, or without the npm registry, it says so
# and stops.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/tokenizers}
if [ -f "$out/llama3/tokenizer.json" ] && [ -f "$out/llama2/tokenizer.json" ]; then
  exit 0
fi
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
  echo "make_tokenizers: node and npm are not installed; the Llama tokenizer tests will skip"
  exit 0
fi
if ! (cd tools && timeout 300 npm ci --no-audit --no-fund --loglevel=error > /dev/null); then
  echo "make_tokenizers: npm ci in tools/ failed (registry unreachable?); the Llama tokenizer" \
       "tests will skip"
  exit 0
fi
node tools/make_hf_tokenizers.mjs --out "$out" ||
  echo "make_tokenizers: tools/make_hf_tokenizers.mjs failed; the Llama tokenizer tests will skip"
exit 0
