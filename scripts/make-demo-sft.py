#!/usr/bin/env python3
"""Makes what `scripts/demo.sh --sft` and `--dpo` train on, from the Python standard library alone.

  make-demo-sft.py tokenizer STDLIB OUT_DIR
      a byte-level BPE (2048 ids) trained on STDLIB's .py sources with the `tokenizers` package, with
      DeepSeek-Coder's special tokens; OUT_DIR/tokenizer.json and tokenizer_config.json (bos, and
      <|EOT|> as the eos that ends assistant turns, as deepseek-coder-instruct has it; no chat
      template: prepare-data --chat-template gives it, and the export carries it)
  make-demo-sft.py conversations STDLIB TRAIN.jsonl QUESTIONS.jsonl
      questions and answers drawn from the docstrings and signatures of the standard library's
      public functions and classes ("What does json.dumps do?" -> the docstring's first sentence;
      "Write the signature of json.dumps." -> "def dumps(obj, *, skipkeys=False, ...)"), as
      OpenAI-style {"messages": [system, user, assistant]} lines; every 50th goes to QUESTIONS.jsonl
      instead, never trained, for the demo to ask the fine-tuned model.
  make-demo-sft.py pairs STDLIB OUT.jsonl [--count N]
      preference pairs for `scripts/demo.sh --dpo`, in TRL's format ({"prompt": [system, user],
      "chosen": [assistant], "rejected": [assistant]}): the same questions, the right answer chosen;
      rejected, a signature naming another function, or the docstring's words shuffled; N of them
      (default 1600), drawn with a seed of their own.

Both are deterministic for a given standard library. Needs only `tokenizers` (with transformers).
"""
import argparse
import ast
import json
import os
import random
import re
import sys
from pathlib import Path

BOS, EOS, EOT = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<|EOT|>"
SYSTEM = "You are a Python expert. Answer in one line."
SKIP = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo", "__pycache__", "ensurepip", "pydoc_data"}


def sources(stdlib):
    for path in sorted(Path(stdlib).rglob("*.py")):
        if not SKIP.intersection(path.relative_to(stdlib).parts):
            yield path


def make_tokenizer(args):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    texts = []
    size = 0
    for path in sources(args.stdlib):
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        size += len(text)
        if size > 6_000_000:
            break
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=[BOS, EOS, EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOT, "model_max_length": 256,
              "clean_up_tokenization_spaces": False}
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
    print(f"{args.out}: byte-level BPE of {tok.get_vocab_size()} ids from {size / 1e6:.1f} MB of {args.stdlib}", file=sys.stderr)


def first_sentence(doc):
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    match = re.match(r"(.+?[.!?])(\s|$)", paragraph)
    return match.group(1) if match else paragraph


def pairs(stdlib):
    for path in sources(stdlib):
        parts = path.relative_to(stdlib).with_suffix("").parts
        if any(p.startswith("_") and p != "__init__" for p in parts):
            continue
        module = ".".join(p for p in parts if p != "__init__")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            answer = first_sentence(doc) if doc else ""
            if 20 <= len(answer) <= 160 and answer.isascii():
                what = "the class" if isinstance(node, ast.ClassDef) else "the function"
                yield f"What does {what} {module}.{node.name} do?", answer
            if isinstance(node, ast.FunctionDef):
                signature = f"def {node.name}({ast.unparse(node.args)}):"
                if len(signature) <= 120 and signature.isascii():
                    yield f"Write the signature of {module}.{node.name}.", signature


def make_conversations(args):
    examples = sorted(set(pairs(args.stdlib)))
    random.Random(20261203).shuffle(examples)
    train = questions = 0
    with open(args.train, "w", encoding="utf-8") as t, open(args.questions, "w", encoding="utf-8") as q:
        for i, (question, answer) in enumerate(examples):
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question},
                        {"role": "assistant", "content": answer}]
            if i % 50 == 49:
                q.write(json.dumps({"messages": messages}) + "\n")
                questions += 1
            else:
                t.write(json.dumps({"messages": messages}) + "\n")
                train += 1
    print(f"{args.train}: {train} conversations; {args.questions}: {questions} questions kept out of training", file=sys.stderr)


def make_pairs(args):
    # Preferences a small model can learn and carry to questions it never saw: a signature that
    # names the function asked about over one that names another, and a docstring's sentence over
    # the same words shuffled.
    examples = sorted(set(pairs(args.stdlib)))
    rng = random.Random(20261206)
    names = sorted({q.split(".")[-1].rstrip(".") for q, _ in examples if q.startswith("Write the signature")})
    rng.shuffle(examples)
    kept = 0
    with open(args.out, "w", encoding="utf-8") as f:
        for question, answer in examples:
            if kept == args.count:
                break
            if question.startswith("Write the signature"):
                own = question.split(".")[-1].rstrip(".")
                other = rng.choice(names)
                wrong = answer.replace(f"def {own}(", f"def {other}(", 1)
            else:
                words = answer.split()
                rng.shuffle(words)
                wrong = " ".join(words)
            if wrong == answer:
                continue
            f.write(json.dumps({"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                                "chosen": [{"role": "assistant", "content": answer}],
                                "rejected": [{"role": "assistant", "content": wrong}]}) + "\n")
            kept += 1
    print(f"{args.out}: {kept} preference pairs (the right signature against another name's, a docstring against its words "
          "shuffled)", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("tokenizer")
    p.add_argument("stdlib"), p.add_argument("out")
    p = sub.add_parser("conversations")
    p.add_argument("stdlib"), p.add_argument("train"), p.add_argument("questions")
    p = sub.add_parser("pairs")
    p.add_argument("stdlib"), p.add_argument("out"), p.add_argument("--count", type=int, default=1600)
    args = ap.parse_args()
    {"tokenizer": make_tokenizer, "conversations": make_conversations, "pairs": make_pairs}[args.cmd](args)


if __name__ == "__main__":
    main()
