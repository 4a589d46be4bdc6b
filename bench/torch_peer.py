#!/usr/bin/env python3
"""The PyTorch peer of a dstrain run (issue 21): the same dense model (shapes, GQA, RoPE, RMSNorm,
SwiGLU, untied head) read from the run's config.resolved.json, trained on random tokens with
fused AdamW, timed like dstrain's metrics (median step after the warm-up) and counted with the
same FLOPs formula (config/describe.cpp: 6 x active non-embedding parameters + attention at the
sequence length, no causal discount). Modes, the usual ways to train such a model in PyTorch:
  eager-autocast   fp32 parameters, bf16 autocast
  eager-bf16       bf16 parameters
  compile          torch.compile of the eager-autocast model
Prints one markdown row per mode in scripts/bench-gpu-train.sh's columns, and a JSON line each
(prefix "peer-json ") for the ratio. Runs on CPU for a smoke test (--device cpu).
  bench/torch_peer.py --config RUN/config.resolved.json --steps 25 --modes eager-autocast,compile
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype) * self.weight


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        H, self.nh = m["hidden_size"], m["num_heads"]
        self.nkv = m["num_kv_heads"] or self.nh
        self.d = H // self.nh
        self.n1, self.n2 = RMSNorm(H, m["rms_norm_eps"]), RMSNorm(H, m["rms_norm_eps"])
        self.q = nn.Linear(H, self.nh * self.d, bias=False)
        self.k = nn.Linear(H, self.nkv * self.d, bias=False)
        self.v = nn.Linear(H, self.nkv * self.d, bias=False)
        self.o = nn.Linear(self.nh * self.d, H, bias=False)
        I = m["intermediate_size"]
        self.gate, self.up, self.down = nn.Linear(H, I, bias=False), nn.Linear(H, I, bias=False), nn.Linear(I, H, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        d = self.d
        h = self.n1(x)
        q = self.q(h).view(B, T, self.nh, d).transpose(1, 2)
        k = self.k(h).view(B, T, self.nkv, d).transpose(1, 2)
        v = self.v(h).view(B, T, self.nkv, d).transpose(1, 2)
        rot = lambda t: torch.cat((-t[..., d // 2:], t[..., :d // 2]), -1)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        if self.nkv != self.nh:
            k, v = k.repeat_interleave(self.nh // self.nkv, 1), v.repeat_interleave(self.nh // self.nkv, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, self.nh * d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Model(nn.Module):
    def __init__(self, m, T):
        super().__init__()
        H, V = m["hidden_size"], m["vocab_size"]
        self.embed = nn.Embedding(V, H)
        self.blocks = nn.ModuleList(Block(m) for _ in range(m["num_layers"]))
        self.norm, self.head = RMSNorm(H, m["rms_norm_eps"]), nn.Linear(H, V, bias=False)
        d = H // m["num_heads"]
        inv = 1.0 / m["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        f = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        emb = torch.cat((f, f), -1)
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        T = tokens.shape[1]
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        for b in self.blocks:
            x = b(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def flops_per_token(m, T):
    """dstrain's formula (config/describe.cpp), for the dense family."""
    H, I, V, L, nh = m["hidden_size"], m["intermediate_size"], m["vocab_size"], m["num_layers"], m["num_heads"]
    d, kv = H // nh, m["num_kv_heads"] or nh
    per_layer = H * nh * d + 2 * H * kv * d + nh * d * H + 3 * H * I + 2 * H
    total = 2 * V * H + H + L * per_layer
    return 6.0 * (total - V * H) + 6.0 * L * nh * T * (d + d)


def run(mode, m, micro, T, steps, warmup, device, lr, peak):
    torch.manual_seed(0)
    model = Model(m, T).to(device)
    autocast = mode in ("eager-autocast", "compile")
    if mode == "eager-bf16":
        model = model.to(torch.bfloat16)
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)
    step_fn = torch.compile(model) if mode == "compile" else model
    tokens = torch.randint(0, m["vocab_size"], (micro, T + 1), device=device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for i in range(warmup + steps):
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1000)
            losses.append(loss.item())
    ms = statistics.median(times)
    tokens_per_s = micro * T / ms * 1000
    tflops = tokens_per_s * flops_per_token(m, T) / 1e12
    mem = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    reserved = torch.cuda.max_memory_reserved() / 2**30 if device.type == "cuda" else float("nan")
    return {"mode": mode, "step_ms": ms, "tokens_per_s": tokens_per_s, "tflops": tflops, "mfu": tflops * 1e12 / peak,
            "gib_alloc": mem, "gib_reserved": reserved, "last_loss": losses[-1]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="a dstrain run's config.resolved.json (the model, micro batch, sequence length)")
    ap.add_argument("--modes", default="eager-autocast,eager-bf16,compile")
    ap.add_argument("--steps", type=int, default=25, help="timed steps (the median is reported)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="the MFU denominator per GPU (dstrain's: the H200 datasheet)")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    doc = json.load(open(a.config))
    c = doc["config"] if "config" in doc else doc
    m = c["model"]
    if m["family"] != "dense":
        sys.exit(f"torch_peer.py: model family {m['family']} has no peer here (dense only)")
    micro, T = c["train"]["micro_batch_size"], c["data"]["seq_len"]
    device = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    for mode in a.modes.split(","):
        r = run(mode, m, micro, T, a.steps, a.warmup, device, c["optimizer"]["lr"], a.peak_tflops * 1e12)
        label = f"PyTorch {mode}" + (f", {a.label}" if a.label else "")
        print(f"| {label} | {r['tokens_per_s']:,.0f} | {r['tflops']:.1f} | {100 * r['mfu']:.1f}% | {r['step_ms']:.0f} | - | "
              f"{r['gib_alloc']:.1f} / {r['gib_reserved']:.1f} | {a.peak_tflops:.1f} TFLOP/s |")
        print("peer-json " + json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
