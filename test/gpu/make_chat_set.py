#!/usr/bin/env python3
"""A fine-tuning set's inputs from the standard library alone (the GPU machine has no `tokenizers`):
a byte-level BPE tokenizer.json without merges (256 byte tokens, then <|EOT|>), a chat template,
and conversations of uneven length (sorting words), for `dstrain prepare-data --chat`.
  make_chat_set.py DIR COUNT"""
import json, os, random, sys

out, count = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
# GPT-2's bytes_to_unicode: every byte as a printable character, as ByteLevel pre-tokenizers expect.
printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
chars, n = printable[:], 0
for b in range(256):
    if b not in printable:
        printable.append(b)
        chars.append(256 + n)
        n += 1
vocab = {chr(c): b for b, c in zip(printable, chars)}
special = {"id": 256, "content": "<|EOT|>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
tokenizer = {
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [special], "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
              "fuse_unk": False, "byte_fallback": False, "ignore_merges": False, "vocab": {**vocab, "<|EOT|>": 256}, "merges": []},
}
json.dump(tokenizer, open(f"{out}/tokenizer.json", "w"), ensure_ascii=False)
json.dump({"eos_token": "<|EOT|>", "chat_template": "{% for m in messages %}{% if m['role'] == 'user' %}User: {{ m['content'] }}\n"
           "{% else %}Assistant: {{ m['content'] }}<|EOT|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}Assistant: {% endif %}"},
          open(f"{out}/tokenizer_config.json", "w"))
words = "alpha beta gamma delta sum list return value index count".split()
r = random.Random(1)
with open(f"{out}/chats.jsonl", "w") as f:
    for _ in range(count):
        q = [r.choice(words) for _ in range(r.randint(2, 14))]
        f.write(json.dumps({"messages": [{"role": "user", "content": "sort: " + " ".join(q)},
                                         {"role": "assistant", "content": " ".join(sorted(q))}]}) + "\n")
