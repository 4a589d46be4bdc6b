# Helpers for the shell-driven tests (cli/, dist/). Sourced. Each test gets DSTRAIN (the binary)
# and SRC (the source tree) as arguments from CTest, and a scratch directory $WORK.
set -euo pipefail
DSTRAIN="$1"
SRC="$2"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/dstrain-$(basename "$0" .sh)-XXXXXX")"
cleanup() { local rc=$?; [ $rc -eq 0 ] && rm -rf "$WORK" || echo "(scratch kept in $WORK)"; exit $rc; }
trap cleanup EXIT
cd "$WORK"
PASSED=0

fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { PASSED=$((PASSED + 1)); echo "ok - $*"; }

# expect_status WANT CMD...: runs CMD, stores stdout+stderr in $OUT, checks the exit status.
# DSTRAIN_TEST_TIMES=1: each command's seconds on stderr, to find what a test spends its time on.
expect_status() {
  local want=$1; shift
  local started=$EPOCHREALTIME
  set +e
  OUT="$("$@" 2>&1)"
  local got=$?
  set -e
  if [ -n "${DSTRAIN_TEST_TIMES:-}" ]; then
    local a named=""
    for a in "$@"; do case $a in run_dir=* | --nproc-per-node | [0-9]) named+=" $a" ;; esac; done
    echo "time: $(python3 -c "print(f'{$EPOCHREALTIME - $started:.1f}')") s: ${2:-} ${3##*/}$named" >&2
  fi
  [ "$got" -eq "$want" ] || fail "'$*' exited $got, expected $want. Output:
$OUT"
}
expect_out() { grep -qF -- "$1" <<<"$OUT" || fail "output lacks '$1'. Output:
$OUT"; }

# The demo recipe with overrides, in a run dir under $WORK.
demo_recipe="$SRC/recipes/demo.yaml"

# wait_for FILE SECONDS: waits until FILE exists.
wait_for() {
  local deadline=$((SECONDS + $2))
  while [ ! -e "$1" ]; do
    [ $SECONDS -lt $deadline ] || fail "timed out waiting for $1"
    sleep 0.1
  done
}

# kill_worker_when FILE LAUNCHER_PID: once FILE exists, SIGKILL one of the launcher's workers and
# wait for the launcher to stop the rest; its exit status is left in LAUNCHER_STATUS.
kill_worker_when() {
  wait_for "$1" 120
  kill -9 "$(pgrep -P "$2" | head -n1)"
  set +e; wait "$2"; LAUNCHER_STATUS=$?; set -e
}

# alive PID...: prints the PIDs among these that are still running (not zombies).
alive() {
  for p in "$@"; do
    if [ -e "/proc/$p" ] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null; then echo "$p"; fi
  done
}

# Every launcher writes logs/exits.nodeN.json: how each of its workers ended. check_worker_exits
# (run by finish) fails the test when a worker of a run the launcher called successful (0, 75)
# did not exit 0 or 75 itself, or when any worker died of a signal nobody sent it (the GPU
# workers' SIGSEGV at exit, issue 17). A test that crashes or kills workers on purpose says
# allow_worker_signals first.
ALLOW_WORKER_SIGNALS=0
allow_worker_signals() { ALLOW_WORKER_SIGNALS=1; }
check_worker_exits() {
  local records
  records="$(find "$WORK" -path '*/logs/exits.node*.json' 2>/dev/null | sort)"
  [ -n "$records" ] || return 0
  python3 - "$ALLOW_WORKER_SIGNALS" $records <<'PY' || fail "a worker process ended badly (above)"
import json, sys
allow_signals, bad = sys.argv[1] == "1", []
for path in sys.argv[2:]:
    r = json.load(open(path))
    assert r["format"] == "dstrain-worker-exits" and r["version"] == 1, path
    for w in r["workers"]:
        ok = r["launcher_status"] not in (0, 75) or (w["signal"] == 0 and w["exit_code"] in (0, 75))
        unasked = w["signal"] != 0 and w["signal_from_launcher"] == 0 and not allow_signals
        if not ok or unasked:
            bad.append(f"{path}: rank {w['rank']} {w['description']} (launcher exited {r['launcher_status']})")
print("\n".join(bad), file=sys.stderr)
sys.exit(1 if bad else 0)
PY
  echo "ok - every worker ended as its launcher reported ($(wc -w <<<"$records") exit records)"
}
finish() { check_worker_exits; echo "$PASSED passed, 0 failed"; }

# same_checkpoint_data A B: the two checkpoint directories hold the same shard files, byte for byte.
same_checkpoint_data() {
  local a=$1 b=$2 f
  [ "$(cd "$a" && ls rank_*.bin)" = "$(cd "$b" && ls rank_*.bin)" ] || return 1
  for f in "$a"/rank_*.bin; do cmp -s "$f" "$b/$(basename "$f")" || return 1; done
}
