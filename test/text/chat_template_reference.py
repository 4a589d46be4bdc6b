"""transformers' own rendering (render_jinja_template, as apply_chat_template(tokenize=False) calls it)
(after apply_chat_template's normalization of the messages) of each conversation of a JSON Lines file with a template file: one JSON object per line,
{"text", "generation_spans"} (spans as UTF-8 byte offsets) or {"error"}. The reference for
`dstrain chat-template --json --keep-going`."""
import json
import sys

from transformers.utils.chat_template_utils import render_jinja_template

try:  # transformers 5: apply_chat_template drops the message keys whose value is None
    from transformers.tokenization_utils_base import _normalize_chat_messages
except ImportError:
    _normalize_chat_messages = lambda messages: messages

template_path, conversations_path, generation_prompt, bos, eos = sys.argv[1:6]
template = open(template_path, encoding="utf-8").read()
for line in open(conversations_path, encoding="utf-8"):
    line = line.strip()
    if not line:
        continue
    item = json.loads(line)
    kwargs = dict(item) if isinstance(item, dict) else {"messages": item}
    messages = _normalize_chat_messages(kwargs.pop("messages"))
    tools = kwargs.pop("tools", None)
    kwargs.setdefault("bos_token", bos)
    kwargs.setdefault("eos_token", eos)
    try:
        rendered, spans = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                                add_generation_prompt=generation_prompt == "1", return_assistant_tokens_mask=True,
                                                **kwargs)
        text = rendered[0]
        to_bytes = lambda i: len(text[:i].encode("utf-8"))
        print(json.dumps({"text": text, "generation_spans": [[to_bytes(a), to_bytes(b)] for a, b in spans[0]]}, ensure_ascii=False))
    except Exception as e:  # the template refused it, or used what the conversation lacks
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}, ensure_ascii=False))
