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
        saved[f"{name}.dequantized"] = F.dequantize_4bit(q, state).float().contiguous()
    save_file(saved, out)
    print(f"{len(weights)} weights quantized by bitsandbytes into {out}")


def qlora_loss(base, adapter, val, seq_len, want):
    import transformers
    from peft import PeftModel
    config = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                             bnb_4bit_compute_dtype=torch.float32)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, quantization_config=config, device_map="cpu",
                                                              attn_implementation="eager")
    quantized = sum(1 for m in model.modules() if type(m).__name__ == "Linear4bit")
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
