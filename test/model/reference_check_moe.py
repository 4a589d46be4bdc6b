#!/usr/bin/env python3
"""Independent reference for DeepSeek-V2/V3 blocks, written from the architecture reference's
equations with a per-token routing loop (dstrain groups tokens by expert): MLA with optional
q_lora and decoupled RoPE on the shared key part, DeepSeekMoE with softmax or sigmoid scores,
greedy / group-limited / noaux_tc selection (bias for selection only), the sequence-wise balance
loss. Loads dstrain's weights and must reproduce its logits within 1e-5 (fp32)."""
import json
import struct
import sys
from pathlib import Path

import torch
import torch.nn.functional as F


def read_safetensors(path):
    data = Path(path).read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    return {k: torch.frombuffer(bytearray(data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]), dtype=torch.float32).reshape(v["shape"])
            for k, v in header.items() if k != "__metadata__"}


def rms(x, w, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, theta):
    T, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    f = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    emb = torch.cat((f, f), -1)
    rot = torch.cat((-x[..., d // 2:], x[..., :d // 2]), -1)
    return x * emb.cos().float() + rot * emb.sin().float()


def swiglu(x, g, u, d):
    return F.linear(F.silu(F.linear(x, g)) * F.linear(x, u), d)


def mla(c, w, p, h):
    B, T, _ = h.shape
    nh, dn, dr, dv = c["num_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    if c["q_lora_rank"] > 0:
        q = F.linear(rms(F.linear(h, w[p + "self_attn.q_a_proj.weight"]), w[p + "self_attn.q_a_layernorm.weight"], c["rms_norm_eps"]), w[p + "self_attn.q_b_proj.weight"])
    else:
        q = F.linear(h, w[p + "self_attn.q_proj.weight"])
    q = q.view(B, T, nh, dn + dr).transpose(1, 2)
    ckv = F.linear(h, w[p + "self_attn.kv_a_proj_with_mqa.weight"])
    c_kv, k_pe = ckv[..., :c["kv_lora_rank"]], ckv[..., c["kv_lora_rank"]:]
    kv = F.linear(rms(c_kv, w[p + "self_attn.kv_a_layernorm.weight"], c["rms_norm_eps"]), w[p + "self_attn.kv_b_proj.weight"]).view(B, T, nh, dn + dv).transpose(1, 2)
    k_pe = rope(k_pe.unsqueeze(1), c["rope_theta"]).expand(B, nh, T, dr)
    q = torch.cat((q[..., :dn], rope(q[..., dn:], c["rope_theta"])), -1)
    k = torch.cat((kv[..., :dn], k_pe), -1)
    v = kv[..., dn:]
    s = (q @ k.transpose(-1, -2)) * (dn + dr) ** -0.5
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    o = torch.softmax(s, -1) @ v
    return F.linear(o.transpose(1, 2).reshape(B, T, nh * dv), w[p + "self_attn.o_proj.weight"])


def moe(c, w, p, x):
    B, T, H = x.shape
    Nr, K, G, TG = c["n_routed_experts"], c["num_experts_per_tok"], c["n_group"], c["topk_group"]
    out = torch.zeros_like(x)
    aux = torch.zeros(())
    all_scores, all_idx = [], []
    for b in range(B):
        for t in range(T):
            u = x[b, t]
            logits = F.linear(u.float(), w[p + "mlp.gate.weight"].float())
            s = torch.sigmoid(logits) if c["scoring_func"] == "sigmoid" else torch.softmax(logits, -1)
            choice = s.clone()
            if c["topk_method"] == "noaux_tc":
                choice = choice + w[p + "mlp.gate.e_score_correction_bias"]
            if c["topk_method"] != "greedy" and G > 1:
                grouped = choice.view(G, Nr // G)
                gs = grouped.topk(min(2, Nr // G), -1).values.sum(-1) if c["topk_method"] == "noaux_tc" else grouped.max(-1).values
                keep = set(gs.topk(TG).indices.tolist())
                choice = torch.stack([choice[e] if e // (Nr // G) in keep else torch.tensor(float("-inf")) for e in range(Nr)])
            idx = choice.topk(K).indices
            wts = s[idx]
            if c["norm_topk_prob"]:
                wts = wts / (wts.sum() + 1e-20)
            if not c["norm_topk_prob"] or c["scoring_func"] == "sigmoid":
                wts = wts * c["routed_scaling_factor"]
            y = torch.zeros(H)
            for e, g in zip(idx.tolist(), wts):
                q = p + f"mlp.experts.{e}."
                y = y + g * swiglu(u, w[q + "gate_proj.weight"], w[q + "up_proj.weight"], w[q + "down_proj.weight"])
            if c["n_shared_experts"] > 0:
                y = y + swiglu(u, w[p + "mlp.shared_experts.gate_proj.weight"], w[p + "mlp.shared_experts.up_proj.weight"], w[p + "mlp.shared_experts.down_proj.weight"])
            out[b, t] = y
            all_scores.append(s)
            all_idx.append(idx)
    if c["aux_loss_alpha"] > 0:
        S = torch.stack(all_scores).view(B, T, Nr)
        I = torch.stack(all_idx).view(B, T * K)
        f = torch.zeros(B, Nr).scatter_add_(1, I, torch.ones(B, T * K)) * Nr / (K * T)
        sn = S / S.sum(-1, keepdim=True) if c["scoring_func"] == "sigmoid" else S
        aux = c["aux_loss_alpha"] * (f * sn.mean(1)).sum(-1).mean()
    return out, aux


def forward(c, w, tokens):
    x = w["model.embed_tokens.weight"][tokens]
    aux = torch.zeros(())
    for i in range(c["num_layers"]):
        p = f"model.layers.{i}."
        x = x + mla(c, w, p, rms(x, w[p + "input_layernorm.weight"], c["rms_norm_eps"]))
        h = rms(x, w[p + "post_attention_layernorm.weight"], c["rms_norm_eps"])
        if i >= c["first_k_dense_replace"] and i % c["moe_layer_freq"] == 0:
            y, a = moe(c, w, p, h)
            x, aux = x + y, aux + a
        else:
            x = x + swiglu(h, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"])
    return F.linear(rms(x, w["model.norm.weight"], c["rms_norm_eps"]), w["lm_head.weight"]), aux


def main():
    torch.set_num_threads(1)
    worst = 0.0
    for name in ("v3", "v2lite"):
        d = Path(sys.argv[1]) / name
        c = json.loads((d / "config.json").read_text())["model"]
        w = read_safetensors(d / "model.safetensors")
        tokens = torch.frombuffer(bytearray((d / "tokens.bin").read_bytes()), dtype=torch.int64).reshape(2, 12)
        ours = torch.frombuffer(bytearray((d / "logits.bin").read_bytes()), dtype=torch.float32).reshape(2, 11, c["vocab_size"])
        ref, aux = forward(c, w, tokens[:, :11])
        err = (ref - ours).abs().max().item()
        loss = F.cross_entropy(ref.reshape(-1, c["vocab_size"]), tokens[:, 1:].reshape(-1)).item() + aux.item()
        our_loss = float((d / "loss.txt").read_text())
        print(f"{name}: max |logits - reference| = {err:.3g}; loss {our_loss:.8f} vs reference {loss:.8f} (balance loss {aux.item():.3g})")
        if not err <= 1e-5 or abs(loss - our_loss) > 1e-5:
            sys.exit(f"{name}: dstrain's MLA + MoE model differs from the PyTorch reference")


if __name__ == "__main__":
    main()
