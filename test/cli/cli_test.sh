#!/usr/bin/env bash
# The command line as a user meets it: help texts, versions, usage errors and their exit codes.
source "$(dirname "$0")/../lib.sh"

expect_status 0 "$DSTRAIN" --help
for sub in train resume check-env inspect-ckpt; do expect_out "$sub"; done
expect_out "Exit codes"
ok "dstrain --help lists the subcommands and exit codes"

for sub in train resume check-env inspect-ckpt; do
  expect_status 0 "$DSTRAIN" "$sub" --help
  expect_out "Example"
  expect_out "dstrain $sub"
done
ok "every subcommand's --help explains it with an example"

expect_status 0 "$DSTRAIN" --version
for word in "dstrain 0." "commit" "compiler: GNU" "libtorch: 2." "cuda:" "nccl"; do expect_out "$word"; done
ok "--version names dstrain, commit, compiler, LibTorch, CUDA and NCCL"

expect_status 2 "$DSTRAIN" bogus
expect_out "unknown command 'bogus'"
expect_status 2 "$DSTRAIN"
expect_status 2 "$DSTRAIN" train --no-such-flag "$demo_recipe"
expect_out "usage error"
expect_status 2 "$DSTRAIN" train
expect_status 2 "$DSTRAIN" train missing.yaml
expect_out "missing.yaml"
ok "unknown commands, flags and missing arguments exit 2 with a message"

expect_status 0 "$DSTRAIN" train "$demo_recipe" --dry-run --set run_dir=dry
expect_out "batch: global 16 = micro 8 x 2 ranks x 1 accumulation"
expect_out "no worker started"
[ ! -e dry ] || fail "--dry-run created the run directory"
ok "--dry-run validates and prints the plan without writing anything"

printf 'run_dir: r\ndata: {path: %s/recipes/data/demo_corpus.txt}\ntrain:\n  stepz: 3\n  lr: high\nmodel:\n  num_heads: 5\n' "$SRC" > bad.yaml
expect_status 2 "$DSTRAIN" train bad.yaml
expect_out "3 problems"
expect_out "bad.yaml:4:3: train.stepz: unknown key (did you mean 'steps'?)"
expect_out "bad.yaml:5:7: train.lr: expected a number, found 'high'"
expect_out "model.num_heads: 5 does not divide model.hidden_size 64"
[ ! -e r ] || fail "a rejected recipe created its run directory"
ok "a recipe with three mistakes prints three errors, exits 2 and writes nothing"

expect_status 2 "$DSTRAIN" train "$demo_recipe" --set train.global_batch_size=24 --nproc-per-node 2 --dry-run
expect_out "train.global_batch_size 24 is not divisible by micro_batch_size 8 x 2 ranks = 16"
ok "an uneven batch split is refused with the numbers"

expect_status 0 "$DSTRAIN" check-env
for word in host os cpu memory libtorch "cuda kernels" gpus; do expect_out "$word"; done
expect_status 0 "$DSTRAIN" check-env --json
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert "libtorch" in d and "gpus" in d' "$OUT" || fail "check-env --json is not valid JSON"
ok "check-env prints the node's facts as a table and as JSON"

expect_status 2 "$DSTRAIN" resume nowhere
expect_out "not a dstrain run directory"
expect_status 4 "$DSTRAIN" inspect-ckpt nowhere
expect_out "is not a directory"
ok "resume and inspect-ckpt refuse paths that are not runs or checkpoints"

finish
