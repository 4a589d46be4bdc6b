#!/usr/bin/env bash
# The control plane at scale, simulated in one process (issue 26): `dstrain bench control-plane`
# for 1,024, 4,096 and 8,192 fake ranks (as many as the open-files hard limit allows: two per
# rank). Prints a table of seconds and store requests per phase.
#   scripts/bench-control-plane.sh [N ...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$DSTRAIN_ROOT/scripts/build.sh" >/dev/null
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1024 4096 8192)
hard=$(ulimit -Hn)
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); open files hard limit $hard; dstrain $(git -C "$DSTRAIN_ROOT" rev-parse --short HEAD)"
printf '| ranks | phase | seconds | store requests |\n|---|---|---|---|\n'
for n in "${sizes[@]}"; do
  if [ "$hard" != unlimited ] && [ $((2 * n + 256)) -gt "$hard" ]; then
    printf '| %s | (skipped: needs %s open files, the hard limit is %s) | | |\n' "$n" $((2 * n + 256)) "$hard"
    continue
  fi
  TORCH_CPP_LOG_LEVEL=ERROR "$DSTRAIN_BUILD_DIR/dstrain" bench control-plane --ranks "$n" 2> >(grep -v "hostname of the client socket" >&2) |
    python3 -c 'import json, sys
for line in sys.stdin:
    p = json.loads(line)
    print("| %d | %s | %.3f | %d |" % (p["ranks"], p["phase"], p["seconds"], p["store_requests"]))'
done
