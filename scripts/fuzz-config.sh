#!/usr/bin/env bash
# Fuzzes the recipe and ds_config readers with libFuzzer (clang, ASan + UBSan).
#   scripts/fuzz-config.sh            10 minutes
#   scripts/fuzz-config.sh 30         30 seconds (CI's smoke run)
#   DSTRAIN_FUZZ_SEED=1 ...           a fixed random seed (CI's smoke run: the same inputs every time)
# Crashes land in build-fuzz/crashes/; re-run one with build-fuzz/config_fuzz FILE.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
seconds="${1:-600}"
build="$(fuzz_build config_fuzz)"
mkdir -p "$build/corpus"
say "fuzzing the config readers for $seconds s"
# -rss_limit_mb: a config reader must never need much memory; -timeout: nor much time.
"$build/config_fuzz" "$build/corpus" "$DSTRAIN_ROOT/test/fuzz/corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=65536 -artifact_prefix="$build/crashes/" -print_final_stats=1 -seed="${DSTRAIN_FUZZ_SEED:-0}" 2>&1 | tail -n 25
say "no crash, hang or sanitizer report in $seconds s"
