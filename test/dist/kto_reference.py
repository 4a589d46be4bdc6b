#!/usr/bin/env python3
"""TRL 1.16's KTOTrainer as the reference for prepare-data --preference --kto and train.objective kto
(issue 60). Run with the TRL overlay's python ($DSTRAIN_TRL_VENV).

  kto_reference.py labelled PAIRS.jsonl OUT.jsonl [--seed S]
      unpaired rows {prompt, completion, label} from preference rows: each pair gives one example, its
      chosen completion (label true) or its rejected one (false), at random
  kto_reference.py tokens TOKDIR ROWS.jsonl OUT.json --kl-batch-size K [--max-length N]
      what KTOTrainer makes of the rows (its dataset map, KL completions rotated within chunks of K,
      then its collator's truncation): per example its ids, completion mask and label, and its KL sequence's
  kto_reference.py tokens-many SPECS.jsonl
      the same for each line {"tokdir", "rows", "out", "kl_batch_size", "max_length"} in one process (one import of TRL)
  kto_reference.py compare-tokens OUT.json PREFIX
      dstrain's set (documents 2i and 2i + 1, the loss mask, the labels in PREFIX.json) against them
  kto_reference.py train-many MODEL TOKDIR ROWS.jsonl RUNS.json --steps N --lr LR --kl-batch-size K
      for each run of RUNS.json ({"NAME": {"loss_type": T, "beta": B, "desirable_weight": D, "undesirable_weight": U,
      "eval_rows": ROWS.jsonl, "eval_steps": K}, ...}): every step the whole set in one batch of per_device_train_batch_size
      K (the rows' count), AdamW without weight decay at a constant LR, fp32 on the CPU: each step's loss and TRL's
      metrics in NAME.trl.json beside RUNS.json, and evaluate() every K steps
  kto_reference.py compare OUT.json METRICS.jsonl --rtol R [--atol A] [--grad-rtol G] [--eval NAME] [--skip METRIC ...]
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dpo_reference import load_rows, quiet, record_training_losses  # noqa: E402
from reference_free_reference import compare  # noqa: E402  (reads the metrics named in OUT.json)

METRICS = ["kl", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected", "logits/chosen",
           "logits/rejected"]


def labelled(args):
    rng = random.Random(args.seed)
    with open(args.out, "w", encoding="utf-8") as f:
        for row in load_rows(args.pairs):
            good = rng.random() < 0.5
            f.write(json.dumps({"prompt": row["prompt"], "completion": row["chosen" if good else "rejected"], "label": good},
                               ensure_ascii=False) + "\n")


def tiny(vocab):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from dpo_reference import tiny_model
    return tiny_model(vocab)


def trainer_for(model, ref_model, tok, rows, out_dir, eval_rows=None, **config):
    import datasets
    from trl import KTOConfig, KTOTrainer
    args = KTOConfig(output_dir=out_dir, report_to=[], use_cpu=True, save_strategy="no", logging_steps=1, disable_tqdm=True,
                     dataloader_drop_last=False, remove_unused_columns=False, bf16=False, gradient_checkpointing=False, **config)
    return KTOTrainer(model=model, ref_model=ref_model, args=args, processing_class=tok, train_dataset=datasets.Dataset.from_list(rows),
                      eval_dataset=datasets.Dataset.from_list(eval_rows) if eval_rows else None)


def tokens(args):
    quiet()
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(args.tokdir)
    rows = load_rows(args.rows)
    trainer = trainer_for(tiny(len(tok)), tiny(len(tok)), tok, rows, os.path.join(os.path.dirname(os.path.abspath(args.out)), "trl-kto"),
                          max_length=args.max_length, per_device_train_batch_size=args.kl_batch_size)
    out = []
    for ex in trainer.train_dataset:
        batch = trainer.data_collator.torch_call([ex])
        example = {"label": bool(ex["label"])}
        for prefix in ["", "KL_"]:
            n = int(batch[prefix + "attention_mask"][0].sum())
            example[prefix + "ids"] = batch[prefix + "input_ids"][0][:n].tolist()
            example[prefix + "mask"] = batch[prefix + "completion_mask"][0][:n].tolist()
        out.append(example)
    json.dump({"rows": len(rows), "examples": out}, open(args.out, "w"))
    print(f"TRL made {len(out)} examples of {len(rows)} rows")


def tokens_many(args):
    for line in open(args.specs, encoding="utf-8"):
        if line.strip():
            spec = json.loads(line)
            tokens(argparse.Namespace(tokdir=spec["tokdir"], rows=spec["rows"], out=spec["out"], kl_batch_size=spec["kl_batch_size"],
                                      max_length=spec.get("max_length")))


def compare_tokens(args):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "text"))
    from chat_data_reference import read_dataset
    ref = json.load(open(args.reference))["examples"]
    got = read_dataset(args.prefix)
    labels = json.load(open(args.prefix + ".json"))["kto"]["labels"]
    if len(got) != 2 * len(ref) or len(labels) != len(ref):
        raise SystemExit(f"{args.prefix}: {len(got)} documents and {len(labels)} labels, TRL made {len(ref)} examples")
    for i, example in enumerate(ref):
        if (labels[i] == "1") != example["label"]:
            raise SystemExit(f"example {i}: label {labels[i]}, TRL's {example['label']}")
        for half, prefix in enumerate(["", "KL_"]):
            ids, mask = got[2 * i + half]
            if ids != example[prefix + "ids"]:
                raise SystemExit(f"example {i} {prefix or 'own '}sequence: ids differ: TRL {example[prefix + 'ids']}\n dstrain {ids}")
            if list(mask) != example[prefix + "mask"]:
                raise SystemExit(f"example {i} {prefix or 'own '}sequence: masks differ: TRL {example[prefix + 'mask']}\n dstrain {list(mask)}")
    print(f"{len(ref)} examples: labels, token ids and completion masks of each and of its KL sequence identical to TRL's")


def train_many(args):
    quiet()
    import torch
    import transformers
    torch.set_num_threads(1)
    tok = transformers.AutoTokenizer.from_pretrained(args.tokdir)
    rows = load_rows(args.rows)
    out_dir = os.path.dirname(os.path.abspath(args.runs))
    load = dict(dtype=torch.float32, attn_implementation="eager")
    for name, run in json.load(open(args.runs)).items():
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, **load)
        ref = transformers.AutoModelForCausalLM.from_pretrained(args.model, **load)
        eval_rows = load_rows(run["eval_rows"]) if run.get("eval_rows") else None
        evals = dict(eval_strategy="steps", eval_steps=run["eval_steps"], per_device_eval_batch_size=len(eval_rows)) if eval_rows else {}
        trainer = trainer_for(model, ref, tok, rows, os.path.join(out_dir, "trl-" + name), eval_rows=eval_rows, **evals,
                              per_device_train_batch_size=args.kl_batch_size, gradient_accumulation_steps=1, max_steps=args.steps,
                              learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9,
                              adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0, seed=0, optim="adamw_torch", max_length=None,
                              loss_type=run.get("loss_type", "kto"), beta=run.get("beta", 0.1),
                              desirable_weight=run.get("desirable_weight", 1.0), undesirable_weight=run.get("undesirable_weight", 1.0))
        if len(trainer.train_dataset) != args.kl_batch_size:
            raise SystemExit(f"{len(trainer.train_dataset)} examples: the steps would not be whole batches of {args.kl_batch_size}")
        losses = record_training_losses(trainer)
        trainer.train()
        logged = [h for h in trainer.state.log_history if "rewards/chosen" in h]
        steps = [dict({"step": i + 1, "loss": losses[i], "grad_norm": h.get("grad_norm")}, **{m: h[m] for m in METRICS})
                 for i, h in enumerate(logged)]
        scored = [h for h in trainer.state.log_history if "eval_loss" in h]
        evaluations = [dict({"step": h["step"], "loss": h["eval_loss"]}, **{m: h["eval_" + m] for m in METRICS}) for h in scored]
        json.dump({"examples": len(rows), "metrics": METRICS, "steps": steps, "evaluations": evaluations}, open(os.path.join(out_dir, name + ".trl.json"), "w"),
                  indent=1)
        print(f"TRL {name}: loss {steps[0]['loss']:.6f} -> {steps[-1]['loss']:.6f}, kl {steps[0]['kl']:.4g} -> {steps[-1]['kl']:.4g}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("labelled")
    p.add_argument("pairs"), p.add_argument("out"), p.add_argument("--seed", type=int, default=1)
    p = sub.add_parser("tokens")
    p.add_argument("tokdir"), p.add_argument("rows"), p.add_argument("out")
    p.add_argument("--kl-batch-size", type=int, required=True), p.add_argument("--max-length", type=int, default=None)
    p = sub.add_parser("tokens-many")
    p.add_argument("specs")
    p = sub.add_parser("compare-tokens")
    p.add_argument("reference"), p.add_argument("prefix")
    p = sub.add_parser("train-many")
    p.add_argument("model"), p.add_argument("tokdir"), p.add_argument("rows"), p.add_argument("runs")
    p.add_argument("--steps", type=int, required=True), p.add_argument("--lr", type=float, required=True)
    p.add_argument("--kl-batch-size", type=int, required=True)
    p = sub.add_parser("compare")
    p.add_argument("reference"), p.add_argument("metrics"), p.add_argument("--rtol", type=float, required=True)
    p.add_argument("--atol", type=float, default=1e-6), p.add_argument("--grad-rtol", type=float, default=0.0)
    p.add_argument("--eval", default=None)
    p.add_argument("--skip", nargs="*", default=[], help="metrics left out (rewards/margins of a step split into micro-batches)")
    args = ap.parse_args()
    {"labelled": labelled, "tokens": tokens, "tokens-many": tokens_many, "compare-tokens": compare_tokens, "train-many": train_many,
     "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    main()
