#!/usr/bin/env python3
"""Independent reference: a short PyTorch implementation of the LLaMA-style block, written from
the Hugging Face modeling code's equations (RMSNorm in fp32, rotate_half RoPE, causal SDPA,
SwiGLU, untied lm_head), loads dstrain's exported safetensors and must reproduce dstrain's
logits within 1e-5 (fp32)."""
import json
import struct
import sys
from pathlib import Path

import torch


def read_safetensors(path):
    data = Path(path).read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", t["dtype"]
        b, e = t["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[base + b:base + e]), dtype=torch.float32).reshape(t["shape"])
    return out


def rms_norm(x, w, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(cfg, w, tokens):
    H, nh, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    nkv = cfg["num_key_value_heads"]
    d = H // nh
    B, T = tokens.shape
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().float(), emb.sin().float()
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(L):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], cfg["rms_norm_eps"])
        q = torch.nn.functional.linear(h, w[p + "self_attn.q_proj.weight"]).view(B, T, nh, d).transpose(1, 2)
        k, v = (torch.nn.functional.linear(h, w[p + f"self_attn.{n}_proj.weight"]).view(B, T, nkv, d).transpose(1, 2).repeat_interleave(nh // nkv, 1)
                for n in "kv")
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        scores = (q @ k.transpose(-1, -2)) / d ** 0.5
        scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ v
        x = x + torch.nn.functional.linear(attn.transpose(1, 2).reshape(B, T, H), w[p + "self_attn.o_proj.weight"])
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg["rms_norm_eps"])
        gate = torch.nn.functional.silu(torch.nn.functional.linear(h, w[p + "mlp.gate_proj.weight"]))
        x = x + torch.nn.functional.linear(gate * torch.nn.functional.linear(h, w[p + "mlp.up_proj.weight"]), w[p + "mlp.down_proj.weight"])
    return torch.nn.functional.linear(rms_norm(x, w["model.norm.weight"], cfg["rms_norm_eps"]), w["lm_head.weight"])


def main():
    d = Path(sys.argv[1])
    cfg = json.loads((d / "config.json").read_text())
    w = read_safetensors(d / "model.safetensors")
    tokens = torch.frombuffer(bytearray((d / "tokens.bin").read_bytes()), dtype=torch.int64).reshape(2, 17)
    ours = torch.frombuffer(bytearray((d / "logits.bin").read_bytes()), dtype=torch.float32).reshape(2, 17, cfg["vocab_size"])
    torch.set_num_threads(1)
    ref = forward(cfg, w, tokens)
    err = (ref - ours).abs().max().item()
    loss = torch.nn.functional.cross_entropy(forward(cfg, w, tokens[:, :16]).reshape(-1, cfg["vocab_size"]), tokens[:, 1:].reshape(-1)).item()
    our_loss = float((d / "loss.txt").read_text())
    print(f"max |logits - reference| = {err:.3g} over {ours.numel()} logits; loss {our_loss:.8f} vs reference {loss:.8f}")
    if not err <= 1e-5 or abs(loss - our_loss) > 1e-5:
        sys.exit("dstrain's dense model differs from the PyTorch reference")


if __name__ == "__main__":
    main()
