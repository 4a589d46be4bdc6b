#!/usr/bin/env python3
"""A PyTorch reference for `dstrain bench moe` (issue 22): one DeepSeekMoE layer's routed experts,
forward + backward, on random tokens and softmax top-k routing of the same shapes, two ways:
  torch grouped_mm   tokens sorted by expert, each projection one torch._grouped_mm over the
                     stacked expert weights, weighted rows scattered back (what torchtitan does)
  torch loop         Hugging Face's DeepseekV2MoE style: a loop over experts with their tokens
Prints rows in `dstrain bench moe`'s columns (median ms of --iters after one warm-up; TFLOP/s of
the experts' GEMMs, 18 x hidden x inner per routed token copy). Runs on the CPU (fp32) as a smoke test.
  bench/torch_moe.py --device cuda --dtype bf16 --tokens 4096 --hidden 2048 --inner 1408 --experts 64 --top-k 6
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def grouped_layer(x, idx, w, gate, up, down):
    n, k = idx.shape
    flat = idx.reshape(-1)
    order = flat.argsort(stable=True)
    token = torch.arange(n, device=x.device).repeat_interleave(k)[order]
    offs = torch.bincount(flat, minlength=gate.shape[0]).cumsum(0).to(torch.int32)
    rows = x[token]
    h = F.silu(torch._grouped_mm(rows, gate.transpose(1, 2), offs)) * torch._grouped_mm(rows, up.transpose(1, 2), offs)
    y = torch._grouped_mm(h, down.transpose(1, 2), offs) * w.reshape(-1)[order].unsqueeze(1)
    return torch.zeros_like(x).index_add(0, token, y)


def loop_layer(x, idx, w, gate, up, down):
    out = torch.zeros_like(x)
    for e in range(gate.shape[0]):
        tok, slot = torch.where(idx == e)
        if tok.numel() == 0:
            continue
        xe = x[tok]
        y = F.linear(F.silu(F.linear(xe, gate[e])) * F.linear(xe, up[e]), down[e])
        out = out.index_add(0, tok, y * w[tok, slot].unsqueeze(1))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--inner", type=int, default=704)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--top-k", type=int, default=6)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--iters", type=int, default=5)
    a = p.parse_args()
    dev, dt = torch.device(a.device), torch.bfloat16 if a.dtype == "bf16" else torch.float32
    torch.manual_seed(17)
    x0 = torch.randn(a.tokens, a.hidden, device=dev, dtype=dt)
    go = torch.randn_like(x0)
    top, idx = torch.softmax(torch.randn(a.tokens, a.experts, device=dev), -1).topk(a.top_k, -1)
    w0 = (top / top.sum(-1, keepdim=True)).to(dt)
    gate = (torch.randn(a.experts, a.inner, a.hidden, device=dev, dtype=dt) * 0.02).requires_grad_()
    up = (torch.randn(a.experts, a.inner, a.hidden, device=dev, dtype=dt) * 0.02).requires_grad_()
    down = (torch.randn(a.experts, a.hidden, a.inner, device=dev, dtype=dt) * 0.02).requires_grad_()
    flops = 18.0 * a.tokens * a.top_k * a.hidden * a.inner
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for name, layer in (("torch grouped_mm", grouped_layer), ("torch loop", loop_layer)):
        times = []
        for i in range(a.iters + 1):
            for t in (gate, up, down):
                t.grad = None
            x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
            sync()
            t0 = time.perf_counter()
            layer(x, idx, w, gate, up, down).backward(go)
            sync()
            if i:
                times.append((time.perf_counter() - t0) * 1e3)
        ms = statistics.median(times)
        print(f"{name:<24} {ms:>10.2f} {flops / (ms / 1e3) / 1e12:>9.3f}")


if __name__ == "__main__":
    main()
