#!/usr/bin/env python3
"""Hugging Face transformers as the reference: every model directory dstrain exported (under the
directory given) loads with AutoModelForCausalLM as it is, without trust_remote_code, and its
logits on the exported tokens equal dstrain's within a tolerance (fp32: 1e-5 relative to the
logits' scale; bf16 weights: 2e-2). Where a tokenizer was exported, AutoTokenizer loads it and
maps text to the dataset's ids. Prints one line per model; exits 1 on the first mismatch."""
import json
import sys
from pathlib import Path

import torch
import transformers


def check_model(d):
    meta = json.loads((d / "reference.json").read_text())
    tokens = torch.frombuffer(bytearray((d / "tokens.bin").read_bytes()), dtype=torch.int64).reshape(meta["tokens_shape"])
    expected = torch.frombuffer(bytearray((d / "logits.bin").read_bytes()), dtype=torch.float32).reshape(meta["logits_shape"])
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        got = model(tokens).logits.float()
    scale = expected.abs().max().item()
    diff = (got - expected).abs().max().item() / max(scale, 1e-6)
    tol = meta.get("tolerance", 1e-5)
    print(f"{d.name}: {type(model).__name__}, max |logits diff| / max |logits| = {diff:.2e} (tolerance {tol:g})")
    if not diff <= tol:
        print(f"FAIL: {d.name}: transformers' logits differ from dstrain's", file=sys.stderr)
        return False
    return True


def check_tokenizer(d):
    meta = json.loads((d / "reference.json").read_text())
    tok = transformers.AutoTokenizer.from_pretrained(d)
    text = meta["tokenizer_text"]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    want = list(text.encode("utf-8"))
    print(f"{d.name}: AutoTokenizer {type(tok).__name__}, {len(ids)} ids for {len(want)} bytes, eos {tok.eos_token_id}")
    if ids != want or tok.decode(ids) != text:
        print(f"FAIL: {d.name}: the tokenizer does not map bytes to their ids", file=sys.stderr)
        return False
    if "eos_token_id" in meta and tok.eos_token_id != meta["eos_token_id"]:
        print(f"FAIL: {d.name}: eos id {tok.eos_token_id}, the dataset's is {meta['eos_token_id']}", file=sys.stderr)
        return False
    return True


def main():
    root = Path(sys.argv[1])
    dirs = sorted(p for p in root.iterdir() if (p / "reference.json").exists())
    if not dirs:
        print("FAIL: nothing to check", file=sys.stderr)
        return 1
    ok = True
    for d in dirs:
        ok = check_model(d) and ok
        if (d / "tokenizer.json").exists():
            ok = check_tokenizer(d) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
