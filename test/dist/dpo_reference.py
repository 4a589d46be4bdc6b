#!/usr/bin/env python3
"""TRL 1.16 as the reference for train.objective dpo and prepare-data --preference (issue 60).
Run with the TRL overlay's python ($DSTRAIN_TRL_VENV, scripts/setup.sh --test).

  dpo_reference.py pairs CORPUS.jsonl OUT.jsonl --count N [--seed S] [--kind chat|text|implicit|think]
      N preference rows from the corpus texts in TRL's formats: chat (prompt/chosen/rejected lists of
      messages, some with a system prompt and earlier turns), text (strings), implicit (chosen and
      rejected whole conversations sharing the prompt), think (assistant turns that open with
      <think>...</think>, for R1-style templates)
  dpo_reference.py tokens TOKDIR ROWS.jsonl OUT.json [--max-length N] [--keep-end]
      what TRL's DPOTrainer makes of each row (its dataset map, then its collator's truncation):
      per pair the chosen and rejected input ids and completion masks
  dpo_reference.py tokens-many SPECS.jsonl
      the same for each line {"tokdir", "rows", "out", "max_length", "keep_end"} in one process (one import of TRL)
  dpo_reference.py compare-tokens OUT.json PREFIX
      dstrain's set (documents 2i, 2i + 1 and the loss mask) against them, pair by pair
  dpo_reference.py train MODEL TOKDIR ROWS.jsonl OUT.json --steps N --lr LR [--beta B] [--loss-type T ...]
          [--loss-weights W ...] [--label-smoothing E] [--grad-clip C] [--ld-alpha L] [--use-weighting]
      [--eval-rows ROWS.jsonl --eval-steps K] [--sync-steps S [--mixup-alpha A]]
      DPOTrainer on the rows (--sync-steps: TR-DPO's sync_ref_model), every step the whole set (one batch: the order does not matter), AdamW
      without weight decay, a constant LR, fp32 on the CPU; writes each step's loss (as computed,
      before rounding) and TRL's metrics, and with --eval-rows its evaluate() every K steps
  dpo_reference.py train-many MODEL TOKDIR ROWS.jsonl RUNS.json --steps N --lr LR
      the same for each run of RUNS.json ({"NAME": {"loss_type": [...], "loss_weights": [...] or null, "beta": B,
      "label_smoothing": E, "discopop_tau": T, "f_divergence_type": F, "f_alpha": A, "ld_alpha": L, "use_weighting": W,
      "eval_rows": ROWS.jsonl, "eval_steps": K}, ...}) in one process, writing NAME.trl.json beside RUNS.json
  dpo_reference.py compare OUT.json METRICS.jsonl --rtol R [--atol A] [--eval NAME]
      dstrain's per-step loss and preference metrics against TRL's (and evaluation set NAME's rows
      against TRL's evaluations)
"""
import argparse
import json
import os
import random
import sys

METRICS = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected",
           "logits/chosen", "logits/rejected"]


def snippets(corpus, rng, count):
    texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
    texts = [t for t in texts if t.strip()]
    out = []
    for _ in range(count):
        t = rng.choice(texts)
        start = rng.randrange(max(1, len(t) - 40))
        out.append(t[start:start + rng.randint(6, 30)])
    return out


def make_pairs(args):
    rng = random.Random(args.seed)
    rows = []
    for i in range(args.count):
        user, good, bad, sys_text, earlier = snippets(args.corpus, rng, 5)
        if args.kind == "think":
            good, bad = f"<think>\n{sys_text}\n</think>\n\n{good}", f"<think>\n{earlier}\n</think>\n\n{bad}"
        if good == bad:
            bad += " no"
        if args.kind == "text":
            rows.append({"prompt": user, "chosen": " " + good, "rejected": " " + bad})
            continue
        prompt = []
        if i % 3 == 0 and args.kind != "think":
            prompt.append({"role": "system", "content": sys_text})
        if i % 4 == 1:
            prompt += [{"role": "user", "content": earlier}, {"role": "assistant", "content": sys_text}]
        prompt.append({"role": "user", "content": user})
        chosen, rejected = [{"role": "assistant", "content": good}], [{"role": "assistant", "content": bad}]
        rows.append({"chosen": prompt + chosen, "rejected": prompt + rejected} if args.kind == "implicit" else
                    {"prompt": prompt, "chosen": chosen, "rejected": rejected})
    with open(args.out, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def quiet():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import datasets
    datasets.disable_progress_bars()


def load_rows(path):
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


def tiny_model(vocab):
    import torch
    import transformers
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=2, max_position_embeddings=4096)
    return transformers.LlamaForCausalLM(config)


def trainer_for(model, ref_model, tokenizer, rows, out_dir, eval_rows=None, **config):
    import datasets
    from trl import DPOConfig, DPOTrainer
    args = DPOConfig(output_dir=out_dir, report_to=[], use_cpu=True, save_strategy="no", logging_steps=1, disable_tqdm=True,
                     dataloader_drop_last=False, remove_unused_columns=False, bf16=False, **config)
    return DPOTrainer(model=model, ref_model=ref_model, args=args, processing_class=tokenizer, train_dataset=datasets.Dataset.from_list(rows),
                      eval_dataset=datasets.Dataset.from_list(eval_rows) if eval_rows else None)


def record_training_losses(trainer):
    """The loss of each training step as compute_loss returns it (before any rounding in the logs), not evaluate()'s."""
    losses = []
    compute = trainer.compute_loss

    def recorded(*a, **k):
        loss = compute(*a, **k)
        if trainer.model.training:
            losses.append((loss[0] if isinstance(loss, tuple) else loss).item())
        return loss

    trainer.compute_loss = recorded
    return losses


def tokens_many(args):
    for line in open(args.specs, encoding="utf-8"):
        if line.strip():
            spec = json.loads(line)
            tokens(argparse.Namespace(tokdir=spec["tokdir"], rows=spec["rows"], out=spec["out"], max_length=spec.get("max_length"),
                                      keep_end=spec.get("keep_end", False)))


def tokens(args):
    quiet()
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(args.tokdir)
    rows = load_rows(args.rows)
    trainer = trainer_for(tiny_model(len(tok)), tiny_model(len(tok)), tok, rows, os.path.join(os.path.dirname(os.path.abspath(args.out)), "trl-tokens"),
                          max_length=args.max_length, truncation_mode="keep_end" if args.keep_end else "keep_start",
                          per_device_train_batch_size=1)
    out = []
    for ex in trainer.train_dataset:
        batch = trainer.data_collator.torch_call([ex])
        pair = []
        for r in range(2):
            n = int(batch["attention_mask"][r].sum())
            pair.append({"ids": batch["input_ids"][r][:n].tolist(), "mask": batch["completion_mask"][r][:n].tolist()})
        out.append(pair)
    json.dump({"rows": len(rows), "pairs": out}, open(args.out, "w"))
    print(f"TRL kept {len(out)} of {len(rows)} rows")


def compare_tokens(args):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "text"))
    from chat_data_reference import read_dataset
    ref = json.load(open(args.reference))["pairs"]
    got = read_dataset(args.prefix)
    if len(got) != 2 * len(ref):
        raise SystemExit(f"{args.prefix}: {len(got)} documents, TRL kept {len(ref)} pairs")
    for i, pair in enumerate(ref):
        for half, name in enumerate(["chosen", "rejected"]):
            ids, mask = got[2 * i + half]
            if ids != pair[half]["ids"]:
                raise SystemExit(f"pair {i} {name}: ids differ: TRL {pair[half]['ids']}\n dstrain {ids}")
            if list(mask) != pair[half]["mask"]:
                raise SystemExit(f"pair {i} {name}: completion masks differ: TRL {pair[half]['mask']}\n dstrain {list(mask)}")
    print(f"{len(ref)} pairs: token ids and completion masks identical to TRL's")


def sync_of(args):
    """TR-DPO: the reference moved toward the policy every --sync-steps steps (SyncRefModelCallback)."""
    steps = getattr(args, "sync_steps", None)
    return dict(sync_ref_model=True, ref_model_sync_steps=steps, ref_model_mixup_alpha=args.mixup_alpha) if steps else {}


def train(args):
    quiet()
    import torch
    import transformers
    torch.set_num_threads(1)
    if args.cmd == "train-many":
        runs = json.load(open(args.runs))
        for name, run in runs.items():
            one = argparse.Namespace(**vars(args))
            one.cmd, one.out = "train", os.path.join(os.path.dirname(os.path.abspath(args.runs)), name + ".trl.json")
            one.loss_type, one.loss_weights, one.steps = run["loss_type"], run.get("loss_weights"), run.get("steps", args.steps)
            one.beta, one.label_smoothing = run.get("beta", 0.1), run.get("label_smoothing", 0.0)
            one.eval_rows, one.eval_steps = run.get("eval_rows"), run.get("eval_steps", 0)
            one.discopop_tau = run.get("discopop_tau", 0.05)
            one.f_divergence_type, one.f_alpha_divergence_coef = run.get("f_divergence_type", "reverse_kl"), run.get("f_alpha", 0.5)
            one.ld_alpha, one.use_weighting = run.get("ld_alpha"), run.get("use_weighting", False)
            train(one)
        return
    tok = transformers.AutoTokenizer.from_pretrained(args.tokdir)
    load = dict(dtype=torch.float32, attn_implementation="eager")
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, **load)
    ref = transformers.AutoModelForCausalLM.from_pretrained(args.model, **load)
    rows = load_rows(args.rows)
    # Held-out pairs scored every eval_steps steps in one batch (TRL averages its metrics over batches).
    eval_rows = load_rows(args.eval_rows) if args.eval_rows else None
    evals = dict(eval_strategy="steps", eval_steps=args.eval_steps, per_device_eval_batch_size=len(eval_rows)) if eval_rows else {}
    trainer = trainer_for(model, ref, tok, rows, os.path.join(os.path.dirname(os.path.abspath(args.out)), "trl-train"), eval_rows=eval_rows,
                          **evals, per_device_train_batch_size=len(rows), gradient_accumulation_steps=1, max_steps=args.steps,
                          learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9,
                          adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=args.grad_clip, beta=args.beta, loss_type=args.loss_type,
                          loss_weights=args.loss_weights, label_smoothing=args.label_smoothing, discopop_tau=args.discopop_tau,
                          f_divergence_type=args.f_divergence_type, f_alpha_divergence_coef=args.f_alpha_divergence_coef,
                          ld_alpha=args.ld_alpha, use_weighting=args.use_weighting,
                          max_length=None, seed=0, **sync_of(args),
                          optim="adamw_torch")
    losses = record_training_losses(trainer)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "rewards/chosen" in h]
    out = []
    for i, h in enumerate(steps):
        row = {"step": i + 1, "loss": losses[i], "grad_norm": h.get("grad_norm")}
        row.update({m: h[m] for m in METRICS})
        out.append(row)
    scored = [h for h in trainer.state.log_history if "eval_loss" in h]
    evaluations = [dict({"step": h["step"], "loss": h["eval_loss"]}, **{m: h["eval_" + m] for m in METRICS}) for h in scored]
    json.dump({"pairs": len(rows), "steps": out, "evaluations": evaluations}, open(args.out, "w"), indent=1)
    print(f"TRL: {len(rows)} pairs, loss {out[0]['loss']:.6f} -> {out[-1]['loss']:.6f}, "
          f"rewards/accuracies {out[0]['rewards/accuracies']:.3f} -> {out[-1]['rewards/accuracies']:.3f} in {len(out)} steps")


def compare(args):
    reference = json.load(open(args.reference))
    ref = reference["steps"]
    rows = list(map(json.loads, open(args.metrics)))
    got = [r for r in rows if "eval" not in r]
    if len(got) != len(ref):
        raise SystemExit(f"{args.metrics}: {len(got)} steps, TRL ran {len(ref)}")
    worst = 0.0
    for r, g in zip(ref, got):
        for key in ["loss"] + METRICS:
            a, b = r[key], g[key]
            err = abs(a - b)
            if err > args.atol + args.rtol * abs(a):
                raise SystemExit(f"step {r['step']} {key}: TRL {a!r}, dstrain {b!r} (differ by {err:.3g})")
            worst = max(worst, err / max(abs(a), 1e-12) if abs(a) > args.atol else 0.0)
        if args.grad_rtol and r["grad_norm"] is not None and abs(r["grad_norm"] - g["grad_norm"]) > args.grad_rtol * abs(r["grad_norm"]):
            raise SystemExit(f"step {r['step']} grad_norm: TRL {r['grad_norm']!r}, dstrain {g['grad_norm']!r}")
    print(f"{len(ref)} steps: loss and {len(METRICS)} metrics equal TRL's (largest relative difference {worst:.2g})")
    if args.eval:  # the held-out set's rows against TRL's evaluate() at the same steps
        scored = [r for r in rows if r.get("eval") == args.eval]
        want = reference.get("evaluations", [])
        if not want or [r["step"] for r in scored] != [e["step"] for e in want]:
            raise SystemExit(f"{args.metrics}: evaluations of {args.eval} at steps {[r['step'] for r in scored]}, TRL's at "
                             f"{[e['step'] for e in want]}")
        for e, g in zip(want, scored):
            for key, got_key in [("loss", "val_loss")] + [(m, m) for m in METRICS]:
                if abs(e[key] - g[got_key]) > args.atol + args.rtol * abs(e[key]):
                    raise SystemExit(f"evaluation at step {e['step']} {key}: TRL {e[key]!r}, dstrain {g[got_key]!r}")
        print(f"{len(want)} evaluations of {scored[0]['pairs']} held-out pairs: loss and {len(METRICS)} metrics equal TRL's evaluate()")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pairs")
    p.add_argument("corpus"), p.add_argument("out"), p.add_argument("--count", type=int, default=64), p.add_argument("--seed", type=int, default=3)
    p.add_argument("--kind", choices=["chat", "text", "implicit", "think"], default="chat")
    p = sub.add_parser("tokens")
    p.add_argument("tokdir"), p.add_argument("rows"), p.add_argument("out")
    p.add_argument("--max-length", type=int, default=None), p.add_argument("--keep-end", action="store_true")
    p = sub.add_parser("tokens-many")
    p.add_argument("specs")
    p = sub.add_parser("compare-tokens")
    p.add_argument("reference"), p.add_argument("prefix")
    p = sub.add_parser("train")
    p.add_argument("model"), p.add_argument("tokdir"), p.add_argument("rows"), p.add_argument("out")
    p.add_argument("--steps", type=int, required=True), p.add_argument("--lr", type=float, required=True)
    p.add_argument("--beta", type=float, default=0.1), p.add_argument("--loss-type", nargs="+", default=["sigmoid"])
    p.add_argument("--loss-weights", nargs="+", type=float, default=None), p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--eval-rows", default=None), p.add_argument("--eval-steps", type=int, default=0)
    p.add_argument("--discopop-tau", type=float, default=0.05)
    p.add_argument("--f-divergence-type", default="reverse_kl"), p.add_argument("--f-alpha-divergence-coef", type=float, default=0.5)
    p.add_argument("--ld-alpha", type=float, default=None), p.add_argument("--use-weighting", action="store_true")
    p.add_argument("--sync-steps", type=int, default=None, help="TR-DPO: sync_ref_model every this many steps")
    p.add_argument("--mixup-alpha", type=float, default=0.6, help="TR-DPO: ref_model_mixup_alpha")
    p = sub.add_parser("train-many")
    p.add_argument("model"), p.add_argument("tokdir"), p.add_argument("rows"), p.add_argument("runs")
    p.add_argument("--steps", type=int, required=True), p.add_argument("--lr", type=float, required=True)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p = sub.add_parser("compare")
    p.add_argument("reference"), p.add_argument("metrics"), p.add_argument("--rtol", type=float, required=True)
    p.add_argument("--atol", type=float, default=1e-6), p.add_argument("--grad-rtol", type=float, default=0.0)
    p.add_argument("--eval", default=None, help="also compare this evaluation set's rows with TRL's evaluations")
    args = ap.parse_args()
    {"pairs": make_pairs, "tokens": tokens, "tokens-many": tokens_many, "compare-tokens": compare_tokens, "train": train, "train-many": train, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    main()
