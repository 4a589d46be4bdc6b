#!/usr/bin/env python3
"""A mixed-text corpus for tokenizer tests and benchmarks, made offline and deterministically:
source code (the Python standard library's), English prose (its docstrings and the system's
license texts), Chinese, Japanese, Korean, Cyrillic and Arabic, digits and dates, emoji (with
ZWJ sequences, skin tones and flags), runs of spaces, tabs and CR/LF, Unicode spaces, combining
marks, and special tokens. Writes JSON Lines ({"text": ...}, one document per line).

    make_corpus.py OUT.jsonl --mb 10 [--seed 0] [--specials '<|endoftext|>,...']
"""
import argparse
import glob
import json
import os
import random
import sysconfig

CJK = ("的一是不了人我在有他这中大来上个国到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于"
       "起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明"
       "数据训练模型深度学习分布式计算机科学研究开发工程师系统网络服务器")
KANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテト"
HANGUL = "가나다라마바사아자차카타파하한국어데이터학습모델"
CYRILLIC = "привет мир данные обучение модели распределённое"
ARABIC = "مرحبا بالعالم تدريب النماذج"
EMOJI = ["😀", "🚀", "🔥", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "🇩🇪", "❤️", "✅", "🤖", "🧠", "🙂", "🎉", "🏳️‍🌈", "👩🏿‍💻", "🍣", "☕"]
SPACES = [" ", "  ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\u3000", "\u00a0", "\u2003", "   \n\n  "]
COMBINING = ["e\u0301", "n\u0303", "A\u030a", "ﬁ", "Ⅻ", "①", "ｆｕｌｌｗｉｄｔｈ", "x²", "½", "Å", "Ω", "ﾊﾝｶｸ"]
PUNCT = list("!?.,;:()[]{}<>\"'`~@#$%^&*-_=+/\\|") + ["...", "—", "–", "“", "”", "«", "»", "。", "，", "！", "？", "、"]


def english_sources():
    texts = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        try:
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
        except (OSError, UnicodeDecodeError):
            pass
    return texts


def code_sources():
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "*.py")) + glob.glob(os.path.join(root, "*", "*.py")))
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                yield path, f.read()
        except (OSError, UnicodeDecodeError):
            continue


def words(rng, alphabet, n, lo=1, hi=4):
    return "".join(rng.choice(alphabet) for _ in range(n)) if hi == 0 else \
        " ".join("".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi))) for _ in range(n))


def mixed_doc(rng, english, specials):
    parts = []
    for _ in range(rng.randint(8, 40)):
        kind = rng.random()
        if kind < 0.25:
            text = rng.choice(english)
            start = rng.randrange(max(1, len(text) - 400))
            parts.append(text[start:start + rng.randint(20, 400)])
        elif kind < 0.40:
            parts.append("".join(rng.choice(CJK) for _ in range(rng.randint(5, 60))) + rng.choice(["。", "，", "！", "？", ""]))
        elif kind < 0.47:
            parts.append("".join(rng.choice(KANA + CJK) for _ in range(rng.randint(3, 30))))
        elif kind < 0.52:
            parts.append(rng.choice([words(rng, HANGUL, rng.randint(1, 8), 1, 4), CYRILLIC, ARABIC]))
        elif kind < 0.65:
            parts.append(rng.choice([str(rng.randint(0, 10 ** rng.randint(1, 12))), f"{rng.randint(1900, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                                     f"{rng.random() * 1000:.{rng.randint(0, 6)}f}", f"+1 ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
                                     "v" + ".".join(str(rng.randint(0, 20)) for _ in range(3)), "٣٤٥", "१२३", "²³"]))
        elif kind < 0.75:
            parts.append("".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 5))))
        elif kind < 0.82:
            parts.append(rng.choice(COMBINING) + words(rng, "abcdefghijklmnopqrstuvwxyzÀÉÎÕÜàéîõüçñß", 3))
        elif kind < 0.90:
            parts.append("".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 6))))
        elif kind < 0.96 and specials:
            parts.append(rng.choice(specials))
        else:
            parts.append("don't I'm we'll they've she'd IT'S HE'LL " + words(rng, "ABCdefXYZ", 2))
        parts.append(rng.choice(SPACES) if rng.random() < 0.5 else " ")
    return "".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--mb", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--specials", default="<|endoftext|>,<｜begin▁of▁sentence｜>,<|begin_of_text|>,<mask>")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    specials = [s for s in args.specials.split(",") if s]
    english = english_sources() or ["The quick brown fox jumps over the lazy dog. " * 20]
    target = int(args.mb * 1e6)
    written = 0
    code = code_sources()
    with open(args.out, "w", encoding="utf-8") as out:
        while written < target:
            if rng.random() < 0.35:
                item = next(code, None)
                if item is None:
                    code = code_sources()
                    continue
                text = item[1][: rng.randint(200, 20000)]
            else:
                text = mixed_doc(rng, english, specials)
            if rng.random() < 0.02:
                text = ""  # empty documents happen
            line = json.dumps({"text": text, "id": written}, ensure_ascii=rng.random() < 0.5)
            out.write(line + "\n")
            written += len(text.encode("utf-8"))


if __name__ == "__main__":
    main()
