#!/usr/bin/env python3
"""Trains the test tokenizers with Hugging Face `tokenizers`, offline, on a corpus made by
make_corpus.py, and writes each as OUT/NAME/tokenizer.json (+ tokenizer_config.json):

  deepseek_v3  byte-level BPE with DeepSeek-V3's pre-tokenizer (three Splits, then ByteLevel
               without its regex), an empty normalizer Sequence and a BOS template
  gpt2         GPT-2's: ByteLevel with its own regex; merges written in the older "a b" form
  llama3       Llama 3's: its Split regex, ByteLevel, ignore_merges, BOS template in a Sequence
  variants built from gpt2's vocabulary with other components, to cover what dstrain reads:
  nfkc_digits  NFKC, Digits (individual), a literal Split MergedWithNext, ByteLevel with
               add_prefix_space; an lstrip/rstrip added token
  nfc_lower    NFC + Lowercase + a Replace, Splits with Removed/MergedWithPrevious/Contiguous and
               invert, Digits (contiguous), a normalized added token
  char_fallback a character-level BPE (no ByteLevel) with byte_fallback and Prepend/Replace
               normalizers, as Llama 2 and Mistral are built
  char_unk     the same with an unknown token and fuse_unk instead of byte_fallback

    train_tokenizers.py CORPUS.jsonl OUT [--train-mb 3]
"""
import argparse
import copy
import json
import os

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

DEEPSEEK_V3_SPLITS = [
    r"\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def texts(corpus, limit_bytes):
    total = 0
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            t = json.loads(line)["text"]
            total += len(t.encode())
            yield t
            if total >= limit_bytes:
                return


def save(tok, out, name, config):
    os.makedirs(os.path.join(out, name), exist_ok=True)
    tok.save(os.path.join(out, name, "tokenizer.json"))
    with open(os.path.join(out, name, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)


def byte_level_bpe(corpus, limit, pre, specials, vocab=6000):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts(corpus, limit), trainer=trainer)
    return tok


def edit(path, fn):
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    fn(j)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=1)


def write_json(out, name, j, config):
    os.makedirs(os.path.join(out, name), exist_ok=True)
    with open(os.path.join(out, name, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=1)
    with open(os.path.join(out, name, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    Tokenizer.from_file(os.path.join(out, name, "tokenizer.json"))  # tokenizers must accept it too


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--train-mb", type=float, default=3.0)
    args = ap.parse_args()
    limit = int(args.train_mb * 1e6)

    # DeepSeek-V3
    bos, eos = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(p), "isolated") for p in DEEPSEEK_V3_SPLITS] +
                                  [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = byte_level_bpe(args.corpus, limit, pre, [bos, eos, "<｜▁pad▁｜>"])
    tok.normalizer = normalizers.Sequence([])
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    save(tok, args.out, "deepseek_v3", {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos})

    # GPT-2, with the merges in the older string form
    tok = byte_level_bpe(args.corpus, limit, pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    save(tok, args.out, "gpt2", {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})
    gpt2_path = os.path.join(args.out, "gpt2", "tokenizer.json")
    edit(gpt2_path, lambda j: j["model"].update(merges=[" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]))

    # Llama 3
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(4)]
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), "isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = byte_level_bpe(args.corpus, limit, pre, specials)
    tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False),
                                              processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                                            special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])
    save(tok, args.out, "llama3", {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"})
    edit(os.path.join(args.out, "llama3", "tokenizer.json"), lambda j: j["model"].update(ignore_merges=True))

    with open(gpt2_path, encoding="utf-8") as f:
        base = json.load(f)
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    n = len(base["model"]["vocab"])

    j = copy.deepcopy(base)
    j["normalizer"] = {"type": "NFKC"}
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    j["added_tokens"].append({"id": n, "content": "<mask>", "single_word": False, "lstrip": True, "rstrip": True, "normalized": False,
                              "special": True})
    write_json(args.out, "nfkc_digits", j, cfg)

    j = copy.deepcopy(base)
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "NFC"}, {"type": "Lowercase"}, {"type": "Replace", "pattern": {"Regex": "\t+"}, "content": "    "}]}
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "[\r\n]+"}, "behavior": "Removed", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[,.;:!?。，]"}, "behavior": "MergedWithPrevious", "invert": False},
        {"type": "Split", "pattern": {"Regex": "\\p{L}+"}, "behavior": "Contiguous", "invert": True},
        {"type": "Digits", "individual_digits": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    j["added_tokens"].append({"id": n, "content": "<MASK>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": True,
                              "special": False})
    write_json(args.out, "nfc_lower", j, cfg)

    # Character-level BPE with byte_fallback (Llama 2 / Mistral style), trained on short pieces.
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", "merged_with_next")
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens, show_progress=False,
                                  limit_alphabet=400)
    tok.train_from_iterator(texts(args.corpus, limit // 2), trainer=trainer)
    tok.pre_tokenizer = None
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    save(tok, args.out, "char_fallback", {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"})
    with open(os.path.join(args.out, "char_fallback", "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    j["model"].update(byte_fallback=False, unk_token="<unk>", fuse_unk=True)
    write_json(args.out, "char_unk", j, {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>"})


if __name__ == "__main__":
    main()
