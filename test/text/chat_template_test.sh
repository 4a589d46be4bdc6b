#!/usr/bin/env bash
# Chat templates (issue 38): `dstrain chat-template` renders byte for byte what transformers'
# apply_chat_template renders (render_jinja_template, Jinja2's sandbox with trim_blocks and
# lstrip_blocks) for every template in test/fixtures/chat_templates x every conversation there,
# with and without the generation prompt; the conversations a template refuses (raise_exception,
# undefined values used, type errors) are refused by both; the {% generation %} spans agree;
# constructs outside the subset are refused at parse time with their line and column.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
fx="$SRC/test/fixtures/chat_templates"
"$py" -c 'import transformers' 2>/dev/null || fail "transformers is not importable from $py (scripts/setup.sh --test installs it)"
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
bos='<｜begin▁of▁sentence｜>' eos='<｜end▁of▁sentence｜>'
templates=0
for t in "$fx"/*.jinja; do
  templates=$((templates + 1))
  for gp in 0 1; do
    "$py" "$SRC/test/text/chat_template_reference.py" "$t" "$fx/conversations.jsonl" $gp "$bos" "$eos" > ref.jsonl
    set +e
    "$DSTRAIN" chat-template "$t" --messages "$fx/conversations.jsonl" --json --keep-going --bos-token "$bos" --eos-token "$eos" \
      $([ $gp = 1 ] && echo --add-generation-prompt) > got.jsonl 2> got.err
    status=$?
    set -e
    [ $status = 0 ] || [ $status = 3 ] || fail "$(basename "$t"): dstrain chat-template exited $status: $(cat got.err)"
    python3 - ref.jsonl got.jsonl "$(basename "$t") gp=$gp" >> summary.txt <<'PY' || fail "$(basename "$t") (generation prompt $gp) renders differently: $(tail -5 summary.txt)"
import json, sys
ref = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
got = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
assert len(ref) == len(got), f"{len(ref)} reference lines, {len(got)} rendered"
same = refused = 0
for i, (r, g) in enumerate(zip(ref, got), 1):
    if "error" in r or "error" in g:
        if not ("error" in r and "error" in g):
            print(f"{sys.argv[3]}: conversation {i}: transformers {r.get('error', 'renders ' + repr(r.get('text', ''))[:300])}; dstrain {g.get('error', 'renders ' + repr(g.get('text', ''))[:300])}")
            sys.exit(1)
        refused += 1
        continue
    if r["text"] != g["text"]:
        a, b = r["text"], g["text"]
        k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
        print(f"{sys.argv[3]}: conversation {i} differs at character {k}: transformers {a[max(0, k - 40):k + 40]!r}, dstrain {b[max(0, k - 40):k + 40]!r}")
        sys.exit(1)
    if r["generation_spans"] != g["generation_spans"]:
        print(f"{sys.argv[3]}: conversation {i}: generation spans {r['generation_spans']} vs {g['generation_spans']}")
        sys.exit(1)
    same += 1
print(f"{sys.argv[3]}: {same} identical, {refused} refused by both")
assert same >= 10, f"only {same} conversations rendered: the test would not show much"
PY
  done
done
cat summary.txt
[ "$templates" -ge 10 ] || fail "only $templates templates"
ok "$templates templates x $(wc -l < "$fx/conversations.jsonl") conversations x 2 render byte-identical to transformers' apply_chat_template (and refuse the same ones)"

# Refused at parse time, naming the line and column.
check_refused() {  # TEMPLATE EXPECTED
  printf '%s' "$1" > bad.jinja
  expect_status 2 "$DSTRAIN" chat-template bad.jinja --messages "$fx/conversations.jsonl"
  expect_out "$2"
}
check_refused $'line one\n{% include "other.jinja" %}' "bad.jinja:2:4: '{% include %}' is not supported"
check_refused $'{{ messages | wordwrap(3) }}' "bad.jinja:1:15: no filter named 'wordwrap'"
check_refused $'{% if x is prime %}{% endif %}' "no test named 'prime'"
check_refused $'{% for m in messages %}{{ m }}' "the template ends inside a block"
check_refused $'{{ "never closed }}' "never closed"
check_refused $'{% raw %}x{% endraw %}' "{% raw %} is not supported"
ok "unsupported constructs (include, raw, unknown filters and tests, unclosed blocks and strings) are refused with their line and column"

# A conversation the template refuses: its message, the file and line, exit 3.
printf '%s\n' '[{"role":"user","content":"a"}]' '[{"role":"assistant","content":"first"}]' > two.jsonl
expect_status 3 "$DSTRAIN" chat-template "$fx/mistral-style.jinja" --messages two.jsonl
expect_out "two.jsonl:2: the chat template refused the conversation: After the optional system message, conversation roles must alternate"
printf '%s\n' 'not json' > bad.jsonl
expect_status 3 "$DSTRAIN" chat-template "$fx/mistral-style.jinja" --messages bad.jsonl
expect_out "bad.jsonl:1: not valid JSON"
mkdir tok && printf '%s' '{"bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": [{"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}]}' > tok/tokenizer_config.json
expect_status 0 "$DSTRAIN" chat-template tok --messages two.jsonl
expect_out "<s>a</s>"
expect_status 2 "$DSTRAIN" chat-template tok --template-name tool_use --messages two.jsonl
expect_out "no chat template named 'tool_use' (it has: default)"
ok "a refused conversation names its file and line (exit 3); tokenizer_config.json templates, named ones and their special tokens"
finish
