#!/usr/bin/env bash
# dstrain's exports against Hugging Face transformers (from the test venv): each family loads with
# AutoModelForCausalLM as it is, without trust_remote_code, and gives dstrain's logits.
source "$(dirname "$0")/../lib.sh"
UNIT="$3"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error  # local files only, quiet
if ! "$py" -c 'import transformers' 2>/dev/null; then echo "SKIPPED: transformers is not importable from $py (run scripts/setup.sh --test)"; exit 77; fi
DSTRAIN_REFERENCE_DIR="$WORK" "$UNIT" "[model-transformers-reference]" >/dev/null || fail "the export for transformers failed"
"$py" "$SRC/test/model/transformers_check.py" "$WORK" || fail "transformers' logits differ from dstrain's"
ok "transformers loads dstrain's dense, DeepSeek-V2 and DeepSeek-V3 exports (plain, linear and YaRN RoPE; V3 with two MTP modules, which it skips) and gives their logits within 1e-5 (the MTP export 1e-6)"
finish
