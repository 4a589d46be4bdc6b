#!/usr/bin/env python3
"""An independent fine-tuning loop in PyTorch + transformers, the reference for dstrain's
training on conversations (issue 38).

  finetune_reference.py model OUT --vocab V [--family llama|deepseek_v3]
      a tiny LlamaForCausalLM (or DeepseekV3ForCausalLM: MLA and DeepSeekMoE) (fp32, random weights
      from a fixed seed), saved as an HF folder that both sides start from (dstrain through model.init_from)
  finetune_reference.py train MODEL PREFIX OUT.json --steps N --seq-len T [optimizer options]
      fine-tunes MODEL on dstrain's dataset PREFIX (.bin/.idx/.lossmask): each conversation one row
      padded to T (data.packing none), every step the whole set (so the order within a step does
      not matter); the loss is the sum of the token losses over the step's trained tokens, as
      transformers >= 4.54 computes it with num_items_in_batch; clipping as torch's
      clip_grad_norm_; torch.optim.AdamW with decay on matrices only; linear warmup from
      lr x (step + 1) / warmup, then cosine to lr x min_lr_ratio. --freeze GLOB...: the parameters
      whose names match get requires_grad=False (train.freeze's reference). --qlora ADAPTER: MODEL
      loaded in 4-bit NF4 by bitsandbytes (double quantization, float32 compute) and the PEFT
      adapter ADAPTER trained on it (lora.base nf4's reference). Writes the per-step losses and
      gradient norms.
  finetune_reference.py compare OUT.json METRICS.jsonl --rtol R --grad-rtol G [--grad-steps N]
      dstrain's per-step losses and LRs (within R) and gradient norms (within G; of the first N
      steps only) against the reference's
  finetune_reference.py eval MODEL PREFIX --seq-len T
      the validation loss of MODEL (an HF folder) on dstrain's dataset PREFIX: each conversation
      alone in a row, the summed token losses of the tokens the mask trains over their count; prints
      {"val_loss", "val_tokens", "conversations"} as JSON
"""
import argparse
import fnmatch
import json
import math
import os
import sys


def make_model(args):
    import torch  # here, not at the top: compare needs neither (a torch import costs seconds)
    import transformers
    torch.manual_seed(11)
    if args.family == "deepseek_v3":
        config = transformers.DeepseekV3Config(
            vocab_size=args.vocab, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4, routed_scaling_factor=2.5,
            kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, n_group=2, topk_group=1,
            num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=True, max_position_embeddings=args.max_positions,
            rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False, initializer_range=0.05)
        model = transformers.DeepseekV3ForCausalLM(config).to(torch.float32)
        model.save_pretrained(args.out, safe_serialization=True)
        print(f"{args.out}: DeepseekV3ForCausalLM, {sum(p.numel() for p in model.parameters())} parameters")
        return
    config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=args.max_positions,
                                      rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False,
                                      mlp_bias=False, initializer_range=0.05)
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(args.out, safe_serialization=True)
    print(f"{args.out}: LlamaForCausalLM, {sum(p.numel() for p in model.parameters())} parameters")


def rows_of(prefix, seq_len):
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "text"))
    from chat_data_reference import read_dataset
    conversations = read_dataset(prefix)
    tokens = torch.zeros(len(conversations), seq_len, dtype=torch.long)
    labels = torch.full((len(conversations), seq_len), -100, dtype=torch.long)
    for r, (ids, mask) in enumerate(conversations):
        assert len(ids) <= seq_len, f"conversation {r} has {len(ids)} tokens, more than a row of {seq_len}"
        tokens[r, :len(ids)] = torch.tensor(ids)
        for i in range(len(ids) - 1):  # position i predicts token i + 1 where the mask trains it
            if mask[i + 1]:
                labels[r, i] = ids[i + 1]
    return tokens, labels


def lr_at(args, step):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    decay = args.steps - args.warmup
    progress = min(1.0, (step - args.warmup) / decay) if decay > 0 else 0.0
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(args):
    import torch
    import transformers
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if args.qlora:  # QLoRA as PEFT + bitsandbytes do it: the base in NF4 (double quantization), the adapter trained
        from peft import PeftModel
        bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                              bnb_4bit_compute_dtype=torch.float32)
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager",
                                                                  quantization_config=bnb, device_map="cpu")
        model = PeftModel.from_pretrained(model, args.qlora, is_trainable=True)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager")
    model.train()
    tokens, labels = rows_of(args.prefix, args.seq_len)
    trained = int((labels != -100).sum())
    for name, p in model.named_parameters():
        if any(fnmatch.fnmatchcase(name, g) for g in args.freeze):
            p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    plain = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay}, {"params": plain, "weight_decay": 0.0}], lr=args.lr,
                            betas=(args.beta1, args.beta2), eps=args.eps)
    out = []
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(args, step)
        opt.zero_grad(set_to_none=True)
        logits = model(tokens).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                                                 reduction="sum") / trained
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, args.clip) if args.clip > 0 else torch.sqrt(
            sum(p.grad.pow(2).sum() for p in params))
        opt.step()
        out.append({"step": step + 1, "loss": loss.item(), "grad_norm": float(norm), "lr": lr_at(args, step)})
    json.dump({"conversations": len(tokens), "trained_tokens": trained, "steps": out}, open(args.out, "w"), indent=1)
    print(f"reference: {len(tokens)} conversations, {trained} trained tokens, loss {out[0]['loss']:.4f} -> {out[-1]['loss']:.4f} "
          f"in {args.steps} steps")


def evaluate(args):
    import torch
    import transformers
    torch.set_num_threads(1)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    tokens, labels = rows_of(args.prefix, args.seq_len)
    with torch.no_grad():
        logits = model(tokens).logits.double()
    total = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                                              reduction="sum")
    count = int((labels != -100).sum())
    print(json.dumps({"val_loss": total.item() / count, "val_tokens": count, "conversations": len(tokens)}))


def compare(args):
    ref = json.load(open(args.reference))["steps"]
    got = [r for r in map(json.loads, open(args.metrics)) if "loss" in r]
    if len(got) != len(ref):
        raise SystemExit(f"{args.metrics}: {len(got)} steps, the reference has {len(ref)}")
    worst = {"loss": 0.0, "grad_norm": 0.0, "lr": 0.0}
    for a, b in zip(ref, got):
        for key in worst:
            if key == "grad_norm" and args.grad_steps and a["step"] > args.grad_steps:
                continue
            rel = abs(a[key] - b[key]) / max(abs(a[key]), 1e-12)
            worst[key] = max(worst[key], rel)
            if rel > (args.grad_rtol if key == "grad_norm" else args.rtol):
                raise SystemExit(f"step {a['step']}: {key} {b[key]!r} from dstrain, {a[key]!r} from the reference "
                                 f"(relative difference {rel:.2e})")
    print(f"{len(ref)} steps: loss {ref[0]['loss']:.4f} -> {ref[-1]['loss']:.4f}; largest relative differences: "
          + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("model")
    p.add_argument("out"), p.add_argument("--vocab", type=int, required=True), p.add_argument("--max-positions", type=int, default=64)
    p.add_argument("--family", choices=["llama", "deepseek_v3"], default="llama")
    p = sub.add_parser("train")
    p.add_argument("model"), p.add_argument("prefix"), p.add_argument("out")
    p.add_argument("--steps", type=int, required=True), p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--lr", type=float, default=2e-3), p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1), p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9), p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8), p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--freeze", nargs="*", default=[])
    p.add_argument("--qlora", default="", help="a PEFT adapter folder: train it on MODEL loaded in 4-bit NF4 by bitsandbytes")
    p = sub.add_parser("compare")
    p.add_argument("reference"), p.add_argument("metrics"), p.add_argument("--rtol", type=float, default=1e-5)
    p.add_argument("--grad-steps", type=int, default=0, help="compare the gradient norms of the first N steps only (0: all)")
    p.add_argument("--grad-rtol", type=float, default=1e-4)  # a norm over every gradient: rounding adds up
    p = sub.add_parser("eval")
    p.add_argument("model"), p.add_argument("prefix"), p.add_argument("--seq-len", type=int, required=True)
    args = ap.parse_args()
    {"model": make_model, "train": train, "compare": compare, "eval": evaluate}[args.cmd](args)


if __name__ == "__main__":
    main()
