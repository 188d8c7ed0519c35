#!/usr/bin/env python3
"""Checks a lora_lm export with the real `peft` (tests/lora_program.sh runs it when a Python with torch, transformers
and peft is configured: -DLEVANTER_PEFT_PYTHON=/path/to/venv/bin/python; requirements-peft.txt).

    check_lora_peft.py BASE_HF_DIR PEFT_DIR MERGED_DIR

1. PeftModel.from_pretrained(base, PEFT_DIR) loads every adapter tensor (none missing, none unexpected).
2. Our merged export equals base + B.A * alpha / r, per weight, computed here from the adapter file (1e-6).
3. The PEFT model's logits equal transformers' logits of our merged export on a fixed batch (1e-4): the merged
   export is our model (its HF parity is what tests/golden/hf_* check), so PEFT reproduces our model.
4. peft's own merge_and_unload gives the same weights as our merged export (1e-6).
"""
import json
import sys

import numpy as np
import torch
from peft import PeftModel
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM


def main():
    base_dir, peft_dir, merged_dir = sys.argv[1:4]
    torch.manual_seed(0)
    cfg = json.load(open(f"{peft_dir}/adapter_config.json"))
    scale = cfg["lora_alpha"] / cfg["r"]
    fan_in_fan_out = cfg["fan_in_fan_out"]

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    base_sd = {k: v.detach().numpy().copy() for k, v in base.state_dict().items()}
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    merged_sd = {k: v.detach().numpy() for k, v in merged.state_dict().items()}

    # 2. merged = base + scale * B.A (transposed for GPT-2's Conv1D {in, out} weights)
    adapters = load_file(f"{peft_dir}/adapter_model.safetensors")
    n = 0
    for key, a in adapters.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[len("base_model.model."):-len(".lora_A.weight")]
        b = adapters[key.replace(".lora_A.", ".lora_B.")]
        delta = scale * (b.astype(np.float64) @ a.astype(np.float64))
        if fan_in_fan_out:
            delta = delta.T
        w = module + ".weight"
        want = base_sd[w].astype(np.float64) + delta
        err = np.abs(merged_sd[w] - want).max()
        assert err < 1e-6, f"{w}: merged export differs from base + B.A*alpha/r by {err}"
        n += 1
    assert n > 0, "the adapter file holds no lora_A tensors"
    print(f"merged export = base + B.A*{scale:g} on {n} weights")

    # 1. PEFT loads every tensor
    model = PeftModel.from_pretrained(base, peft_dir).eval()
    loaded = {k for k in model.state_dict() if "lora_" in k}
    assert len(loaded) == len(adapters), f"PEFT made {len(loaded)} adapter tensors, the file has {len(adapters)}"

    # 3. logits
    vocab = base.config.vocab_size
    positions = getattr(base.config, "n_positions", None) or base.config.max_position_embeddings
    ids = torch.randint(0, min(vocab, 60), (2, min(16, positions)))
    with torch.no_grad():
        ours = merged(ids).logits
        theirs = model(ids).logits
    err = (ours - theirs).abs().max().item()
    assert err < 1e-4, f"PEFT logits differ from our merged export's by {err}"
    print(f"PEFT logits = merged export logits (max difference {err:.2e})")

    # 4. peft's merge
    unloaded = model.merge_and_unload()
    for k, v in unloaded.state_dict().items():
        if k in merged_sd:
            err = np.abs(v.detach().numpy() - merged_sd[k]).max()
            assert err < 1e-6, f"{k}: peft's merge_and_unload differs from our merged export by {err}"
    print("peft merge_and_unload = merged export")
    print("OK")


if __name__ == "__main__":
    main()
