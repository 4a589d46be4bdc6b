#!/usr/bin/env bash
# Data files as other tools write them: a numpy imitation of Megatron's writer (torch venv) is read
# back exactly; prepare-data turns the Python standard library into a byte-level Megatron dataset
# that trains; the dry run and the readers refuse broken inputs clearly.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
if "$py" -c 'import numpy' 2>/dev/null; then
  "$py" "$SRC/test/data/megatron_writer.py" np '[[5, 6, 7], [8], [9, 10, 11, 12]]'
  expect_status 0 "$DSTRAIN" inspect-data np --format megatron
  expect_out "tokens     8"
  expect_out "documents  3"
  expect_out "first      [5, 6, 7, 8, 9, 10, 11, 12]"
  "$py" "$SRC/test/data/megatron_writer.py" big '[[70000, 3], [102399]]'
  expect_status 0 "$DSTRAIN" inspect-data big.idx --format megatron
  expect_out "first      [70000, 3, 102399]"
  ok "datasets from a numpy imitation of Megatron's writer (uint16 and int32) read back exactly"
else
  echo "note: numpy missing from $py; the numpy-writer check was not run"
fi

stdlib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
expect_status 0 "$DSTRAIN" prepare-data "$stdlib" --ext .py --output pycode --max-bytes 2000000
expect_out "documents"
python3 -c 'import json; d=json.load(open("pycode.json")); assert d["documents"] > 10 and d["vocab_size"] == 257, d'
expect_status 0 "$DSTRAIN" prepare-data "$stdlib" --ext .py --output again --max-bytes 2000000
cmp pycode.bin again.bin && cmp pycode.idx again.idx || fail "prepare-data is not deterministic"
ok "prepare-data turns the Python standard library into a byte-level Megatron dataset, deterministically"

expect_status 0 "$DSTRAIN" train "$demo_recipe" --set data.format=megatron --set data.path="$WORK/pycode" --set model.vocab_size=257 \
  --set train.steps=20 --set checkpoint.interval_steps=0 --set run_dir=code
python3 "$SRC/test/dist/compare_metrics.py" code/metrics.jsonl --decreases 1.0 || fail "no learning on the prepared dataset"
ok "a tiny model learns from it"

expect_status 0 "$DSTRAIN" prepare-data "$SRC/recipes/data/demo_corpus.txt" --output prose
expect_status 0 "$DSTRAIN" train "$demo_recipe" --set data.format=megatron --set data.path= --set "data.paths=[$WORK/pycode, $WORK/prose]" \
  --set "data.weights=[1, 3]" --set model.vocab_size=257 --set train.steps=20 --set checkpoint.interval_steps=0 --set run_dir=blend
python3 "$SRC/test/dist/compare_metrics.py" blend/metrics.jsonl --decreases 1.0 || fail "no learning on the blend"
ok "a weighted blend of two datasets trains"

expect_status 3 "$DSTRAIN" train "$demo_recipe" --set data.format=megatron --set data.path="$WORK/nothing" --set run_dir=x  # a data error (README: exit 3)
expect_out "'$WORK/nothing.idx' and '$WORK/nothing.bin' must both exist"
head -c 100 pycode.bin > cut.bin && cp pycode.idx cut.idx
expect_status 3 "$DSTRAIN" inspect-data cut --format megatron
expect_out "lies outside the 100-byte"
ok "missing and truncated datasets are refused with the file named"
finish
