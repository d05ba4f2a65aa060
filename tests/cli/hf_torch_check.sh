#!/usr/bin/env bash
# The PyTorch reference (tools/hf_reference.py) loads what `tessera export hf` wrote from an
# imported golden folder and must compute the golden logits. Exit 77 (skipped) without torch.
# usage: hf_torch_check.sh TESSERA_BINARY SOURCE_DIR gpt2|llama|t5|t5v11
set -euo pipefail
tessera=$1 src=$2 model=$3
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "python3-torch not installed; skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$tessera" import hf "$src/tests/golden/hf/$model" --out "$tmp/ckpt"
"$tessera" export hf "$tmp/ckpt" --out "$tmp/out" --dtype f32 --max-shard-bytes 200000
/usr/bin/python3 "$src/tools/hf_reference.py" --check "$tmp/out" \
    --golden "$src/tests/golden/hf/${model}_logits.safetensors"
