#!/usr/bin/env bash
# The longer fault-tolerance run that CI does not do: the SIGKILL-at-a-random-step restart test
# with 20 seeds (CI runs 5), then the hang and bad-step tests. Each seed's run must complete
# and end bit-identical to the uninterrupted run.
#   scripts/soak-faults.sh [SEEDS]   (default 20)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$DSTRAIN_ROOT/scripts/build.sh" >/dev/null
start=$SECONDS
RESTART_SEEDS="${1:-20}" bash "$DSTRAIN_ROOT/test/dist/restart_test.sh" "$DSTRAIN_BUILD_DIR/dstrain" "$DSTRAIN_ROOT"
bash "$DSTRAIN_ROOT/test/dist/fault_tolerance_test.sh" "$DSTRAIN_BUILD_DIR/dstrain" "$DSTRAIN_ROOT"
echo "soak-faults: passed in $((SECONDS - start)) s"
