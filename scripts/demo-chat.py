#!/usr/bin/env python3
"""Asks a fine-tuned model questions through Hugging Face transformers, as a user of the export would.

  demo-chat.py MODEL_DIR QUESTIONS.jsonl [--count N] [--max-new-tokens T] [--json OUT]

MODEL_DIR is a `dstrain export-hf` folder. Each question (an OpenAI-style {"messages": [...]} line;
the last message, the answer, is left out and shown as the reference) is rendered with the folder's
own chat template (tokenizer.apply_chat_template with the generation prompt), answered greedily by
model.generate, and printed beside the reference. A model that learned its end-of-turn token stops
by itself: the script counts the answers that ended with the tokenizer's eos (<|EOT|>) before
--max-new-tokens. --json writes what it printed, for tests.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("questions")
    ap.add_argument("--count", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch
    import transformers
    torch.manual_seed(0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    if not tokenizer.chat_template:
        sys.exit(f"{args.model}: the tokenizer has no chat template")
    with open(args.questions, encoding="utf-8") as f:
        conversations = [json.loads(line)["messages"] for line in f if line.strip()][:args.count]
    results = []
    for messages in conversations:
        prompt = messages[:-1]
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens, do_sample=False,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
        new = out[0, ids.shape[1]:].tolist()
        stopped = tokenizer.eos_token_id in new
        answer = tokenizer.decode(new[:new.index(tokenizer.eos_token_id)] if stopped else new, skip_special_tokens=True).strip()
        results.append({"question": prompt[-1]["content"], "answer": answer, "reference": messages[-1]["content"], "stopped": stopped})
        print(f"Q: {prompt[-1]['content']}\n   model:     {answer}{'' if stopped else '  [no end of turn]'}\n"
              f"   reference: {messages[-1]['content']}")
    stopped = sum(r["stopped"] for r in results)
    print(f"{stopped} of {len(results)} answers ended with {tokenizer.eos_token} (the end of turn the model was trained to emit); "
          f"prompts rendered by the export's own chat template")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"results": results, "stopped": stopped}, f, indent=1)


if __name__ == "__main__":
    main()
