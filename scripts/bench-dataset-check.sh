#!/usr/bin/env bash
# What checking a prepared dataset against its PREFIX.json costs (issue 55): the CRC-32C of
# PREFIX.bin and PREFIX.idx on the first open (hardware CRC over the page cache), and on later
# opens (the checksum cache, keyed by file identity). A byte-level set of about 1 GB is prepared
# from generated text; `dstrain inspect-data` opens it (the same check as train and eval).
#   scripts/bench-dataset-check.sh [MB_OF_TEXT]     default 512 (a 1 GB PREFIX.bin: 2 bytes a token)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$DSTRAIN_ROOT/scripts/build.sh" dstrain >/dev/null
mb="${1:-512}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work/text.txt" "$mb" <<'PY'
import random, sys
rng = random.Random(5)
words = [("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))) for _ in range(5000)]
block = (" ".join(rng.choice(words) for _ in range(200000)) + "\n").encode()
with open(sys.argv[1], "wb") as f:
    for _ in range(int(sys.argv[2]) * (1 << 20) // len(block)):
        f.write(block)
PY
"$DSTRAIN_ROOT/build/dstrain" prepare-data "$work/text.txt" --output "$work/set" >/dev/null
bin_mb=$(($(stat -c %s "$work/set.bin") >> 20))
export XDG_CACHE_HOME="$work/cache"
time_of() {  # seconds of one inspect-data
  local t0=$EPOCHREALTIME
  "$DSTRAIN_ROOT/build/dstrain" inspect-data "$work/set" >/dev/null
  python3 -c "print(f'{$EPOCHREALTIME - $t0:.3f}')"
}
cat "$work/set.bin" > /dev/null  # in the page cache, as right after prepare-data
first=$(time_of)
second=$(time_of)
mv "$work/set.json" "$work/set.json.off"  # a plain Megatron set: nothing to check against
unchecked=$(time_of)
mv "$work/set.json.off" "$work/set.json"
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); PREFIX.bin of $bin_mb MiB (page cache warm)"
echo "| inspect-data | seconds | GB/s of PREFIX.bin |"
echo "|---|---|---|"
python3 - "$bin_mb" "$unchecked" "$first" "$second" <<'PY'
import sys
mb, unchecked, first, second = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
print(f"| without PREFIX.json (nothing to check against) | {unchecked:.3f} | |")
print(f"| first open: CRC-32C of .bin and .idx | {first:.3f} | {mb / 1024 / max(first - unchecked, 1e-9):.2f} (the check alone) |")
print(f"| later opens: the checksum cache | {second:.3f} | |")
PY
