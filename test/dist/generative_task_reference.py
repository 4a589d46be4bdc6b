#!/usr/bin/env python3
"""lm-evaluation-harness 0.4's generate_until and exact_match as the reference for generative
`dstrain eval --task` rows (issue 61).

  generative_task_reference.py rows CORPUS.jsonl OUT.jsonl --count N [--seed S] [--gsm8k]
      contexts from the corpus' text (numbers among the words, some ending in spaces or a
      newline); dstrain rows {"context", "target"} after a settings line (until "\\n\\n" and
      "Question:", 40 tokens, a regex with two groups picked from the end, ignore_case,
      ignore_punctuation, a regex to ignore), or --gsm8k rows {"question", "answer"} as downloaded
  generative_task_reference.py score MODEL_DIR TOKDIR ROWS.jsonl OUT.json [--gsm8k] [--batch-size N]
      (the TRL overlay's python, which has lm_eval) each row through HFLM.generate_until on the
      model in fp32 on the CPU (batch size N, default 1; greedy; --threads T, default 1), with the
      settings as gen_kwargs, or
      with the gsm8k task's own YAML (lm_eval/tasks/gsm8k/gsm8k.yaml: its doc_to_text, until,
      filters and exact_match options); then lm-eval's RegexFilter and exact_match on each text;
      "seconds": generate_until's (the benchmark's lm-eval column)
  generative_task_reference.py retarget ROWS.jsonl REF.json OUT.jsonl OUT_REF.json [--gsm8k]
      the rows with every other target set to what lm-eval answered for it (so that exact_match is
      neither 0 nor 1), and their reference: the same texts graded against the new targets
  generative_task_reference.py compare REF.json RESULT.json SAMPLES.jsonl --name NAME
      dstrain's exact_match (and the flexible one) equal lm-eval's, and every row's text and
      answers are lm-eval's
"""
import argparse
import json
import os
import random

SETTINGS = {"until": ["\n\n", "Question:"], "max_gen_toks": 40, "regex_pattern": r"(\d+)|([A-Za-z]{3,})", "group_select": -1,
            "ignore_case": True, "ignore_punctuation": True, "regexes_to_ignore": [r"^\s*the\s+"]}


def words_of(corpus):
    words = []
    for line in open(corpus, encoding="utf-8"):
        words += json.loads(line).get("text", "").split()
        if len(words) > 20000:
            break
    return [w for w in words if w.isprintable()] or ["alpha", "beta"]


def make_rows(args):
    rng = random.Random(args.seed)
    words = words_of(args.corpus) + [str(n) for n in range(100)]
    with open(args.out, "w", encoding="utf-8") as out:
        if not args.gsm8k:
            out.write(json.dumps({"settings": SETTINGS}) + "\n")
        for i in range(args.count):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(4, 20)))
            if args.gsm8k:
                row = {"question": text + "?", "answer": f"{text} <<2*3=6>> so #### {rng.randint(0, 99)}"}
            else:
                row = {"context": text + rng.choice(["", " ", "\n", ":"]), "target": rng.choice(words)}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


def gsm8k_config():
    import lm_eval
    import yaml
    path = os.path.join(os.path.dirname(lm_eval.__file__), "tasks", "gsm8k", "gsm8k.yaml")
    return yaml.safe_load(open(path))


def task_of(rows, gsm8k):
    """(contexts, gen_kwargs, filters [(name, regex, group_select)], metric options) as lm-eval makes them."""
    from lm_eval.utils import apply_template
    if gsm8k:
        cfg = gsm8k_config()
        contexts = [apply_template(cfg["doc_to_text"], row) for row in rows]
        targets = [apply_template(cfg["doc_to_target"], row) for row in rows]
        gen = dict(cfg["generation_kwargs"])
        filters = []
        for f in cfg["filter_list"]:
            regex = f["filter"][0]
            filters.append((f["name"], regex["regex_pattern"], regex.get("group_select", 0)))
        metric = {k: v for k, v in cfg["metric_list"][0].items() if k in ("ignore_case", "ignore_punctuation", "regexes_to_ignore")}
        return contexts, targets, gen, filters, metric
    settings = rows[0]["settings"]
    rows = rows[1:]
    gen = {"until": settings["until"], "max_gen_toks": settings["max_gen_toks"], "do_sample": False, "temperature": 0.0}
    filters = [("exact_match", settings["regex_pattern"], settings["group_select"])]
    metric = {k: settings[k] for k in ("ignore_case", "ignore_punctuation", "regexes_to_ignore")}
    return [r["context"] for r in rows], [r["target"] for r in rows], gen, filters, metric


def lm_eval_exact_match():
    """lm_eval.api.metrics.exact_match_hf_evaluate, its own source: the module imports sacrebleu,
    which the overlay leaves out (scripts/versions.sh), so the one function is taken from the file."""
    import ast
    import lm_eval
    import numpy as np
    import re
    import string
    path = os.path.join(os.path.dirname(lm_eval.__file__), "api", "metrics.py")
    tree = ast.parse(open(path).read())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "exact_match_hf_evaluate")
    scope = {"np": np, "re": re, "string": string}
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), scope)
    return scope["exact_match_hf_evaluate"]


def grade(texts, rows, gsm8k):
    """lm-eval's RegexFilter and exact_match on each text against its row's target."""
    from lm_eval.filters.extraction import RegexFilter
    exact_match_hf_evaluate = lm_eval_exact_match()
    _, targets, _, filters, metric = task_of(rows, gsm8k)
    out = {"n": len(texts), "texts": texts, "answers": {}, "scores": {}}
    for name, regex, group in filters:
        answers = [a[0] for a in RegexFilter(regex_pattern=regex, group_select=group).apply([[t] for t in texts], [{}] * len(texts))]
        per_row = [int(exact_match_hf_evaluate([a], [t], **metric)["exact_match"]) for a, t in zip(answers, targets)]
        key = "exact_match" if name in ("exact_match", "strict-match") else "exact_match_flexible"
        out["answers"][key], out["scores"][key] = answers, per_row
        out[key] = float(sum(per_row) / len(per_row))
    return out


def score(args):
    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    import time
    torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in open(args.rows, encoding="utf-8") if line.strip()]
    contexts, _, gen, _, _ = task_of(rows, args.gsm8k)
    lm = HFLM(pretrained=args.model, tokenizer=args.tokdir, device="cpu", dtype="float32", batch_size=args.batch_size)
    requests = [Instance(request_type="generate_until", doc={}, arguments=(c, dict(gen)), idx=0, metadata=("task", i, 1))
                for i, c in enumerate(contexts)]
    start = time.perf_counter()
    texts = lm.generate_until(requests, disable_tqdm=True)
    seconds = time.perf_counter() - start
    out = grade(texts, rows, args.gsm8k)
    out["seconds"] = seconds
    json.dump(out, open(args.out, "w"), indent=1, ensure_ascii=False)
    print(f"lm-eval: {out['n']} rows, " + ", ".join(f"{k} {out[k]:.4f}" for k in out["scores"]))


def retarget(args):
    ref = json.load(open(args.reference))
    lines = [line for line in open(args.rows, encoding="utf-8") if line.strip()]
    head = [] if args.gsm8k else lines[:1]
    rows = [json.loads(line) for line in lines[len(head):]]
    key = "exact_match_flexible" if args.gsm8k else "exact_match"
    for i, row in enumerate(rows):
        answer = ref["answers"][key][i]
        if i % 2 == 0 and answer != "[invalid]":
            if args.gsm8k:
                row["answer"] = row["answer"].rsplit("#### ", 1)[0] + "#### " + answer
            else:
                row["target"] = "the " + answer.upper()  # regexes_to_ignore and ignore_case make it the answer
    with open(args.out, "w", encoding="utf-8") as out:
        out.writelines(head)
        out.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    rows = [json.loads(line) for line in open(args.out, encoding="utf-8") if line.strip()]
    json.dump(grade(ref["texts"], rows, args.gsm8k), open(args.out_reference, "w"), indent=1, ensure_ascii=False)


def compare(args):
    ref = json.load(open(args.reference))
    result = json.load(open(args.result))
    task = [t for t in result["tasks"] if t["name"] == args.name]
    if not task:
        raise SystemExit(f"{args.result}: no task {args.name}")
    task = task[0]
    samples = [json.loads(line) for line in open(args.samples, encoding="utf-8") if json.loads(line)["task"] == args.name]
    if len(samples) != ref["n"] or task["n"] != ref["n"]:
        raise SystemExit(f"{len(samples)} samples and n {task['n']} of {args.name}, lm-eval generated {ref['n']} rows")
    for i, (want, got) in enumerate(zip(ref["texts"], samples)):
        if want != got["generation"]:
            raise SystemExit(f"row {i}: lm-eval generated {want!r}, dstrain {got['generation']!r}")
        for key in ref["scores"]:
            if got["answers"][key] != ref["answers"][key][i] or got["scores"][key] != ref["scores"][key][i]:
                raise SystemExit(f"row {i} {key}: lm-eval {ref['answers'][key][i]!r} ({ref['scores'][key][i]}), "
                                 f"dstrain {got['answers'][key]!r} ({got['scores'][key]})")
    for key in ref["scores"]:
        if task[key] != ref[key]:
            raise SystemExit(f"{key}: lm-eval {ref[key]!r}, dstrain {task[key]!r}")
    print(f"{args.name}: {ref['n']} rows as lm-eval's, " + ", ".join(f"{k} {ref[k]:.4f}" for k in ref["scores"]))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rows")
    r.add_argument("corpus"), r.add_argument("out")
    r.add_argument("--count", type=int, default=12), r.add_argument("--seed", type=int, default=0)
    r.add_argument("--gsm8k", action="store_true")
    s = sub.add_parser("score")
    s.add_argument("model"), s.add_argument("tokdir"), s.add_argument("rows"), s.add_argument("out")
    s.add_argument("--gsm8k", action="store_true")
    s.add_argument("--batch-size", type=int, default=1)
    s.add_argument("--threads", type=int, default=1)
    t = sub.add_parser("retarget")
    t.add_argument("rows"), t.add_argument("reference"), t.add_argument("out"), t.add_argument("out_reference")
    t.add_argument("--gsm8k", action="store_true")
    c = sub.add_parser("compare")
    c.add_argument("reference"), c.add_argument("result"), c.add_argument("samples")
    c.add_argument("--name", required=True)
    args = p.parse_args()
    {"rows": make_rows, "score": score, "retarget": retarget, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    main()
