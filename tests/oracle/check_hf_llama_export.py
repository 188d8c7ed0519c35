#!/usr/bin/env python3
"""Loads C++ exports of the Llama family in `transformers` and compares their logits with ours.

    LEVANTER_HF_EXPORT_CHECK_DIR=/tmp/llama-exports build/tests/haliax_test_llama -tc='*export*'
    python3 tests/oracle/check_hf_llama_export.py /tmp/llama-exports/*

Each DIR holds config.json + model.safetensors written by levanter::hf::save and levanter_logits.h5 (tokens
int32 [B, S], logits float32 [B, S, V]: our model's). The script loads DIR with AutoModelForCausalLM (float32,
eager attention), fails (exit 1) on missing, unexpected or mismatched tensors, and requires
max|ours - transformers| <= 1e-4 * max(1, max|logits|). Uses the venv of gen_hf_gpt2_golden.py (transformers 5.23).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from check_hf_export import compare_logits  # noqa: E402
from gen_hf_gpt2_golden import ensure_venv  # noqa: E402


def check(d):
    from transformers import AutoConfig, AutoModelForCausalLM

    errors = []
    config = AutoConfig.from_pretrained(d)
    print(f"{d}: model_type={config.model_type} layers={config.num_hidden_layers} heads={config.num_attention_heads}"
          f" kv_heads={config.num_key_value_heads} rope={getattr(config, 'rope_parameters', None)}"
          f" sliding_window={getattr(config, 'sliding_window', None)}"
          f" layer_types={getattr(config, 'layer_types', None)} tied={config.tie_word_embeddings}")
    model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, attn_implementation="eager")
    model = model.float().eval()
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info.get(key):
            errors.append(f"{key}: {info[key]}")
    compare_logits(d, model, errors)
    for e in errors:
        print(f"  FAIL: {e}")
    return not errors


def main():
    ensure_venv(os.path.abspath(__file__))
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    results = [check(d) for d in sys.argv[1:]]
    print(f"{sum(results)}/{len(results)} exports load in transformers and reproduce our logits")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
