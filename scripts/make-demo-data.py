#!/usr/bin/env python3
"""Writes recipes/data/demo_corpus.txt: English-like sentences from a small seeded grammar.

The demo needs data that ships with the repository (no download) and that a tiny model can
visibly learn. Regenerate with: python3 scripts/make-demo-data.py (the output is deterministic).
"""
import random
import sys
from pathlib import Path

SUBJECTS = ["the cat", "the old dog", "a small bird", "my neighbour", "the engineer", "a quiet student",
            "the red fox", "our teacher", "the captain", "a tired farmer", "the young queen", "the robot"]
VERBS = ["sees", "follows", "helps", "watches", "finds", "remembers", "paints", "visits", "calls", "trains"]
OBJECTS = ["the river", "a green hill", "the market", "an empty house", "the garden", "a long road",
           "the library", "a wooden boat", "the city gate", "a bright star", "the north wind"]
PLACES = ["in the morning", "at night", "after the rain", "before dinner", "near the sea", "in winter",
          "under the bridge", "on sunday", "by the old mill"]
ENDINGS = [".", ".", ".", "!", "?"]


def sentence(rng: random.Random) -> str:
    words = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)]
    if rng.random() < 0.6:
        words.append(rng.choice(PLACES))
    if rng.random() < 0.25:
        words += ["and", rng.choice(VERBS), rng.choice(OBJECTS)]
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice(ENDINGS)


def main() -> int:
    rng = random.Random(20261129)
    out = Path(__file__).resolve().parent.parent / "recipes" / "data" / "demo_corpus.txt"
    lines, size = [], 0
    while size < 256 * 1024:
        paragraph = " ".join(sentence(rng) for _ in range(rng.randint(3, 7)))
        lines.append(paragraph)
        size += len(paragraph) + 1
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out} ({out.stat().st_size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
