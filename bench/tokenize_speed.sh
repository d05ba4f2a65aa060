#!/usr/bin/env bash
# Tessera's tokenizers against a reference on the same text, one thread each: the JavaScript
# port of Hugging Face's tokenizers (@huggingface/tokenizers) reading the same tokenizer.json
# (GPT-2's files written as one); also printed, the encoders of llama3-tokenizer-js and
# llama-tokenizer-js. Prints MiB/s of text per thread, the ratio Tessera / reference, and
# whether the token counts agree. (Rust's tokenizers, what Python users run, is not
# installable here: no pip.)
#   bash bench/tokenize_speed.sh [TEXT]    (default: the shipped corpus; needs node and npm)
set -euo pipefail
cd "$(dirname "$0")/.."
text=${1:-data/corpus/moby_dick.txt}
tessera=build/src/cli/tessera
scripts/make_tokenizers.sh > /dev/null
[ -f build/tokenizers/llama3/tokenizer.json ] || { echo "needs node and npm (tools/)"; exit 1; }
declare -A ref_speed ref_tokens
while read -r name speed tokens; do
  ref_speed[$name]=$speed
  ref_tokens[$name]=$tokens
done < <(node bench/tokenize_speed.mjs "$text" build/tokenizers)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf "%-20s %14s %14s %7s  %s\n" tokenizer "Tessera MiB/s" "reference" ratio "tokens (Tessera = reference)"
for name in gpt2 llama3 llama2; do
  tok=build/tokenizers/$name
  [ "$name" = gpt2 ] && tok=data/gpt2
  line=$("$tessera" tokenize --input "$text" --out "$out/$name" --tokenizer "$tok" --threads 1 \
           --val-tokens 0 2>&1 | grep '^wrote')
  mibs=$(sed -E 's/.*, ([0-9.]+) (KiB|MiB)\/s of text per thread.*/\1 \2/' <<< "$line")
  mibs=$(awk '{print ($2 == "KiB") ? $1 / 1024 : $1}' <<< "$mibs")
  tokens=$(sed -E 's/.*: ([0-9,]+) tokens \(.*/\1/' <<< "$line" | tr -d ,)
  ref=${ref_speed[$name]}
  # Tessera's stream has one document-start token more.
  agree=$([ $((tokens - 1)) = "${ref_tokens[$name]}" ] && echo yes || echo "NO: ${ref_tokens[$name]}")
  printf "%-20s %14.2f %14.3f %6.1fx  %s %s\n" "$name" "$mibs" "$ref" \
    "$(awk -v a="$mibs" -v b="$ref" 'BEGIN{print a / b}')" "$tokens" "$agree"
done
for name in llama3-tokenizer-js llama-tokenizer-js; do
  printf "%-20s %14s %14.3f\n" "$name" "" "${ref_speed[$name]}"
done
