"""QLoRA (lora.base: nf4) checked with bitsandbytes itself (issue 59).

qlora_reference.py codes OUT
  random weights (float32 and bfloat16; sizes a multiple of 64 and not, odd; a block of zeros;
  maxima over several powers of ten) quantized by bitsandbytes as transformers' load_in_4bit does
  (quantize_4bit: nf4, blocksize 64, compress_statistics) on the CPU, saved with its codes, its
  quantized block maxima, their scales and offset, and the dequantized weights, for the unit test
  [nf4-bnb] to compare with dstrain's bit for bit.

qlora_reference.py loss BASE ADAPTER VAL SEQ_LEN WANT
  BASE loaded by transformers in 4-bit (BitsAndBytesConfig: nf4, double quantization, float32
  compute), dstrain's exported ADAPTER on it with PeftModel.from_pretrained; its loss on VAL's
  windows must be WANT, dstrain's evaluation of the QLoRA run (1e-5 relative).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peft_reference import loss  # noqa: E402  (the windows as dstrain's evaluation cuts them)


def codes(out):
    import bitsandbytes.functional as F
    from safetensors.torch import save_file
    torch.manual_seed(11)
    weights = {
        "square": torch.randn(128, 64) * 0.02,
        "ragged": torch.randn(37, 50),  # 1850 elements: a partial last block, an even count
        "odd": torch.randn(7, 9) * 3,  # 63 elements: one partial block, an odd count
        "bf16": (torch.randn(96, 80) * 0.05).bfloat16(),
        "zeros": torch.cat([torch.zeros(64), torch.randn(448) * 0.1]).view(8, 64),
        "scales": (torch.randn(300, 64) * torch.logspace(-4, 2, 300).view(-1, 1)),  # 300 maxima: two blocks of them
    }
    saved = {}
    for name, w in weights.items():
        q, state = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
        saved[f"{name}.weight"] = w.contiguous()
        saved[f"{name}.codes"] = q.view(-1).contiguous()
        saved[f"{name}.absmax_codes"] = state.absmax.contiguous()
        saved[f"{name}.absmax_scales"] = state.state2.absmax.contiguous()
        saved[f"{name}.absmax_offset"] = state.offset.view(1).float().contiguous()
        generic = generic_dequantized(q, state)
        native = F.dequantize_4bit(q, state)
        if not torch.equal(native, generic):
            print(f"note: {name} ({w.dtype}, {tuple(w.shape)}): bitsandbytes' CPU kernel dequantizes other values than its generic "
                  f"path (max |diff| {(native.float() - generic.float()).abs().max().item():.3g}); the generic path is the reference")
        saved[f"{name}.dequantized"] = generic.float().contiguous()
    save_file(saved, out)
    print(f"{len(weights)} weights quantized by bitsandbytes into {out}")


def generic_dequantized(q, state):
    """bitsandbytes' portable dequantization (backends/default: float32 products rounded once, "matches C++ / CUDA
    behavior" as its source says). Its AVX512 CPU kernel for bfloat16 (bitsandbytes 0.50.2) gives other values when a
    row is not a whole number of blocks, so the kernel a CPU happens to pick is not the reference."""
    import bitsandbytes.functional as F
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code
    absmax = (F.dequantize_blockwise(state.absmax, state.state2) + state.offset).float()  # as F.dequantize_4bit (nested)
    return _dequantize_4bit_compute(q.view(torch.uint8).reshape(-1), absmax, _get_4bit_code("nf4", q.device), state.blocksize,
                                    state.shape, state.dtype)


def qlora_loss(base, adapter, val, seq_len, want):
    import transformers
    from peft import PeftModel
    config = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                             bnb_4bit_compute_dtype=torch.float32)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, quantization_config=config, device_map="cpu",
                                                              attn_implementation="eager")
    quantized = 0
    for m in model.modules():
        if type(m).__name__ == "Linear4bit":
            # bitsandbytes' fused AVX512-BF16 CPU inference (taken in eval mode where the CPU has it) repacks the
            # weight for bf16 kernels and refuses out_features not a multiple of 32: the dequantize-then-matmul
            # path is the reference, as on every other machine.
            m.support_avx512bf16_for_cpu = False
            quantized += 1
    model = PeftModel.from_pretrained(model, adapter).eval()
    got = loss(model, val, seq_len)
    rel = abs(got - want) / want
    print(f"dstrain val_loss {want:.9f}, PEFT on bitsandbytes' 4-bit base ({quantized} Linear4bit) {got:.9f}: relative {rel:.2e}")
    sys.exit(0 if rel <= 1e-5 else 1)


def main():
    if sys.argv[1] == "codes":
        codes(sys.argv[2])
    elif sys.argv[1] == "loss":
        qlora_loss(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6]))
    else:
        sys.exit(f"unknown command {sys.argv[1]}")


if __name__ == "__main__":
    main()
