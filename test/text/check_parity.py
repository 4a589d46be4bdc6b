#!/usr/bin/env python3
"""Compares a dataset made by `dstrain prepare-data --tokenizer T` with Hugging Face `tokenizers`
on the same JSON Lines corpus: every document's ids must be encode(text).ids followed by the
end-of-document id. On a mismatch, prints the first differing document, position and tokens.

    check_parity.py CORPUS.jsonl TOKENIZER_DIR PREFIX EOD_TOKEN [--threads N]
"""
import argparse
import json
import sys

import numpy as np
from tokenizers import Tokenizer


def read_megatron(prefix):
    with open(prefix + ".idx", "rb") as f:
        head = f.read(9 + 8 + 1 + 8 + 8)
        assert head[:9] == b"MMIDIDX\x00\x00", "not a Megatron index"
        dtype = {8: np.uint16, 4: np.int32}[head[17]]
        count = int.from_bytes(head[18:26], "little")
        lengths = np.frombuffer(f.read(4 * count), dtype=np.int32)
    tokens = np.fromfile(prefix + ".bin", dtype=dtype)
    assert int(lengths.sum()) == len(tokens), "index and .bin disagree"
    out, at = [], 0
    for n in lengths:
        out.append(tokens[at:at + n].tolist())
        at += n
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("tokenizer")
    ap.add_argument("prefix")
    ap.add_argument("eod")
    args = ap.parse_args()
    tok = Tokenizer.from_file(args.tokenizer + "/tokenizer.json")
    eod = tok.token_to_id(args.eod)
    with open(args.corpus, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    texts = [t for t in texts if t]
    expected = [e.ids + ([] if e.ids and e.ids[-1] == eod else [eod]) for e in tok.encode_batch(texts)]
    got = read_megatron(args.prefix)
    if len(got) != len(expected):
        print(f"FAIL {args.tokenizer}: {len(got)} documents, tokenizers has {len(expected)}")
        return 1
    for d, (g, e) in enumerate(zip(got, expected)):
        if g == e:
            continue
        i = next((k for k in range(min(len(g), len(e))) if g[k] != e[k]), min(len(g), len(e)))
        show = lambda ids: [tok.id_to_token(t) for t in ids[max(0, i - 3):i + 5]]
        print(f"FAIL {args.tokenizer}: document {d} differs at token {i} of {len(e)}")
        print(f"  dstrain:    {g[max(0, i - 3):i + 5]} {show(g)}")
        print(f"  tokenizers: {e[max(0, i - 3):i + 5]} {show(e)}")
        enc = tok.encode(texts[d])
        if i < len(enc.offsets):
            a, b = enc.offsets[max(0, i - 3)][0], enc.offsets[min(i + 4, len(enc.offsets) - 1)][1]
            print(f"  text there: {texts[d][a:b]!r}")
        return 1
    total = sum(len(e) for e in expected)
    print(f"ok {args.tokenizer}: {len(expected)} documents, {total} tokens identical to tokenizers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
