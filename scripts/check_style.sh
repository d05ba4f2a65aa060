#!/usr/bin/env bash
# Style gate run by scripts/test.sh (and so by CI): every C++/CUDA file tracked by git is
# clang-formatted (.clang-format, Debian 12's clang-format 14) and no source file is over 800
# lines. Prints each offender and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh clang-format
files=$(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
status=0
if ! clang-format --dry-run --Werror $files 2>/tmp/tessera_format.$$; then
  grep -E "error:" /tmp/tessera_format.$$ | sed 's/:[0-9]*:[0-9]*: error:.*//' | sort -u | sed 's/^/not clang-formatted: /'
  echo "fix with: clang-format -i FILE"
  status=1
fi
rm -f /tmp/tessera_format.$$
while read -r lines file; do
  if [ "$file" != total ] && [ "$lines" -gt 800 ]; then
    echo "$file: $lines lines, over the 800-line budget (split it by what it does)"
    status=1
  fi
done < <(wc -l $files)
exit $status
