#!/usr/bin/env python3
"""The reference for `dstrain generate` (issue 61): transformers' generate() on the same model.

  generate_reference.py model OUT --family llama|deepseek_v2|deepseek_v3 --vocab V --max-positions N [--eos ID]
      a tiny model made by transformers (fp32, random weights from a fixed seed), saved as an HF folder:
      llama: Llama with GQA (4 query heads, 2 key/value heads); deepseek_v2: DeepSeek-V2-Lite's shape
      (MLA without q_lora_rank, DeepSeekMoE with softmax routing and shared experts); deepseek_v3:
      MLA with q_lora_rank, sigmoid routing with groups and YaRN rope scaling
  generate_reference.py generate MODEL TOKDIR PROMPTS.jsonl OUT.jsonl --max-new-tokens N
      every prompt of PROMPTS.jsonl ({"prompt": TEXT}: tokenizer(TEXT); {"messages": [...]}:
      apply_chat_template(add_generation_prompt=True)) in one batch, left-padded, through
      generate(do_sample=False, use_cache=True); writes {"token_ids"} per prompt (the new tokens up to
      and including the end-of-sequence id; the padding after it dropped)
      --adapter DIR: MODEL with the PEFT adapter DIR (peft.PeftModel.from_pretrained) generates;
      --batch-size N: N prompts per generate() call (default: all), --threads T, --device cpu|cuda,
      --dtype fp32|bf16; prints the seconds generate() took, as {"seconds", "new_tokens"} (the
      benchmark's transformers row)
  generate_reference.py compare REF.jsonl OURS.jsonl [--tokdir TOKDIR]
      the token ids per prompt, equal; with --tokdir each text is the tokenizer's decode of the new
      tokens (a final end-of-sequence id left out)
"""
import argparse
import json
import sys
import time


def make_model(args):
    import torch
    import transformers
    torch.manual_seed(5)
    common = dict(vocab_size=args.vocab, hidden_size=args.hidden, max_position_embeddings=args.max_positions, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, attention_bias=False, initializer_range=0.2, eos_token_id=args.eos,
                  bos_token_id=None, pad_token_id=None)
    if args.family == "llama":
        config = transformers.LlamaConfig(intermediate_size=2 * args.hidden, num_hidden_layers=args.layers, num_attention_heads=4 * args.hidden // 64, num_key_value_heads=2 * args.hidden // 64,
                                          rope_theta=10000.0, mlp_bias=False, **common)
        model = transformers.LlamaForCausalLM(config)
    elif args.family == "deepseek_v2":
        config = transformers.DeepseekV2Config(intermediate_size=96 * args.hidden // 64, moe_intermediate_size=32 * args.hidden // 64,
                                               num_hidden_layers=args.layers + 1, num_attention_heads=4 * args.hidden // 64,
                                               num_key_value_heads=4 * args.hidden // 64, n_shared_experts=2, n_routed_experts=8, num_experts_per_tok=3,
                                               first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16 * args.hidden // 64, qk_rope_head_dim=8,
                                               v_head_dim=16, qk_nope_head_dim=16, topk_method="greedy", n_group=1, topk_group=1,
                                               norm_topk_prob=False, routed_scaling_factor=1.0, scoring_func="softmax",
                                               rope_theta=10000.0, **common)
        model = transformers.DeepseekV2ForCausalLM(config)
    else:
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": args.max_positions // 4,
                "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
        config = transformers.DeepseekV3Config(intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                                               num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, routed_scaling_factor=2.5,
                                               kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16,
                                               n_group=2, topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1,
                                               norm_topk_prob=True, rope_parameters=rope, **common)
        model = transformers.DeepseekV3ForCausalLM(config)
    model = model.to(torch.float32)
    model.generation_config.eos_token_id = args.eos
    model.generation_config.pad_token_id = args.eos
    model.save_pretrained(args.out, safe_serialization=True)
    print(f"{args.out}: {type(model).__name__}, {sum(p.numel() for p in model.parameters())} parameters")


def generate(args):
    import torch
    import transformers
    torch.set_num_threads(args.threads)
    tok = transformers.AutoTokenizer.from_pretrained(args.tokdir)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device).eval()
    if args.adapter:
        import peft
        model = peft.PeftModel.from_pretrained(model, args.adapter).eval()
    rows = [json.loads(line) for line in open(args.prompts) if line.strip()]
    prompts = []
    for row in rows:
        if "prompt" in row:
            prompts.append(tok(row["prompt"])["input_ids"])
        else:
            prompts.append(list(tok.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]))
    eos = model.generation_config.eos_token_id
    batch = args.batch_size or len(prompts)
    seconds, rows = 0.0, []
    for first in range(0, len(prompts), batch):
        part = prompts[first:first + batch]
        width = max(len(p) for p in part)
        ids = torch.full((len(part), width), eos, dtype=torch.long)
        mask = torch.zeros((len(part), width), dtype=torch.long)
        for i, p in enumerate(part):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(args.device), mask.to(args.device)
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=args.max_new_tokens,
                                 use_cache=True, eos_token_id=eos, pad_token_id=eos)
        if args.device != "cpu":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - start
        for i, p in enumerate(part):
            new = out[i, width:].tolist()
            if eos in new:
                new = new[:new.index(eos) + 1]
            rows.append({"prompt_tokens": len(p), "token_ids": new})
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(json.dumps({"prompts": len(prompts), "seconds": seconds, "new_tokens": sum(len(r["token_ids"]) for r in rows)}))


def compare(args):
    ref = [json.loads(line) for line in open(args.ref)]
    ours = [json.loads(line) for line in open(args.ours) if line.startswith("{")]
    if len(ref) != len(ours):
        sys.exit(f"{len(ours)} generations, the reference has {len(ref)}")
    bad = 0
    tok = None
    if args.tokdir:
        import transformers
        tok = transformers.AutoTokenizer.from_pretrained(args.tokdir)
    for i, (a, b) in enumerate(zip(ref, ours)):
        if tok is not None:
            ids = b["token_ids"][:-1] if b["finish_reason"] == "stop" and b["token_ids"][-1] == tok.eos_token_id else b["token_ids"]
            if tok.decode(ids, skip_special_tokens=False) != b["text"]:
                print(f"prompt {i}: text {b['text']!r}, the tokenizer decodes {tok.decode(ids)!r}")
                bad += 1
        if a["prompt_tokens"] != b["prompt_tokens"]:
            print(f"prompt {i}: {b['prompt_tokens']} prompt tokens, transformers {a['prompt_tokens']}")
            bad += 1
        elif a["token_ids"] != b["token_ids"]:
            first = next((k for k, (x, y) in enumerate(zip(a["token_ids"], b["token_ids"])) if x != y), min(len(a["token_ids"]), len(b["token_ids"])))
            print(f"prompt {i}: differs from new token {first}: ours {b['token_ids'][first:first + 5]}, transformers {a['token_ids'][first:first + 5]}"
                  f" ({len(b['token_ids'])} and {len(a['token_ids'])} tokens)")
            bad += 1
    if bad:
        sys.exit(f"{bad} of {len(ref)} prompts differ")
    print(f"{len(ref)} prompts: the same {sum(len(r['token_ids']) for r in ref)} new tokens")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model")
    m.add_argument("out")
    m.add_argument("--family", choices=["llama", "deepseek_v2", "deepseek_v3"], required=True)
    m.add_argument("--vocab", type=int, required=True)
    m.add_argument("--max-positions", type=int, default=256)
    m.add_argument("--eos", type=int, required=True)
    m.add_argument("--hidden", type=int, default=64, help="hidden size (a multiple of 64: heads grow with it)")
    m.add_argument("--layers", type=int, default=2, help="decoder layers (deepseek_v2: one more, the first dense)")
    g = sub.add_parser("generate")
    g.add_argument("model")
    g.add_argument("tokdir")
    g.add_argument("prompts")
    g.add_argument("out")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--adapter")
    g.add_argument("--batch-size", type=int, default=0)
    g.add_argument("--threads", type=int, default=2)
    g.add_argument("--device", default="cpu", help="cpu or cuda (the benchmark's GPU row)")
    g.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    c = sub.add_parser("compare")
    c.add_argument("ref")
    c.add_argument("ours")
    c.add_argument("--tokdir")
    args = p.parse_args()
    {"model": make_model, "generate": generate, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    main()
