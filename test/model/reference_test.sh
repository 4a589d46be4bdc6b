#!/usr/bin/env bash
# The dense model against an independent PyTorch implementation (torch from the test venv).
source "$(dirname "$0")/../lib.sh"
UNIT="$3"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
if ! "$py" -c 'import torch' 2>/dev/null; then echo "SKIPPED: torch is not importable from $py (run scripts/setup.sh)"; exit 77; fi
DSTRAIN_REFERENCE_DIR="$WORK" "$UNIT" "[model-reference]" >/dev/null || fail "export for the reference failed"
"$py" "$SRC/test/model/reference_check.py" "$WORK" || fail "logits differ from the reference"
ok "dstrain's dense logits and loss equal a PyTorch reference within 1e-5 (fp32)"
mkdir -p "$WORK/moe"
DSTRAIN_REFERENCE_DIR="$WORK/moe" "$UNIT" "[model-moe-reference]" >/dev/null || fail "export of the MLA + MoE models failed"
"$py" "$SRC/test/model/reference_check_moe.py" "$WORK/moe" || fail "MLA + MoE logits differ from the reference"
ok "MLA + MoE (V3-style and V2-Lite-style) logits and loss equal a per-token PyTorch reference within 1e-5"
mkdir -p "$WORK/mtp"
DSTRAIN_REFERENCE_DIR="$WORK/mtp" "$UNIT" "[model-mtp-reference]" >/dev/null || fail "export of the MTP models failed"
"$py" "$SRC/test/model/mtp_reference.py" "$WORK/mtp" || fail "multi-token prediction differs from the reference"
ok "multi-token prediction (depth 1 and 2, two documents in a row, a masked target) and z-loss (with MTP, the head chunked): loss, each term and every gradient equal a PyTorch reference (loss and terms 1e-6, gradients 2e-6 of their largest element; fp32)"
finish
