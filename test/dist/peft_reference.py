"""A LoRA export checked with PEFT itself (issue 59).

peft_reference.py BASE ADAPTER VAL SEQ_LEN WANT [MERGED]
  BASE     the Hugging Face model the run started from (model.init_from)
  ADAPTER  dstrain's export of the run: adapter_config.json + adapter_model.safetensors; "none":
           only MERGED is checked (any exported model: dist.evaluation uses it so)
  VAL      a byte-level text file: windows of SEQ_LEN + 1 bytes, as dstrain's evaluation cuts them
  WANT     dstrain's validation loss on those windows
  MERGED   optional: the run's `export-hf --merge`, loaded by plain transformers

peft_reference.py make BASE OUT VAL SEQ_LEN R ALPHA TARGET...
  makes a PEFT adapter on BASE (random A and B, as a trained one would be; rsLoRA) for dstrain's
  lora.init_from, saves it to OUT and prints its loss on VAL's windows (VAL "-": no loss); a TARGET
  param:NAME is a target_parameters entry (transformers 5's fused experts: param:mlp.experts.gate_up_proj)

PeftModel.from_pretrained must take every tensor of the file and leave no adapter weight
unloaded (PEFT's own state dict has exactly the file's keys, bit for bit; the routed experts'
per-expert adapters as PEFT under transformers 5 fuses them), and its loss, and the merged
model's, must equal dstrain's (1e-6 relative, fp32).
"""
import re
import sys

import torch
import transformers


def loss(model, path, seq_len):
    data = torch.tensor(list(open(path, "rb").read()), dtype=torch.int64)
    n = (data.numel() - 1) // seq_len
    windows = torch.stack([data[i * seq_len:i * seq_len + seq_len + 1] for i in range(n)])
    total, count = 0.0, 0
    with torch.no_grad():
        for b in range(0, n, 8):
            w = windows[b:b + 8]
            logits = model(w[:, :-1]).logits.double()
            total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1), reduction="sum").item()
            count += w[:, 1:].numel()
    return total / count


def fused_experts(stored):
    """The file's tensors as PEFT under transformers 5 holds them: a DeepSeek model's routed experts are
    fused 3-D parameters there, targeted as target_parameters (gate_up_proj inside down_proj), so PEFT
    stacks the per-expert adapters: A [E * r, in] expert-major, B [out, r * E] rank-major, gate and up
    joined at rank 2r (A's rows concatenated, B block-diagonal), as its weight conversion does."""
    expert = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.(lora_A|lora_B)\.weight$")
    out, groups = {}, {}
    for k, v in stored.items():
        m = expert.match(k)
        if not m:
            out[k] = v
            continue
        groups.setdefault(m[1], {}).setdefault((m[3], m[4]), {})[int(m[2])] = v
    for prefix, parts in groups.items():
        def stack(p, lora):
            return torch.stack([parts[(p, lora)][e] for e in sorted(parts[(p, lora)])])
        gate_b, up_b = stack("gate_proj", "lora_B"), stack("up_proj", "lora_B")
        out[f"{prefix}.base_layer.lora_A.weight"] = torch.cat([stack("gate_proj", "lora_A"), stack("up_proj", "lora_A")], 1).flatten(0, 1)
        block = torch.stack([torch.block_diag(gate_b[e], up_b[e]) for e in range(gate_b.size(0))])
        out[f"{prefix}.base_layer.lora_B.weight"] = block.permute(2, 0, 1).flatten(0, 1).T
        out[f"{prefix}.lora_A.weight"] = stack("down_proj", "lora_A").flatten(0, 1)
        out[f"{prefix}.lora_B.weight"] = stack("down_proj", "lora_B").permute(2, 0, 1).flatten(0, 1).T
    return out


def load(d):
    return transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()


def make(base, out, val, seq_len, r, alpha, targets):
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(7)
    modules = [t for t in targets if not t.startswith("param:")]
    parameters = [t[len("param:"):] for t in targets if t.startswith("param:")]
    model = get_peft_model(load(base), LoraConfig(r=r, lora_alpha=alpha, target_modules=modules, target_parameters=parameters or None,
                                                  use_rslora=True, init_lora_weights=False, task_type="CAUSAL_LM"))
    model.eval().save_pretrained(out)
    if val != "-":
        print(repr(loss(model, val, seq_len)))


def main():
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7]), sys.argv[8:])
        return
    base, adapter, val, seq_len, want = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    if adapter == "none":
        got = loss(load(sys.argv[6]), val, seq_len)
        print(f"dstrain val_loss {want:.9f}, the merged export {got:.9f}: relative {abs(got - want) / want:.2e}")
        sys.exit(0 if abs(got - want) <= 1e-6 * want else 1)
    from peft import PeftModel  # here: the merged-only check needs transformers alone
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import load_file
    model = PeftModel.from_pretrained(load(base), adapter).eval()
    stored = load_file(f"{adapter}/adapter_model.safetensors")
    loaded = get_peft_model_state_dict(model)
    experts = sum(1 for k in stored if ".mlp.experts." in k)
    if experts:
        stored = fused_experts(stored)
    if set(stored) != set(loaded):
        sys.exit(f"keys PEFT does not take: {sorted(set(stored) - set(loaded))[:4]}; adapter weights the file lacks: "
                 f"{sorted(set(loaded) - set(stored))[:4]}")
    differ = [k for k in stored if not torch.equal(stored[k].contiguous(), loaded[k].to(stored[k].dtype))]
    if differ:
        sys.exit(f"PEFT holds other values than the file for {differ[:4]}")
    fused = f" ({experts} routed experts' fused into {sum(1 for k in stored if '.mlp.experts.' in k)})" if experts else ""
    print(f"PEFT took all {len(stored)} tensors of the adapter{fused}, bit for bit")
    failed = False
    checks = [("PEFT on the base", model)] + ([("the merged export", load(sys.argv[6]))] if len(sys.argv) > 6 else [])
    for name, m in checks:
        got = loss(m, val, seq_len)
        rel = abs(got - want) / want
        print(f"dstrain val_loss {want:.9f}, {name} {got:.9f}: relative {rel:.2e}")
        failed = failed or rel > 1e-6
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
