#!/usr/bin/env bash
# The control plane at scale, simulated in one process (issue 26): `dstrain bench control-plane`
# for 1,024, 4,096 and 16,384 fake ranks (as many as the open-files hard limit allows: one per
# rank; the store server runs in a child process). Where DNS cannot be reached, c10d's retry
# warnings each wait for a reverse lookup: RES_OPTIONS="timeout:1 attempts:1" shortens that. Prints a table of seconds, store requests and bytes read per phase.
#   scripts/bench-control-plane.sh [N ...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$DSTRAIN_ROOT/scripts/build.sh" >/dev/null
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1024 4096 16384)
hard=$(ulimit -Hn)
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); open files hard limit $hard; RES_OPTIONS='${RES_OPTIONS:-}'; dstrain $(git -C "$DSTRAIN_ROOT" rev-parse --short HEAD)"
printf '| ranks | phase | seconds | store requests | bytes (read; for a checkpoint: its manifest) |\n|---|---|---|---|---|\n'
for n in "${sizes[@]}"; do
  if [ "$hard" != unlimited ] && [ $((n + 256)) -gt "$hard" ]; then
    printf '| %s | (skipped: needs %s open files, the hard limit is %s) | | | |\n' "$n" $((n + 256)) "$hard"
    continue
  fi
  TORCH_CPP_LOG_LEVEL=ERROR "$DSTRAIN_BUILD_DIR/dstrain" bench control-plane --ranks "$n" 2> >(grep -v "hostname of the client socket" >&2) |
    python3 -c 'import json, sys
for line in sys.stdin:
    p = json.loads(line)
    mib = p["bytes"] / 2**20
    print("| %d | %s | %.3f | %d | %s |" % (p["ranks"], p["phase"], p["seconds"], p["store_requests"],
          "" if not p["bytes"] else "%.1f MiB" % mib if mib < 1024 else "%.1f GiB" % (mib / 1024)))'
done
