#!/usr/bin/env python3
"""The reference side of test/model/fp8_test.sh: DeepSeek's block-scaled FP8 checkpoint format
written and read by PyTorch code of its own, independent of dstrain's.

  make ROOT           a tiny DeepSeek-V3 made by transformers (ROOT/hf, float32), quantized to the
                      release format twice: ROOT/fp8 (128 x 128 blocks, float scales, two shards
                      whose index puts scales in the other shard) and ROOT/fp8_ue8m0 (16 x 32
                      blocks, power-of-two scales); for each, its weights dequantized as DeepSeek's
                      weight_dequant (ROOT/<name>_dequant, a float32 folder transformers loads),
                      transformers' logits on tokens.bin and its loss on ROOT/val.bin.
  same A B            every tensor of folder B equals folder A's, bit for bit (A: the reference).
  dequant SRC OUT     SRC's weights dequantized by the reference into the float32 folder OUT.
  check-export ORIG FP8   FP8 (dstrain's export of ORIG) is the release format: the right tensors
                      in float8_e4m3fn, one scale per block, within half a float8 step of ORIG.
  logits DIR          dstrain's logits (DIR/dstrain_logits.bin) against transformers' on the
                      dequantized weights, within 1e-6 of their scale.
"""
import json
import math
import re
import shutil
import sys
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

FP8_LINEAR = re.compile(r"(self_attn\.(q_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)"
                        r"|mlp\.(experts\.\d+\.|shared_experts\.)?(gate_proj|up_proj|down_proj))\.weight$")
T = 32  # evaluation window


def tiny_v3_config():
    return transformers.DeepseekV3Config(
        vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, routed_scaling_factor=2.5,
        kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, n_group=2, topk_group=1,
        num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=True, max_position_embeddings=64,
        tie_word_embeddings=False)


def read_folder(d):
    """Every tensor of a Hugging Face folder, by name, as stored."""
    d = Path(d)
    index = d / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    out = {}
    for f in files:
        with safe_open(d / f, "pt") as s:
            for k in s.keys():
                out[k] = s.get_tensor(k)
    return out


def weight_dequant(w, s, block):
    """DeepSeek's inference/kernel.py weight_dequant, block by block as its Triton kernel does."""
    br, bc = block
    out = torch.empty(w.shape, dtype=torch.float32)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            out[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc].float() * s[i, j].float()
    return out


def quantize(w, block, ue8m0):
    """Per block: s = amax / 448 (ue8m0: the power of two at or above), stored w / s in float8_e4m3fn."""
    br, bc = block
    rows, cols = w.shape
    grid = (math.ceil(rows / br), math.ceil(cols / bc))
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn)
    s = torch.empty(grid, dtype=torch.float32)
    for i in range(grid[0]):
        for j in range(grid[1]):
            b = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            scale = b.abs().max() / 448.0
            if scale.item() == 0:
                scale = torch.tensor(1.0)
            if ue8m0:
                m, e = math.frexp(scale.item())
                scale = torch.tensor(math.ldexp(1.0, e - 1 if m == 0.5 else e))
            s[i, j] = scale
            q[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = (b / s[i, j]).to(torch.float8_e4m3fn)
    return q, s


def dequantized(tensors, config):
    """A folder's tensors as float32: FP8 through weight_dequant, the rest widened."""
    block = config["quantization_config"]["weight_block_size"]
    out = {}
    for k, v in tensors.items():
        if k.endswith("_scale_inv"):
            continue
        out[k] = weight_dequant(v, tensors[k + "_scale_inv"], block) if v.element_size() == 1 else v.float()
    return out


def write_float_folder(src, tensors, out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((Path(src) / "config.json").read_text())
    config.pop("quantization_config", None)
    config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "model.safetensors", metadata={"format": "pt"})


def write_fp8_folder(hf, out, block, ue8m0, shards):
    """hf's weights in DeepSeek's release format: FP8 Linear weights with their scales, the rest
    bf16, the router's bias float32. With two shards, each scale goes into the shard its weight is not in."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = read_folder(hf)
    files = [{} for _ in range(shards)]
    for n, (k, v) in enumerate(sorted(tensors.items())):
        home = n % shards
        if FP8_LINEAR.search(k):
            q, s = quantize(v, block, ue8m0)
            files[home][k] = q
            files[(home + 1) % shards][k + "_scale_inv"] = s
        elif k.endswith("e_score_correction_bias"):
            files[home][k] = v.float()
        else:
            files[home][k] = v.to(torch.bfloat16)
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)] if shards > 1 else ["model.safetensors"]
    for name, f in zip(names, files):
        save_file(f, out / name, metadata={"format": "pt"})
    if shards > 1:
        weight_map = {k: name for name, f in zip(names, files) for k in f}
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))
    config = json.loads((hf / "config.json").read_text())
    config["dtype"] = "bfloat16"
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                     "weight_block_size": list(block)}
    if ue8m0:
        config["quantization_config"]["scale_fmt"] = "ue8m0"
    (out / "config.json").write_text(json.dumps(config, indent=2))


def load(d):
    return transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()


def make(root):
    root = Path(root)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(tiny_v3_config())
    with torch.no_grad():
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(8) * 0.05)
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(torch.exp(torch.randn(p.shape[0], 1)))  # rows of unlike magnitude: scales that differ per block
        model.model.layers[0].self_attn.o_proj.weight[:16].zero_()  # a block of zeros
    model.save_pretrained(root / "hf")
    tokens = torch.randint(0, 320, (2, 24), generator=torch.Generator().manual_seed(1))
    val = torch.randint(0, 256, (8 * T + 1,), generator=torch.Generator().manual_seed(2), dtype=torch.int64)
    (root / "val.bin").write_bytes(bytes(val.tolist()))
    for name, block, ue8m0, shards in [("fp8", (128, 128), False, 2), ("fp8_ue8m0", (16, 32), True, 1)]:
        d = root / name
        write_fp8_folder(root / "hf", d, block, ue8m0, shards)
        (d / "tokens.bin").write_bytes(tokens.numpy().tobytes())
        ref = root / (name + "_dequant")
        write_float_folder(d, dequantized(read_folder(d), json.loads((d / "config.json").read_text())), ref)
        m = load(ref)
        with torch.no_grad():
            logits = m(tokens).logits.float()
            windows = torch.stack([val[i * T:i * T + T + 1] for i in range(8)])
            lg = m(windows[:, :-1]).logits.double()
            loss = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.size(-1)), windows[:, 1:].reshape(-1)).item()
        (ref / "logits.bin").write_bytes(logits.contiguous().numpy().tobytes())
        (ref / "loss.json").write_text(json.dumps({"loss": loss}))
        print(f"{name}: blocks {block[0]}x{block[1]}, {'ue8m0' if ue8m0 else 'float'} scales, {shards} shard(s); "
              f"transformers' loss on the dequantized weights {loss:.9f}")


def same(a, b):
    want, got = read_folder(a), read_folder(b)
    if set(want) != set(got):
        sys.exit(f"FAIL: {b} holds {sorted(set(got) ^ set(want))[:4]}... unlike {a}")
    for k in want:
        if want[k].dtype != got[k].dtype or not torch.equal(want[k], got[k]):
            sys.exit(f"FAIL: {b}: '{k}' differs from {a} ({got[k].dtype} vs {want[k].dtype})")
    print(f"{b}: {len(want)} tensors bit-identical to {a}")


def dequant(src, out):
    write_float_folder(src, dequantized(read_folder(src), json.loads((Path(src) / "config.json").read_text())), out)


def check_export(orig, fp8):
    config = json.loads((Path(fp8) / "config.json").read_text())
    q = config.get("quantization_config", {})
    if q.get("quant_method") != "fp8" or q.get("fmt") != "e4m3" or q.get("weight_block_size") != [128, 128]:
        sys.exit(f"FAIL: {fp8}/config.json: quantization_config {q}")
    ue8m0 = q.get("scale_fmt") == "ue8m0"
    want, got = read_folder(orig), read_folder(fp8)
    n8 = 0
    for k, w in want.items():
        v = got[k]
        if FP8_LINEAR.search(k):
            s = got[k + "_scale_inv"]
            grid = [math.ceil(w.shape[0] / 128), math.ceil(w.shape[1] / 128)]
            if v.dtype != torch.float8_e4m3fn or s.dtype != torch.float32 or list(s.shape) != grid:
                sys.exit(f"FAIL: '{k}': {v.dtype}, scales {s.dtype} {list(s.shape)} (want float8_e4m3fn, float32 {grid})")
            if ue8m0 and not torch.equal(torch.log2(s), torch.round(torch.log2(s))):
                sys.exit(f"FAIL: '{k}': ue8m0 scales that are not powers of two")
            back = weight_dequant(v, s, (128, 128))
            se = s.repeat_interleave(128, 0)[:w.shape[0]].repeat_interleave(128, 1)[:, :w.shape[1]]
            bound = torch.maximum(w.abs() * 2.0 ** -4, se * 2.0 ** -10) * (1 + 1e-6)
            if not bool(((back - w).abs() <= bound).all()):
                sys.exit(f"FAIL: '{k}': an element beyond half a float8 step of its block")
            n8 += 1
        elif k.endswith("e_score_correction_bias"):
            if v.dtype != torch.float32 or not torch.equal(v, w):
                sys.exit(f"FAIL: '{k}' is not the float32 bias")
        elif v.dtype != torch.bfloat16 or not torch.equal(v, w.to(torch.bfloat16)):
            sys.exit(f"FAIL: '{k}' is not the bfloat16 of the original ({v.dtype})")
    print(f"{fp8}: {n8} FP8 weights within half a float8 step of every block, {'ue8m0' if ue8m0 else 'amax/448'} scales; "
          f"the other {len(want) - n8} tensors bf16 (router bias float32)")


def logits(d, ref):
    expected = torch.frombuffer(bytearray((Path(ref) / "logits.bin").read_bytes()), dtype=torch.float32)
    got = torch.frombuffer(bytearray((Path(d) / "dstrain_logits.bin").read_bytes()), dtype=torch.float32)
    diff = (got - expected).abs().max().item() / expected.abs().max().item()
    print(f"{d}: dstrain's logits against transformers' on the dequantized weights: max diff / max |logit| = {diff:.2e}")
    if not diff <= 1e-6:
        sys.exit("FAIL: the logits differ by more than 1e-6")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"make": make, "same": same, "dequant": dequant, "check-export": check_export, "logits": logits}[cmd](*args)
