#!/usr/bin/env python3
"""The tiny dense model of recipes/demo.yaml as an idiomatic PyTorch module (nn.Linear, RMSNorm,
rotate_half RoPE, SDPA, SwiGLU), timed like `dstrain bench model`: median forward+backward of
one random batch after 3 warm-ups, at the same thread count."""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self, H, nh, I, eps):
        super().__init__()
        self.nh = nh
        self.n1, self.n2 = RMSNorm(H, eps), RMSNorm(H, eps)
        self.q, self.k, self.v, self.o = (nn.Linear(H, H, bias=False) for _ in range(4))
        self.gate, self.up, self.down = nn.Linear(H, I, bias=False), nn.Linear(H, I, bias=False), nn.Linear(I, H, bias=False)

    def forward(self, x, cos, sin):
        B, T, H = x.shape
        d = H // self.nh
        h = self.n1(x)
        heads = lambda t: t.view(B, T, self.nh, d).transpose(1, 2)
        rot = lambda t: torch.cat((-t[..., d // 2:], t[..., :d // 2]), -1)
        q, k, v = heads(self.q(h)), heads(self.k(h)), heads(self.v(h))
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        x = x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, H))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Model(nn.Module):
    def __init__(self, V, H, L, nh, I, T, theta=10000.0, eps=1e-6):
        super().__init__()
        self.embed = nn.Embedding(V, H)
        self.blocks = nn.ModuleList(Block(H, nh, I, eps) for _ in range(L))
        self.norm, self.head = RMSNorm(H, eps), nn.Linear(H, V, bias=False)
        d = H // nh
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        f = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        emb = torch.cat((f, f), -1)
        self.register_buffer("cos", emb.cos().float())
        self.register_buffer("sin", emb.sin().float())

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        T = tokens.shape[1]
        for b in self.blocks:
            x = b(x, self.cos[:T], self.sin[:T])
        return F.cross_entropy(self.head(self.norm(x)).flatten(0, 1), targets.flatten())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    m = Model(V=256, H=128, L=2, nh=4, I=344, T=a.seq_len)
    tokens = torch.randint(0, 256, (a.micro_batch, a.seq_len + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    times = []
    for i in range(a.iters + 3):
        m.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        m(x, y).backward()
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1000)
    ms = statistics.median(times)
    n = sum(p.numel() for p in m.parameters())
    print(f"pytorch  {n:>10} params  batch {a.micro_batch}x{a.seq_len}  threads {a.threads}: {ms:8.2f} ms/step  {a.micro_batch * a.seq_len / ms * 1000:10.0f} tokens/s")


if __name__ == "__main__":
    main()
