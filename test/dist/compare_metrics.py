#!/usr/bin/env python3
"""Compares the losses of two metrics.jsonl files.

  compare_metrics.py A B --exact          every step's loss identical (bit-exact resume)
  compare_metrics.py A B --rtol 1e-4      within a relative tolerance (fp32 reduction order)
  compare_metrics.py A --decreases 1.0    the loss fell by at least this much from first to last
  compare_metrics.py A B --resumed ...    B starts later (a run started from A's checkpoint): its
                                          steps are compared with A's same steps
  compare_metrics.py A B --grad-norm ...  the gradient norms as well as the losses
  compare_metrics.py A B --mtp ...        multi-token prediction's losses (each depth's) as well
  compare_metrics.py A B --key z_loss ... any other metric of the objective as well (repeatable)
  compare_metrics.py A B --first 10 ...   the first 10 steps only (MoE routing: after a near-tie
                                          flips one token's expert, fp32 rounding is no longer all)
"""
import argparse
import json
import sys


def losses(path, first=None, key="loss"):
    """The `key` values of steps first..first+n-1 (first: 1, or where the file starts when None)."""
    with open(path) as f:
        rows = [r for r in (json.loads(line) for line in f if line.strip()) if "eval" not in r]  # evaluation rows apart
    steps = [r["step"] for r in rows]
    start = steps[0] if first is None and steps else 1 if first is None else first
    if steps != list(range(start, start + len(rows))):
        sys.exit(f"{path}: steps are not {start}..{start + len(rows) - 1}: {steps[:5]}...")
    values = [r.get(key) for r in rows]
    if key != "loss" and key != "grad_norm" and any(v is None for v in values):
        sys.exit(f"{path}: a step without {key}")
    return start, values


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b", nargs="?")
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--rtol", type=float)
    ap.add_argument("--decreases", type=float)
    ap.add_argument("--resumed", action="store_true")
    ap.add_argument("--grad-norm", action="store_true")
    ap.add_argument("--mtp", action="store_true")
    ap.add_argument("--key", action="append", default=[])
    ap.add_argument("--first", type=int)
    args = ap.parse_args()
    for key in ["loss"] + (["grad_norm"] if args.grad_norm else []) + (["mtp_loss"] if args.mtp else []) + args.key:
        compare(args, key)


def compare(args, key):
    _, a = losses(args.a, 1, key)
    if args.decreases is not None:
        drop = a[0] - a[-1] if key == "loss" else 0.0
        if key != "loss":
            return
        print(f"loss {a[0]:.4f} -> {a[-1]:.4f} (drop {drop:.4f})")
        if drop < args.decreases:
            sys.exit(f"loss fell by {drop:.4f}, expected at least {args.decreases}")
        return
    start, b = losses(args.b, None if args.resumed else 1, key)
    if args.resumed and start == 1:
        sys.exit(f"{args.b} starts at step 1: it was not resumed")
    a = a[start - 1:start - 1 + len(b)] if args.resumed else a[start - 1:]  # a resumed run may stop earlier
    if len(a) != len(b):
        sys.exit(f"{len(a)} steps vs {len(b)} steps")
    if args.first is not None:
        a, b = a[:args.first], b[:args.first]
    worst = 0.0
    for step, (xs, ys) in enumerate(zip(a, b), start=start):
        if args.exact and xs != ys:
            sys.exit(f"step {step}: {key} {xs!r} != {ys!r}")
        xs, ys = (xs, ys) if isinstance(xs, list) else ([xs], [ys])  # a list for several values (mtp_loss's depths)
        if len(xs) != len(ys):
            sys.exit(f"step {step}: {key} {xs!r} vs {ys!r}")
        for x, y in zip(xs, ys):
            rel = abs(x - y) / max(abs(x), 1e-12)
            worst = max(worst, rel)
            if args.rtol is not None and rel > args.rtol:
                sys.exit(f"step {step}: {key} {x} vs {y}, relative difference {rel:.3g} > {args.rtol}")
    print(f"{len(a)} steps' {key} compared, largest relative difference {worst:.3g}")


if __name__ == "__main__":
    main()
