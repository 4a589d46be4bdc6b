#!/usr/bin/env python3
"""Independent reference for DeepSeek-V3's multi-token prediction (paper §2.2, and the released
module's conventions: embedding first in the concatenation, the main model's output after its
final norm as h^0, each depth's block output before shared_head.norm passed on), on top of the
per-token MLA + MoE reference in reference_check_moe.py. Recomputes dstrain's loss (main
cross-entropy + balance losses + λ/D Σ_k CE_k, all over the batch's trained targets) on a batch
with two documents in a row (restarting positions, attention within documents) and a masked
target (and a case with PaLM's z-loss, weight x logsumexp(logits)^2 per trained target), then every
gradient with autograd, and compares them with dstrain's: within 1e-6 of the
loss, and of each gradient tensor's largest element."""
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from reference_check_moe import moe, read_safetensors, rms, swiglu  # noqa: E402


def rope(x, theta, positions):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    f = positions.double().unsqueeze(-1) * inv  # [B, T, d/2]
    emb = torch.cat((f, f), -1).unsqueeze(1)  # [B, 1, T, d]
    rot = torch.cat((-x[..., d // 2:], x[..., :d // 2]), -1)
    return x * emb.cos().float() + rot * emb.sin().float()


def mla(c, w, p, h, positions, allowed):
    B, T, _ = h.shape
    nh, dn, dr, dv = c["num_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    q = F.linear(rms(F.linear(h, w[p + "self_attn.q_a_proj.weight"]), w[p + "self_attn.q_a_layernorm.weight"], c["rms_norm_eps"]),
                 w[p + "self_attn.q_b_proj.weight"]).view(B, T, nh, dn + dr).transpose(1, 2)
    ckv = F.linear(h, w[p + "self_attn.kv_a_proj_with_mqa.weight"])
    c_kv, k_pe = ckv[..., :c["kv_lora_rank"]], ckv[..., c["kv_lora_rank"]:]
    kv = F.linear(rms(c_kv, w[p + "self_attn.kv_a_layernorm.weight"], c["rms_norm_eps"]),
                  w[p + "self_attn.kv_b_proj.weight"]).view(B, T, nh, dn + dv).transpose(1, 2)
    k_pe = rope(k_pe.unsqueeze(1), c["rope_theta"], positions).expand(B, nh, T, dr)
    q = torch.cat((q[..., :dn], rope(q[..., dn:], c["rope_theta"], positions)), -1)
    k = torch.cat((kv[..., :dn], k_pe), -1)
    s = (q @ k.transpose(-1, -2)) * (dn + dr) ** -0.5
    s = s.masked_fill(~allowed.unsqueeze(1), float("-inf"))
    o = torch.softmax(s, -1) @ kv[..., dn:]
    return F.linear(o.transpose(1, 2).reshape(B, T, nh * dv), w[p + "self_attn.o_proj.weight"])


def block(c, w, i, x, positions, allowed):
    p = f"model.layers.{i}."
    x = x + mla(c, w, p, rms(x, w[p + "input_layernorm.weight"], c["rms_norm_eps"]), positions, allowed)
    h = rms(x, w[p + "post_attention_layernorm.weight"], c["rms_norm_eps"])
    if i >= c["first_k_dense_replace"] and i % c["moe_layer_freq"] == 0:
        y, aux = moe(c, w, p, h)
        return x + y, aux
    return x + swiglu(h, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"]), torch.zeros(())


def loss_of(c, w, tokens, labels, positions, documents, z_loss_weight=0.0):
    T, L, D = tokens.shape[1], c["num_layers"], c["mtp_depth"]
    eps = c["rms_norm_eps"]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    allowed = (documents.unsqueeze(2) == documents.unsqueeze(1)) & causal  # [B, T, T]
    emb = w["model.embed_tokens.weight"][tokens]
    x, aux = emb, torch.zeros(())
    for i in range(L):
        x, a = block(c, w, i, x, positions, allowed)
        aux = aux + a
    h = rms(x, w["model.norm.weight"], eps)
    count = (labels != -100).sum()
    logits = F.linear(h, w["lm_head.weight"])
    total = F.cross_entropy(logits.reshape(-1, c["vocab_size"]), labels.reshape(-1), ignore_index=-100, reduction="sum")
    # PaLM's z-loss: z_loss_weight x logsumexp(logits)^2, summed over the trained targets (then / count, as the rest).
    z = (torch.logsumexp(logits, -1) ** 2 * (labels != -100)).sum()
    terms = []
    for k in range(1, D + 1):
        n, p = T - k, f"model.layers.{L + k - 1}."
        mixed = torch.cat((rms(emb[:, k:], w[p + "enorm.weight"], eps), rms(h[:, :n], w[p + "hnorm.weight"], eps)), -1)
        h, a = block(c, w, L + k - 1, F.linear(mixed, w[p + "eh_proj.weight"]), positions[:, :n], allowed[:, :n, :n])
        aux = aux + a
        target = labels[:, k:].masked_fill(documents[:, k:] != documents[:, :n], -100)
        logits = F.linear(rms(h, w[p + "shared_head.norm.weight"], eps), w["lm_head.weight"])
        ce = F.cross_entropy(logits.reshape(-1, c["vocab_size"]), target.reshape(-1), ignore_index=-100, reduction="sum")
        terms.append((ce, (target != -100).sum().item()))
        total = total + ce * c["mtp_loss_weight"] / D
    if z_loss_weight:
        terms.append((z, count.item()))
        total = total + z * z_loss_weight
    return total / count + aux, terms


def check(d):
    recipe = json.loads((d / "config.json").read_text())
    c, z_loss_weight = recipe["model"], recipe["train"]["z_loss_weight"]
    w = read_safetensors(d / "model.safetensors")
    grads = read_safetensors(d / "grads.safetensors")
    shape = (2, 12)
    read = lambda name: torch.frombuffer(bytearray((d / name).read_bytes()), dtype=torch.int64).reshape(shape)  # noqa: E731
    tokens, labels, positions, documents = read("tokens.bin"), read("labels.bin"), read("positions.bin"), read("documents.bin")
    for k, v in w.items():
        if not k.endswith("e_score_correction_bias"):
            v.requires_grad_(True)
    loss, terms = loss_of(c, w, tokens, labels, positions, documents, z_loss_weight)
    loss.backward()
    lines = (d / "loss.txt").read_text().split("\n")
    ours = float(lines[0])
    worst, where = 0.0, ""
    for name, g in grads.items():
        ref = w[name].grad if w[name].grad is not None else torch.zeros_like(g)  # an expert no token chose
        err = (ref - g).abs().max().item() / max(ref.abs().max().item(), 1e-12)
        if err > worst:
            worst, where = err, name
    depth_ok = True
    for k, (ce, count) in enumerate(terms, 1):
        s, n = (float(v) for v in lines[k].split())
        depth_ok &= abs(s - ce.item()) <= 1e-6 * abs(ce.item()) and n == count
        print(f"  term {k}: sum {s:.8f} vs reference {ce.item():.8f} over {int(n)} targets (reference {count})")
    print(f"{d.name}: loss {ours:.9f} vs reference {loss.item():.9f}; worst gradient {worst:.2e} of its largest element ({where}); "
          f"{len(grads)} gradients, {len([n for n in grads if n.startswith('model.layers.') and int(n.split('.')[2]) >= c['num_layers']])} "
          f"of them MTP's")
    # Gradients within 2e-6 of their largest element: fp32 sums in another order (one CPU's kernels
    # against another's: 1.05e-6 on an AMD EPYC with AVX2, under 1e-6 on a Xeon with AVX-512).
    return abs(ours - loss.item()) <= 1e-6 * abs(loss.item()) and worst <= 2e-6 and depth_ok


def main():
    torch.set_num_threads(1)
    ok = True
    for case in ("mtp1", "mtp2", "mtp1_zloss"):
        ok = check(Path(sys.argv[1]) / case) and ok
    if not ok:
        sys.exit("FAIL: dstrain's multi-token prediction or z-loss differs from the PyTorch reference")


if __name__ == "__main__":
    main()
