#!/usr/bin/env python3
"""The reference for `dstrain prepare-data --chat`, built with transformers.

  chat_data_reference.py tokenizers CORPUS.jsonl TEMPLATES_DIR OUT
      trains one small byte-level BPE (DeepSeek-V3's pre-tokenizer) with the special tokens of the
      test templates, and writes OUT/NAME/ (tokenizer.json + tokenizer_config.json with NAME.jinja
      as its chat_template and the template family's bos/eos) for each template
  chat_data_reference.py chats CORPUS.jsonl FIXTURE.jsonl OUT.jsonl --count N
      the fixture conversations, then N more drawn from the corpus (system prompts, 1-4 turns,
      unicode, empty strings, whitespace at the edges), as {"messages": [...]} lines
  chat_data_reference.py compare REF.json PREFIX
      dstrain's dataset (PREFIX.bin/.idx/.lossmask) against the reference, conversation by conversation
  chat_data_reference.py reference TOKDIR CHATS.jsonl OUT.json [--builtin-coder]
      per conversation: the ids of apply_chat_template(tokenize=True) (the rendering encoded without
      the post-processor's tokens) and the incremental prefix mask: each assistant message i
      trained from len(ids(render(messages[:i], add_generation_prompt=True))) to
      len(ids(render(messages[:i+1]))). Where the generation prompt is not a prefix of the rendered
      turn (R1's "<think>\\n"), the turn starts after the tokens the prompt shares with the whole. Conversations the
      template refuses, the malformed ones (unknown roles, content that is not a string) and those
      with nothing trained are left out, as --on-error skip does. An empty prefix (an assistant
      message first) is rendered with render_jinja_template, which apply_chat_template calls.
      --builtin-coder: DeepSeek-Coder's finetune_deepseekcoder.py preprocess instead (source
      tokenized with the tokenizer's BOS, source + target, labels masked over the source).
"""
import argparse
import json
import os
import random
import sys

FAMILIES = {  # template -> (bos, eos)
    "deepseek-llm-chat": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-coder-instruct": ("<｜begin▁of▁sentence｜>", "<|EOT|>"),
    "deepseek-v3-style": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-r1-style": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "llama3-style": ("<|begin_of_text|>", "<|eot_id|>"),
    "chatml-qwen-style": (None, "<|im_end|>"),
    "mistral-style": ("<s>", "</s>"),
}
SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<|EOT|>", "<｜User｜>", "<｜Assistant｜>", "<|begin_of_text|>",
            "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "[INST]", "[/INST]",
            "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
            "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"]
SPLITS = [
    r"\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]


def texts(corpus):
    with open(corpus, encoding="utf-8") as f:
        return [t for t in (json.loads(line)["text"] for line in f) if t]


def make_tokenizers(args):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(p), "isolated") for p in SPLITS] +
                                                [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts(args.corpus), trainer=trainer)
    for name, (bos, eos) in FAMILIES.items():
        out = os.path.join(args.out, name)
        os.makedirs(out, exist_ok=True)
        tok.save(os.path.join(out, "tokenizer.json"))
        with open(os.path.join(args.templates, name + ".jinja"), encoding="utf-8") as f:
            config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "chat_template": f.read()}
        if bos:
            config["bos_token"] = bos
        with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=1)


def make_chats(args):
    rng = random.Random(7)
    pool = texts(args.corpus)
    snippet = lambda: (lambda t: t[rng.randrange(max(1, len(t) - 200)):][:rng.choice([0, 1, 5, 40, 200])])(rng.choice(pool))
    with open(args.out, "w", encoding="utf-8") as out:
        for line in open(args.fixture, encoding="utf-8"):
            if line.strip():
                out.write(line)
        for _ in range(args.count):
            messages = []
            if rng.random() < 0.4:
                messages.append({"role": "system", "content": snippet()})
            for _ in range(rng.randint(1, 4)):
                messages.append({"role": "user", "content": rng.choice(["", " ", "\n"]) + snippet() + rng.choice(["", "\n", "  "])})
                messages.append({"role": "assistant", "content": snippet() + rng.choice(["", "\n", " 🙂"])})
            out.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")


def reference(args):
    from transformers import AutoTokenizer
    from transformers.utils.chat_template_utils import render_jinja_template
    tok = AutoTokenizer.from_pretrained(args.tokdir)
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    result = []
    for line in open(args.chats, encoding="utf-8"):
        if not line.strip():
            continue
        item = json.loads(line)
        item = {"messages": item} if isinstance(item, list) else item
        if args.builtin_coder:  # DeepSeek-Coder's own data: {"instruction", "output"}
            result.append(coder_finetune(tok, item["instruction"], item["output"]))
            continue
        messages, tools = item["messages"], item.get("tools")
        if not well_formed(messages):
            continue
        render = lambda m, gp: (tok.apply_chat_template(m, tools=tools, tokenize=False, add_generation_prompt=gp) if m else
                                render_jinja_template(conversations=[m], tools=tools, chat_template=tok.chat_template,
                                                      add_generation_prompt=gp, **tok.special_tokens_map)[0][0])
        try:
            full = render(messages, False)
            tokens = ids(full)
            mask = [0] * len(tokens)
            for i, m in enumerate(messages):
                if m["role"] != "assistant":
                    continue
                before = render(messages[:i], True)
                through = full if i + 1 == len(messages) else render(messages[:i + 1], False)
                a, b = len(ids(before)), len(ids(through))
                if not through.startswith(before):  # the turn starts after the tokens both renderings share
                    p = ids(before)
                    a = next((k for k in range(min(len(p), len(tokens))) if p[k] != tokens[k]), min(len(p), len(tokens)))
                mask[a:b] = [1] * (b - a)
        except Exception:  # the template refused it
            continue
        if any(mask):
            result.append({"ids": tokens, "mask": mask})
    json.dump(result, open(args.out, "w"))


def well_formed(messages):
    """dstrain's rule: known roles, string content (none only beside tool_calls)."""
    for m in messages:
        if m.get("role") not in ("system", "user", "assistant", "tool"):
            return False
        c = m.get("content")
        if not (isinstance(c, str) or (c is None and m["role"] == "assistant" and "tool_calls" in m)):
            return False
    return bool(messages)


def coder_finetune(tok, instruction, output):
    # finetune_deepseekcoder.py: build_instruction_prompt + f"{output}\n{EOT_TOKEN}", tokenized with BOS
    source = '''
You are an AI programming assistant, utilizing the DeepSeek Coder model, developed by DeepSeek Company, and you only answer questions related to computer science. For politically sensitive questions, security and privacy issues, and other non-computer science questions, you will refuse to answer.
### Instruction:
{}
### Response:
'''.format(instruction.strip()).lstrip()
    target = f"{output}\n<|EOT|>"
    bos = [tok.convert_tokens_to_ids("<｜begin▁of▁sentence｜>")]
    example = bos + ids_of(tok, source + target)
    n_source = len(bos + ids_of(tok, source))
    return {"ids": example, "mask": [0] * n_source + [1] * (len(example) - n_source)}


def ids_of(tok, s):
    return tok(s, add_special_tokens=False)["input_ids"]


def read_dataset(prefix):
    """dstrain's PREFIX.bin/.idx/.lossmask: [(ids, mask)] per document."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from check_parity import read_megatron
    documents = read_megatron(prefix)
    raw = open(prefix + ".lossmask", "rb").read()
    assert raw[:8] == b"DSTRMASK" and int.from_bytes(raw[8:16], "little") == 1, "not a version-1 loss mask"
    mask = list(raw[16:])
    assert len(mask) == sum(len(d) for d in documents), "the .bin, .idx and .lossmask disagree"
    out, at = [], 0
    for d in documents:
        out.append((d, mask[at:at + len(d)]))
        at += len(d)
    return out


def compare(args):
    ref = json.load(open(args.reference))
    got = read_dataset(args.prefix)
    if len(ref) != len(got):
        raise SystemExit(f"{args.prefix}: {len(got)} conversations, the reference has {len(ref)}")
    for i, (r, (ids, mask)) in enumerate(zip(ref, got)):
        if r["ids"] != ids:
            k = next((j for j in range(min(len(ids), len(r["ids"]))) if ids[j] != r["ids"][j]), min(len(ids), len(r["ids"])))
            raise SystemExit(f"{args.prefix}: conversation {i}: ids differ at {k}: reference {r['ids'][k:k + 8]}, dstrain {ids[k:k + 8]}")
        if r["mask"] != mask:
            k = next(j for j in range(len(mask)) if mask[j] != r["mask"][j])
            raise SystemExit(f"{args.prefix}: conversation {i}: masks differ at token {k}: reference {r['mask'][max(0, k - 4):k + 8]}, "
                             f"dstrain {mask[max(0, k - 4):k + 8]}")
    trained = sum(sum(m) for _, m in got)
    print(f"{len(got)} conversations, {sum(len(t) for t, _ in got)} tokens, {trained} trained: identical")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("tokenizers")
    p.add_argument("corpus"), p.add_argument("templates"), p.add_argument("out")
    p = sub.add_parser("chats")
    p.add_argument("corpus"), p.add_argument("fixture"), p.add_argument("out"), p.add_argument("--count", type=int, default=200)
    p = sub.add_parser("reference")
    p.add_argument("tokdir"), p.add_argument("chats"), p.add_argument("out"), p.add_argument("--builtin-coder", action="store_true")
    p = sub.add_parser("compare")
    p.add_argument("reference"), p.add_argument("prefix")
    args = ap.parse_args()
    {"tokenizers": make_tokenizers, "chats": make_chats, "reference": reference, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    main()
