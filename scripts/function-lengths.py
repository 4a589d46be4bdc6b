#!/usr/bin/env python3
"""Lists C++ functions longer than a limit (lines from the signature's '{' to the closing '}').

  scripts/function-lengths.py [--limit N] [PATH ...]     (default: lib/ and apps/, limit 120)

Some functions have a tighter limit of their own (TIGHT): the training step reads top to bottom.

Functions are the bodies that open at namespace or class scope; lambdas and local classes count
toward the function they are in. Exits 1 when any function is over the limit.
"""
import argparse
import os
import re
import sys

TIGHT = {("lib/dstrain/train/trainer.cpp", "Trainer::step"): 50}
KEYWORDS_NOT_FUNCTIONS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignof", "static_assert"}


def strip(text):
    """Blanks out comments, strings and character literals, keeping line breaks."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i)); i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (j + 1 - i)); i = j + 1
        else:
            out.append(c); i += 1
    return "".join(out)


def functions(path):
    text = strip(open(path, encoding="utf-8", errors="replace").read())
    stack = []  # 'ns', 'class', 'fn', 'block'
    starts = []
    for i, c in enumerate(text):
        if c == "{":
            head = text[max(0, i - 400):i]
            head = head[max(head.rfind(";"), head.rfind("}"), head.rfind("{")) + 1:]
            inside_fn = "fn" in stack
            kind = "block"
            if inside_fn:
                kind = "block"
            elif re.search(r"\bnamespace\b[\w:\s]*$", head) or re.search(r'extern\s*$', head):
                kind = "ns"
            elif re.search(r"\b(class|struct|union|enum)\b[^()]*$", head):
                kind = "class"
            else:
                m = re.search(r"([\w:~<>,\s\*&]+?)\s*\(", head)
                name = re.findall(r"(~?\w+)\s*\(", head)
                if name and name[0] not in KEYWORDS_NOT_FUNCTIONS and re.search(r"\)[\w\s:&<>,\->\*\(\)\{\}\[\]]*$", head) and "=" not in head.split("(")[0]:
                    kind = "fn"
            stack.append(kind)
            starts.append((i, head))
        elif c == "}" and stack:
            kind = stack.pop()
            start, head = starts.pop()
            if kind == "fn" and "fn" not in stack:
                first = text.count("\n", 0, start) + 1
                last = text.count("\n", 0, i) + 1
                name = re.findall(r"(~?[\w:]+)\s*\(", head)
                yield first, last - first + 1, name[0] if name else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=120)
    ap.add_argument("--top", type=int, default=0, help="also list the N longest")
    ap.add_argument("paths", nargs="*", default=["lib", "apps"])
    args = ap.parse_args()
    found = []
    for root in args.paths:
        files = [root] if os.path.isfile(root) else [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith((".cpp", ".h", ".cu"))]
        for f in sorted(files):
            for line, length, name in functions(f):
                found.append((length, f, line, name))
    found.sort(reverse=True)
    over = [x for x in found if x[0] > args.limit or x[0] > TIGHT.get((os.path.normpath(x[1]), x[3]), args.limit)]
    for (path, name), limit in TIGHT.items():  # the tight limits must keep finding what they hold
        if args.paths == ["lib", "apps"] and not any(os.path.normpath(f) == path and n == name for _, f, _, n in found):
            print(f"function-lengths: {path} has no function {name} (update TIGHT)", file=sys.stderr)
            over.append((0, path, 0, name))
    for length, f, line, name in (found[: args.top] if args.top else over):
        print(f"{length:5d} lines  {f}:{line}  {name}")
    if over:
        print(f"{len(over)} function(s) over {args.limit} lines (or their own limit in TIGHT)", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
