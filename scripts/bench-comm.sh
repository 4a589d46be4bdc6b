#!/usr/bin/env bash
# Collective benchmark on this machine: all_reduce, reduce_scatter and all_gather from 1 KiB to
# 256 MiB at 2 and 4 local ranks (Gloo over loopback on CPU; NCCL on GPU machines), with the
# host's memcpy rate printed by the same program for scale. Results go in bench/RESULTS.md.
#   scripts/bench-comm.sh [MAX_BYTES]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
max="${1:-268435456}"
"$DSTRAIN_ROOT/scripts/build.sh" >/dev/null
echo "# $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for n in 2 4; do
  echo
  echo "## $n ranks"
  "$DSTRAIN_BUILD_DIR/dstrain" bench comm --nproc-per-node "$n" --max-bytes "$max" 2>&1 | grep -v ' INFO '
done
