#!/usr/bin/env python3
"""TRL 1.16's RewardTrainer as the reference for train.objective reward (issue 60).
Run with the TRL overlay's python ($DSTRAIN_TRL_VENV, scripts/setup.sh --test).

  reward_reference.py tokens TOKDIR ROWS.jsonl OUT.json
      what RewardTrainer makes of each row: per pair the chosen and rejected input ids, and the pad id
      its model reads the score before
  reward_reference.py compare-tokens OUT.json PREFIX
      dstrain's set (documents 2i, 2i + 1) against them, pair by pair
  reward_reference.py model CAUSAL_LM_DIR OUT_DIR [--seed S]
      the causal LM as a sequence classifier with one label (transformers' own score initialisation
      from seed S), saved as a reward model folder both sides start from
  reward_reference.py train MODEL TOKDIR ROWS.jsonl OUT.json --steps N --lr LR [--center C] [--eval-rows ROWS.jsonl --eval-steps K]
      RewardTrainer on the rows (with their "margin" column when they have one), every step the whole set (one batch), AdamW without weight decay, a
      constant LR, fp32 on the CPU; writes each step's loss and accuracy, margin, mean_reward, and with
      --eval-rows its evaluate() every K steps
  reward_reference.py score MODEL TOKDIR ROWS.jsonl OUT.json [--adapter PEFT_DIR]
      a (dstrain-exported) folder loaded by AutoModelForSequenceClassification (with a PEFT adapter
      merged in), scored by RewardTrainer's evaluate() on the rows in one batch: loss, accuracy,
      margin, mean_reward
  reward_reference.py many COMMANDS.txt
      each line's command (the arguments above) in this one process: TRL imported once
  reward_reference.py compare OUT.json METRICS.jsonl --rtol R [--atol A] [--eval NAME]
      dstrain's per-step loss and metrics against TRL's (and evaluation set NAME's rows against TRL's
      evaluations)
"""
import argparse
import json
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dpo_reference import load_rows, quiet, record_training_losses  # noqa: E402 (the same environment and rows as DPO's reference)

METRICS = ["accuracy", "margin", "mean_reward"]


def load_model(path):
    import torch
    import transformers
    return transformers.AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32,
                                                                           attn_implementation="eager")


def trainer_for(model, tokenizer, rows, out_dir, eval_rows=None, **config):
    import datasets
    from trl import RewardConfig, RewardTrainer
    args = RewardConfig(output_dir=out_dir, report_to=[], use_cpu=True, save_strategy="no", logging_steps=1, disable_tqdm=True,
                        dataloader_drop_last=False, bf16=False, gradient_checkpointing=False, **config)
    return RewardTrainer(model=model, args=args, processing_class=tokenizer, train_dataset=datasets.Dataset.from_list(rows),
                         eval_dataset=datasets.Dataset.from_list(eval_rows) if eval_rows else None)


def tokens(args):
    quiet()
    import torch
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(args.tokdir)
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=2, max_position_embeddings=4096, num_labels=1)
    torch.manual_seed(0)
    model = transformers.LlamaForSequenceClassification(config)
    trainer = trainer_for(model, tok, load_rows(args.rows), os.path.join(os.path.dirname(os.path.abspath(args.out)), "trl-tokens"),
                          per_device_train_batch_size=1)
    pairs = [[ex["chosen_ids"], ex["rejected_ids"]] for ex in trainer.train_dataset]
    json.dump({"pad": model.config.pad_token_id, "pairs": pairs}, open(args.out, "w"))
    print(f"TRL: {len(pairs)} pairs, pad id {model.config.pad_token_id}")


def compare_tokens(args):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "text"))
    from chat_data_reference import read_dataset
    ref = json.load(open(args.reference))["pairs"]
    got = read_dataset(args.prefix)
    if len(got) != 2 * len(ref):
        raise SystemExit(f"{args.prefix}: {len(got)} documents, TRL kept {len(ref)} pairs")
    for i, pair in enumerate(ref):
        for half, name in enumerate(["chosen", "rejected"]):
            if got[2 * i + half][0] != pair[half]:
                raise SystemExit(f"pair {i} {name}: ids differ: TRL {pair[half]}\n dstrain {got[2 * i + half][0]}")
    print(f"{len(ref)} pairs: token ids identical to RewardTrainer's")


def make_model(args):
    quiet()
    import torch
    torch.manual_seed(args.seed)
    model = load_model(args.causal_lm)
    model.save_pretrained(args.out)
    print(f"{args.out}: {type(model).__name__}, score {tuple(model.score.weight.shape)}")


def common(args):
    return dict(per_device_train_batch_size=args.pairs, gradient_accumulation_steps=1, learning_rate=args.lr, lr_scheduler_type="constant",
                warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=args.grad_clip,
                max_length=None, seed=0, optim="adamw_torch")


def train(args):
    quiet()
    import torch
    import transformers
    torch.set_num_threads(1)
    tok = transformers.AutoTokenizer.from_pretrained(args.tokdir)
    rows = load_rows(args.rows)
    args.pairs = len(rows)
    eval_rows = load_rows(args.eval_rows) if args.eval_rows else None
    evals = dict(eval_strategy="steps", eval_steps=args.eval_steps, per_device_eval_batch_size=len(eval_rows)) if eval_rows else {}
    trainer = trainer_for(load_model(args.model), tok, rows, os.path.join(os.path.dirname(os.path.abspath(args.out)), "trl-train"),
                          eval_rows=eval_rows, **evals, **common(args), max_steps=args.steps, center_rewards_coefficient=args.center)
    losses = record_training_losses(trainer)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "accuracy" in h]
    out = [dict({"step": i + 1, "loss": losses[i], "grad_norm": h.get("grad_norm")}, **{m: h[m] for m in METRICS})
           for i, h in enumerate(steps)]
    scored = [h for h in trainer.state.log_history if "eval_loss" in h]
    evaluations = [dict({"step": h["step"], "loss": h["eval_loss"]}, **{m: h["eval_" + m] for m in METRICS}) for h in scored]
    json.dump({"pairs": len(rows), "steps": out, "evaluations": evaluations}, open(args.out, "w"), indent=1)
    print(f"TRL: {len(rows)} pairs, loss {out[0]['loss']:.6f} -> {out[-1]['loss']:.6f}, "
          f"accuracy {out[0]['accuracy']:.3f} -> {out[-1]['accuracy']:.3f} in {len(out)} steps")


def score(args):
    quiet()
    import torch
    import transformers
    torch.set_num_threads(1)
    tok = transformers.AutoTokenizer.from_pretrained(args.tokdir)
    rows = load_rows(args.rows)
    model = load_model(args.model)
    if args.adapter:  # a PEFT adapter (SEQ_CLS: its modules_to_save hold the score), merged into the base
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, args.adapter).merge_and_unload()
    saved_pad = model.config.pad_token_id
    trainer = trainer_for(model, tok, rows, os.path.join(os.path.dirname(os.path.abspath(args.out)), "trl-score"),
                          eval_rows=rows, per_device_eval_batch_size=len(rows), max_length=None)
    if not args.adapter and saved_pad != trainer.model.config.pad_token_id:  # dstrain's export writes the pad it scored before
        raise SystemExit(f"{args.model}/config.json: pad_token_id {saved_pad}, RewardTrainer's {trainer.model.config.pad_token_id}")
    h = trainer.evaluate()
    out = dict({"loss": h["eval_loss"], "pairs": len(rows)}, **{m: h["eval_" + m] for m in METRICS})
    json.dump(out, open(args.out, "w"), indent=1)
    print(f"transformers scores {args.model}: {out}")


def close(a, b, rtol, atol):
    return abs(a - b) <= atol + rtol * abs(a)


def compare(args):
    reference = json.load(open(args.reference))
    ref = reference["steps"]
    rows = list(map(json.loads, open(args.metrics)))
    got = [r for r in rows if "eval" not in r]
    if len(got) != len(ref):
        raise SystemExit(f"{args.metrics}: {len(got)} steps, TRL ran {len(ref)}")
    for r, g in zip(ref, got):
        for key in ["loss"] + METRICS:
            if not close(r[key], g[key], args.rtol, args.atol):
                raise SystemExit(f"step {r['step']} {key}: TRL {r[key]!r}, dstrain {g[key]!r}")
        if args.grad_rtol and r["grad_norm"] is not None and not close(r["grad_norm"], g["grad_norm"], args.grad_rtol, 0):
            raise SystemExit(f"step {r['step']} grad_norm: TRL {r['grad_norm']!r}, dstrain {g['grad_norm']!r}")
    print(f"{len(ref)} steps: loss and {', '.join(METRICS)} equal RewardTrainer's")
    if args.eval:
        scored = [r for r in rows if r.get("eval") == args.eval]
        want = reference.get("evaluations", [])
        if not want or [r["step"] for r in scored] != [e["step"] for e in want]:
            raise SystemExit(f"evaluations of {args.eval} at steps {[r['step'] for r in scored]}, TRL's at {[e['step'] for e in want]}")
        for e, g in zip(want, scored):
            for key, got_key in [("loss", "val_loss")] + [(m, m) for m in METRICS]:
                if not close(e[key], g[got_key], args.rtol, args.atol):
                    raise SystemExit(f"evaluation at step {e['step']} {key}: TRL {e[key]!r}, dstrain {g[got_key]!r}")
        print(f"{len(want)} evaluations of {scored[0]['pairs']} held-out pairs equal RewardTrainer's evaluate()")


def parser():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("tokens")
    p.add_argument("tokdir"), p.add_argument("rows"), p.add_argument("out")
    p = sub.add_parser("compare-tokens")
    p.add_argument("reference"), p.add_argument("prefix")
    p = sub.add_parser("model")
    p.add_argument("causal_lm"), p.add_argument("out"), p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("train")
    p.add_argument("model"), p.add_argument("tokdir"), p.add_argument("rows"), p.add_argument("out")
    p.add_argument("--steps", type=int, required=True), p.add_argument("--lr", type=float, required=True)
    p.add_argument("--center", type=float, default=None), p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--eval-rows"), p.add_argument("--eval-steps", type=int, default=0)
    p = sub.add_parser("score")
    p.add_argument("model"), p.add_argument("tokdir"), p.add_argument("rows"), p.add_argument("out"), p.add_argument("--adapter")
    p = sub.add_parser("compare")
    p.add_argument("reference"), p.add_argument("metrics")
    p.add_argument("--rtol", type=float, default=1e-5), p.add_argument("--atol", type=float, default=1e-7)
    p.add_argument("--grad-rtol", type=float, default=0), p.add_argument("--eval")
    p = sub.add_parser("many")
    p.add_argument("commands")
    return ap


def run(args):
    commands = {"tokens": tokens, "compare-tokens": compare_tokens, "model": make_model, "train": train, "score": score, "compare": compare,
                "many": many}
    commands[args.cmd](args)


def many(args):
    for line in open(args.commands, encoding="utf-8"):
        if line.strip():
            run(parser().parse_args(shlex.split(line)))


def main():
    run(parser().parse_args())


if __name__ == "__main__":
    main()
