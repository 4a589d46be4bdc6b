#!/usr/bin/env python3
"""TRL 1.16's CPOTrainer and ORPOTrainer (trl.experimental) as the reference for train.objective cpo,
simpo and orpo (issue 60). Run with the TRL overlay's python ($DSTRAIN_TRL_VENV).

Both trainers tokenize rows their own (older) way; here they are fed the token ids DPOTrainer makes
of the same rows, which prepare-data --preference reproduces (dist.dpo checks that), so that the
comparison is of the losses, their gradients and metrics alone.

  reference_free_reference.py train-many MODEL TOKDIR ROWS.jsonl RUNS.json --steps N --lr LR
      for each run of RUNS.json ({"NAME": {"trainer": "cpo" | "orpo", "loss_type": T, "beta": B, "cpo_alpha": A,
      "simpo_gamma": G, "alpha": AP, "label_smoothing": E, "steps": N, "eval_rows": ROWS.jsonl, "eval_steps": K}, ...}),
      every step the whole set (one batch), AdamW without weight decay at a constant LR, fp32 on the CPU: each
      step's loss (as computed) and TRL's metrics in NAME.trl.json beside RUNS.json, and evaluate() every K steps
  reference_free_reference.py compare OUT.json METRICS.jsonl --rtol R [--atol A] [--grad-rtol G] [--eval NAME]
      dstrain's per-step loss and metrics against TRL's (logits/* aside: TRL's CPO and ORPO average them over every
      position of the padded batch; nll_loss aside at cpo_alpha 0, where TRL logs 0)
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dpo_reference import load_rows, quiet, record_training_losses, tiny_model, trainer_for  # noqa: E402

METRICS = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected", "nll_loss"]
ORPO_METRICS = ["log_odds_ratio", "log_odds_chosen"]


def dpo_features(tok, rows, work):
    """Per row, the features CPOTrainer.tokenize_row would give, from DPOTrainer's token ids."""
    dpo = trainer_for(tiny_model(len(tok)), tiny_model(len(tok)), tok, rows, work, max_length=None, per_device_train_batch_size=1)
    out = []
    for ex in dpo.train_dataset:
        batch = dpo.data_collator.torch_call([ex])
        feature = {}
        for r, half in enumerate(["chosen", "rejected"]):
            n = int(batch["attention_mask"][r].sum())
            ids, mask = batch["input_ids"][r][:n].tolist(), batch["completion_mask"][r][:n].tolist()
            prompt = mask.index(1)
            feature.update({f"{half}_input_ids": ids, f"{half}_attention_mask": [1] * n,
                            f"{half}_labels": [-100] * prompt + ids[prompt:]})
            feature.update({"prompt_input_ids": ids[:prompt], "prompt_attention_mask": [1] * prompt})
        out.append(feature)
    if len(out) != len(rows):
        raise SystemExit(f"DPOTrainer kept {len(out)} of {len(rows)} rows")
    return out


def as_indexed(count, first=0):
    # Plain strings, so that the trainers' chat-template step passes them through; the index finds the ids.
    return [{"prompt": "p", "chosen": "c", "rejected": "r", "idx": first + i} for i in range(count)]


def train_one(name, run, args, tok, features, eval_features, out_dir):
    import datasets
    import torch
    import transformers
    if run["trainer"] == "orpo":
        from trl.experimental.orpo import ORPOConfig as Config, ORPOTrainer as Trainer
        extra = dict(beta=run.get("beta", 0.1))
    else:
        from trl.experimental.cpo import CPOConfig as Config, CPOTrainer as Trainer
        extra = dict(beta=run.get("beta", 0.1), loss_type=run.get("loss_type", "sigmoid"), cpo_alpha=run.get("cpo_alpha", 1.0),
                     simpo_gamma=run.get("simpo_gamma", 0.5), alpha=run.get("alpha", 0.0), label_smoothing=run.get("label_smoothing", 0.0))
    table = features + (eval_features or [])  # the evaluation rows' indices follow the training rows'
    Trainer.tokenize_row = lambda self, feature, model=None: table[feature["idx"]]
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager")
    steps = run.get("steps", args.steps)
    evals = dict(eval_strategy="steps", eval_steps=run["eval_steps"], per_device_eval_batch_size=len(eval_features)) if eval_features else {}
    config = Config(output_dir=os.path.join(out_dir, "trl-" + name), report_to=[], use_cpu=True, save_strategy="no", logging_steps=1,
                    disable_tqdm=True, dataloader_drop_last=False, remove_unused_columns=False, bf16=False,
                    per_device_train_batch_size=len(features), gradient_accumulation_steps=1, max_steps=steps, learning_rate=args.lr,
                    lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
                    max_grad_norm=1.0, seed=0, optim="adamw_torch", **evals, **extra)
    train_set = datasets.Dataset.from_list(as_indexed(len(features)))
    eval_set = datasets.Dataset.from_list(as_indexed(len(eval_features), len(features))) if eval_features else None
    trainer = Trainer(model=model, args=config, processing_class=tok, train_dataset=train_set, eval_dataset=eval_set)
    losses = record_training_losses(trainer)
    trainer.train()
    names = METRICS + (ORPO_METRICS if run["trainer"] == "orpo" else [])
    logged = [h for h in trainer.state.log_history if "rewards/chosen" in h]
    out = [dict({"step": i + 1, "loss": losses[i], "grad_norm": h.get("grad_norm")}, **{m: h[m] for m in names}) for i, h in enumerate(logged)]
    scored = [h for h in trainer.state.log_history if "eval_loss" in h]
    evaluations = [dict({"step": h["step"], "loss": h["eval_loss"]}, **{m: h["eval_" + m] for m in names}) for h in scored]
    skip = ["nll_loss"] if run["trainer"] == "cpo" and extra["cpo_alpha"] == 0 else []
    json.dump({"pairs": len(features), "metrics": [m for m in names if m not in skip], "steps": out, "evaluations": evaluations},
              open(os.path.join(out_dir, name + ".trl.json"), "w"), indent=1)
    print(f"TRL {name}: loss {out[0]['loss']:.6f} -> {out[-1]['loss']:.6f} in {len(out)} steps")


def train_many(args):
    quiet()
    import torch
    import transformers
    torch.set_num_threads(1)
    tok = transformers.AutoTokenizer.from_pretrained(args.tokdir)
    out_dir = os.path.dirname(os.path.abspath(args.runs))
    features = dpo_features(tok, load_rows(args.rows), os.path.join(out_dir, "trl-tokens"))
    runs = json.load(open(args.runs))
    eval_cache = {}
    for name, run in runs.items():
        eval_features = None
        if run.get("eval_rows"):
            if run["eval_rows"] not in eval_cache:
                eval_cache[run["eval_rows"]] = dpo_features(tok, load_rows(run["eval_rows"]), os.path.join(out_dir, "trl-tokens"))
            eval_features = eval_cache[run["eval_rows"]]
        train_one(name, run, args, tok, features, eval_features, out_dir)


def compare(args):
    reference = json.load(open(args.reference))
    names = [m for m in reference["metrics"] if m not in getattr(args, "skip", [])]
    rows = list(map(json.loads, open(args.metrics)))
    got = [r for r in rows if "eval" not in r]
    if len(got) != len(reference["steps"]):
        raise SystemExit(f"{args.metrics}: {len(got)} steps, TRL ran {len(reference['steps'])}")
    worst = 0.0
    for r, g in zip(reference["steps"], got):
        for key in ["loss"] + names:
            a, b = r[key], g[key]
            if abs(a - b) > args.atol + args.rtol * abs(a):
                raise SystemExit(f"step {r['step']} {key}: TRL {a!r}, dstrain {b!r} (differ by {abs(a - b):.3g})")
            worst = max(worst, abs(a - b) / abs(a) if abs(a) > args.atol else 0.0)
        if args.grad_rtol and r["grad_norm"] is not None and abs(r["grad_norm"] - g["grad_norm"]) > args.grad_rtol * abs(r["grad_norm"]):
            raise SystemExit(f"step {r['step']} grad_norm: TRL {r['grad_norm']!r}, dstrain {g['grad_norm']!r}")
    print(f"{len(got)} steps: loss and {len(names)} metrics equal TRL's (largest relative difference {worst:.2g})")
    if args.eval:
        scored = [r for r in rows if r.get("eval") == args.eval]
        want = reference["evaluations"]
        if not want or [r["step"] for r in scored] != [e["step"] for e in want]:
            raise SystemExit(f"evaluations of {args.eval} at steps {[r['step'] for r in scored]}, TRL's at {[e['step'] for e in want]}")
        for e, g in zip(want, scored):
            for key, got_key in [("loss", "val_loss")] + [(m, m) for m in names]:
                if abs(e[key] - g[got_key]) > args.atol + args.rtol * abs(e[key]):
                    raise SystemExit(f"evaluation at step {e['step']} {key}: TRL {e[key]!r}, dstrain {g[got_key]!r}")
        print(f"{len(want)} evaluations: loss and {len(names)} metrics equal TRL's evaluate()")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("train-many")
    p.add_argument("model"), p.add_argument("tokdir"), p.add_argument("rows"), p.add_argument("runs")
    p.add_argument("--steps", type=int, required=True), p.add_argument("--lr", type=float, required=True)
    p = sub.add_parser("compare")
    p.add_argument("reference"), p.add_argument("metrics"), p.add_argument("--rtol", type=float, required=True)
    p.add_argument("--atol", type=float, default=1e-6), p.add_argument("--grad-rtol", type=float, default=0.0)
    p.add_argument("--eval", default=None)
    args = ap.parse_args()
    {"train-many": train_many, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    main()
