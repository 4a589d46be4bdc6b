#!/usr/bin/env python3
"""lm-evaluation-harness 0.4's HFLM as the reference for `dstrain eval --task` (issue 61).

  choice_task_reference.py rows CORPUS.jsonl OUT.jsonl --count N [--seed S]
      multiple-choice rows {"context", "choices", "gold"} from the corpus' text: 2 to 5 choices,
      contexts with trailing spaces or newlines, an empty context, non-ASCII choices
  choice_task_reference.py score MODEL_DIR TOKDIR ROWS.jsonl OUT.json
      (the TRL overlay's python, which has lm_eval) each row's requests (context, " " + choice), as
      lm-eval's multiple_choice tasks make them with target_delimiter " ", through
      HFLM.loglikelihood on the model in fp32 on the CPU; acc and acc_norm as its
      ConfigurableTask.process_results computes them (argmax of the log-likelihoods, and of each
      divided by its choice's length in characters)
  choice_task_reference.py raw KIND CORPUS.jsonl OUT.jsonl --count N [--seed S]
      rows as the datasets are downloaded (KIND hellaswag, arc or mmlu), with their quirks: WikiHow's
      [title] and [step] brackets, double spaces, lower-case ctx_b, labels as strings, ARC's numeric
      answer keys
  choice_task_reference.py convert KIND RAW.jsonl OUT.jsonl
      (the TRL overlay's python) the rows as lm-eval's task definitions turn them into prompts:
      hellaswag's utils.process_docs, arc_easy's and mmlu's doc_to_text, doc_to_choice and
      doc_to_target templates (its YAML files) rendered by lm_eval.utils.apply_template
  choice_task_reference.py compare OUT.json RESULT.json SAMPLES.jsonl --name NAME [--rtol R]
      dstrain's acc, acc_norm (exactly) and every request's log-likelihood (rtol) against them
"""
import argparse
import json
import random
import sys


def make_rows(args):
    rng = random.Random(args.seed)
    words = []
    for line in open(args.corpus, encoding="utf-8"):
        words += json.loads(line).get("text", "").split()
        if len(words) > 20000:
            break
    words = [w for w in words if w.isprintable()] or ["alpha", "beta", "gamma"]
    extra = ["café", "naïve", "日本語", "Ünïcödé", "x"]
    with open(args.out, "w", encoding="utf-8") as out:
        for i in range(args.count):
            context = " ".join(rng.choice(words) for _ in range(rng.randint(3, 25)))
            context += rng.choice(["", " ", "  ", "\n", ":", "? "])
            if i == 3:
                context = ""  # lm-eval conditions on the prefix token alone
            choices = [" ".join(rng.choice(words + extra) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(2, 5))]
            out.write(json.dumps({"context": context, "choices": choices, "gold": rng.randrange(len(choices))}, ensure_ascii=False) + "\n")


def make_raw(args):
    rng = random.Random(args.seed)
    words = [w for line in open(args.corpus, encoding="utf-8") for w in json.loads(line).get("text", "").split()][:20000]
    words = [w for w in words if w.isprintable() and "[" not in w and "]" not in w] or ["alpha", "beta"]
    text = lambda lo, hi: " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))
    ascii_words = [w for w in words if w.isascii()] or ["alpha"]  # str.capitalize() beyond ASCII is not dstrain's (documented)
    ascii_text = lambda lo, hi: " ".join(rng.choice(ascii_words) for _ in range(rng.randint(lo, hi)))
    with open(args.out, "w", encoding="utf-8") as out:
        for i in range(args.count):
            if args.kind == "hellaswag":
                row = {"activity_label": text(1, 3), "ctx_a": text(3, 12) + (" [title] " + text(1, 3) if i % 3 == 0 else ""),
                       "ctx_b": ascii_text(1, 5).upper() if i % 2 else ascii_text(1, 5),
                       "endings": [text(2, 8) + (" [step] " + text(1, 2) if i % 4 == 0 else "") + ("  " + text(1, 2) if i % 5 == 0 else "")
                                   for _ in range(4)],
                       "label": str(rng.randrange(4))}
            elif args.kind == "arc":
                n = rng.randint(3, 5)
                labels = [str(k + 1) for k in range(n)] if i % 3 == 0 else list("ABCDE"[:n])
                row = {"question": text(5, 20) + "?", "choices": {"text": [text(1, 5) for _ in range(n)], "label": labels},
                       "answerKey": rng.choice(labels)}
            else:
                row = {"question": ("  " if i % 2 else "") + text(5, 20) + ("\n" if i % 3 == 0 else ""),
                       "choices": [text(1, 4) for _ in range(4)], "answer": rng.randrange(4), "subject": "x"}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


def convert(args):
    import ast
    import os
    import datasets
    import yaml
    import lm_eval
    from lm_eval.utils import apply_template
    rows = [json.loads(line) for line in open(args.raw, encoding="utf-8") if line.strip()]
    tasks = os.path.join(os.path.dirname(lm_eval.__file__), "tasks")
    if args.kind == "hellaswag":
        sys.path.insert(0, os.path.join(tasks, "hellaswag"))
        from utils import process_docs
        docs = process_docs(datasets.Dataset.from_list(rows))
        out = [{"context": d["query"], "choices": d["choices"], "gold": d["gold"]} for d in docs]
    else:
        path = os.path.join(tasks, "arc", "arc_easy.yaml") if args.kind == "arc" else os.path.join(tasks, "mmlu", "default",
                                                                                                      "_default_template_yaml")
        config = yaml.safe_load(open(path))
        out = []
        for doc in rows:
            choice = config["doc_to_choice"]
            choices = ast.literal_eval(apply_template(choice, doc)) if isinstance(choice, str) else choice
            target = config["doc_to_target"]
            gold = int(apply_template(target, doc)) if "{{" in target else doc[target]
            out.append({"context": apply_template(config["doc_to_text"], doc), "choices": choices, "gold": gold})
    with open(args.out, "w", encoding="utf-8") as f:
        for row in out:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"lm-eval's {args.kind} prompts: {len(out)} rows")


def score(args):
    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    torch.set_num_threads(1)
    rows = [json.loads(line) for line in open(args.rows, encoding="utf-8") if line.strip()]
    lm = HFLM(pretrained=args.model, tokenizer=args.tokdir, device="cpu", dtype="float32", batch_size=1)
    requests = [Instance(request_type="loglikelihood", doc=row, arguments=(row["context"], " " + choice), idx=c,
                         metadata=("task", i, 1))
                for i, row in enumerate(rows) for c, choice in enumerate(row["choices"])]
    results = lm.loglikelihood(requests, disable_tqdm=True)
    at, acc, acc_norm, lls_all = 0, 0.0, 0.0, []
    import numpy as np
    for row in rows:
        lls = np.array([r[0] for r in results[at:at + len(row["choices"])]])
        at += len(row["choices"])
        completion_len = np.array([float(len(c)) for c in row["choices"]])  # process_results' lengths
        acc += 1.0 if np.argmax(lls) == row["gold"] else 0.0
        acc_norm += 1.0 if np.argmax(lls / completion_len) == row["gold"] else 0.0
        lls_all.append(lls.tolist())
    out = {"acc": acc / len(rows), "acc_norm": acc_norm / len(rows), "n": len(rows), "loglikelihoods": lls_all,
           "max_length": lm.max_length}
    json.dump(out, open(args.out, "w"), indent=1)
    print(f"lm-eval: {len(rows)} rows, acc {out['acc']:.4f}, acc_norm {out['acc_norm']:.4f} (max_length {lm.max_length})")


def compare(args):
    ref = json.load(open(args.reference))
    result = json.load(open(args.result))
    task = [t for t in result["tasks"] if t["name"] == args.name]
    if not task:
        raise SystemExit(f"{args.result}: no task {args.name}")
    task = task[0]
    for key in ("acc", "acc_norm", "n"):
        if task[key] != ref[key]:
            raise SystemExit(f"{key}: lm-eval {ref[key]!r}, dstrain {task[key]!r}")
    samples = [json.loads(line) for line in open(args.samples) if json.loads(line)["task"] == args.name]
    if len(samples) != len(ref["loglikelihoods"]):
        raise SystemExit(f"{len(samples)} samples of {args.name}, lm-eval scored {len(ref['loglikelihoods'])} rows")
    worst = 0.0
    for i, (want, got) in enumerate(zip(ref["loglikelihoods"], samples)):
        if got["index"] != i or len(got["loglikelihoods"]) != len(want):
            raise SystemExit(f"row {i}: dstrain's sample {got}")
        for w, g in zip(want, got["loglikelihoods"]):
            worst = max(worst, abs(w - g) / max(abs(w), 1e-12))
            if abs(w - g) > args.rtol * abs(w) + 1e-6:
                raise SystemExit(f"row {i}: log-likelihoods lm-eval {want}, dstrain {got['loglikelihoods']}")
    print(f"{args.name}: acc {task['acc']:.4f} and acc_norm {task['acc_norm']:.4f} equal lm-eval's on {task['n']} rows; "
          f"every request's log-likelihood within {worst:.1e}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("rows")
    p.add_argument("corpus"), p.add_argument("out"), p.add_argument("--count", type=int, default=40), p.add_argument("--seed", type=int, default=1)
    p = sub.add_parser("raw")
    p.add_argument("kind", choices=["hellaswag", "arc", "mmlu"]), p.add_argument("corpus"), p.add_argument("out")
    p.add_argument("--count", type=int, default=20), p.add_argument("--seed", type=int, default=1)
    p = sub.add_parser("convert")
    p.add_argument("kind", choices=["hellaswag", "arc", "mmlu"]), p.add_argument("raw"), p.add_argument("out")
    p = sub.add_parser("score")
    p.add_argument("model"), p.add_argument("tokdir"), p.add_argument("rows"), p.add_argument("out")
    p = sub.add_parser("compare")
    p.add_argument("reference"), p.add_argument("result"), p.add_argument("samples"), p.add_argument("--name", required=True)
    p.add_argument("--rtol", type=float, default=1e-5)
    args = ap.parse_args()
    {"rows": make_rows, "raw": make_raw, "convert": convert, "score": score, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
