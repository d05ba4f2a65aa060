#!/usr/bin/env bash
# The timing tests (CTest label `timing`), one at a time: wall-clock predictions checked against
# measured steps, with a tolerance that adds the noise measured in the same run. Run them on a
# quiet machine; on a loaded one the noise term widens the bound rather than failing.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -L timing "$@"
