#!/usr/bin/env bash
# A trained run exports to a Hugging Face directory, and a new run starts from it
# (model.init_from): with lr 0 (and no bias updates) its weights stay exactly the exported ones,
# for both families.
source "$(dirname "$0")/../lib.sh"
for recipe in demo tiny-mla-moe; do
  r="$SRC/recipes/$recipe.yaml"
  expect_status 0 "$DSTRAIN" train "$r" --set train.steps=12 --set checkpoint.interval_steps=0 --set run_dir=$recipe-a
  expect_status 0 "$DSTRAIN" export-hf $recipe-a hf-$recipe
  expect_out "exported"
  [ -f hf-$recipe/config.json ] && [ -f hf-$recipe/model.safetensors ] || fail "export wrote no config.json or model.safetensors"
  expect_status 0 "$DSTRAIN" train "$r" --set train.steps=2 --set schedule.type=constant --set optimizer.lr=0 --set checkpoint.interval_steps=0 \
    --set model.init_from="$WORK/hf-$recipe" --set run_dir=$recipe-b --set model.bias_update_speed=0
  expect_out "initialised from $WORK/hf-$recipe"
  expect_status 0 "$DSTRAIN" export-hf $recipe-b hf-$recipe-b
  cmp hf-$recipe/model.safetensors hf-$recipe-b/model.safetensors || fail "$recipe: a run started from the export did not hold its weights"
done
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); assert c["model_type"]=="deepseek_v3" and c["q_lora_rank"]==32, c' hf-tiny-mla-moe/config.json \
  || fail "the MLA + MoE export's config.json is not deepseek_v3"
ok "export-hf and model.init_from round-trip the weights byte for byte (dense and MLA + MoE)"
expect_status 2 "$DSTRAIN" train "$SRC/recipes/demo.yaml" --set model.init_from="$WORK/nowhere" --set run_dir=c
expect_out "model.init_from: '$WORK/nowhere' is not a directory"
ok "a missing init_from directory is a config error"
finish
