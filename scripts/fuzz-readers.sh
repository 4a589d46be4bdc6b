#!/usr/bin/env bash
# Fuzzes the file readers with libFuzzer (clang, ASan + UBSan), issue 20: data_fuzz (Megatron,
# llm.c, raw uint16, bytes), safetensors_fuzz and manifest_fuzz (checkpoints), each from its
# seed corpus in test/fuzz/corpus-*; tokenizer_fuzz (issue 24: prepare-data's tokenizer on
# hostile text and hostile tokenizer.json files); and chat_fuzz (issue 55: hostile chat templates,
# and hostile conversation lines rendered with real templates).
#   scripts/fuzz-readers.sh           60 s each
#   scripts/fuzz-readers.sh 10        10 s each (CI's smoke run)
#   DSTRAIN_FUZZ_SEED=1 ...           a fixed random seed (CI's smoke run: the same inputs every time)
# Crashes land in build-fuzz/crashes/; re-run one with build-fuzz/<target> FILE.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
seconds="${1:-60}"
build="$(fuzz_build data_fuzz safetensors_fuzz manifest_fuzz tokenizer_fuzz chat_fuzz)"
for target in data safetensors manifest tokenizer chat; do
  mkdir -p "$build/corpus-$target"
  say "fuzzing ${target}_fuzz for $seconds s"
  # -rss_limit_mb: a reader must never need much memory for a small file; -timeout: nor much time.
  # A template may build strings up to the sandbox's 256 MiB, so chat_fuzz gets more.
  rss=2048
  [ "$target" = chat ] && rss=4096
  "$build/${target}_fuzz" "$build/corpus-$target" "$DSTRAIN_ROOT/test/fuzz/corpus-$target" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=$rss -max_len=65536 -artifact_prefix="$build/crashes/$target-" -print_final_stats=1 -seed="${DSTRAIN_FUZZ_SEED:-0}" 2>&1 |
    grep -E "^stat::number_of_executed_units|^stat::peak_rss|ERROR|SUMMARY|Test unit written|#[0-9]+.*DONE" | tail -n 6
done
say "no crash, hang or sanitizer report in $seconds s for each reader"
