#!/usr/bin/env python3
"""Check a GPT-2 export written by the C++ side against Hugging Face transformers.

    python3 tests/oracle/check_hf_export.py DIR     # venv as in gen_hf_gpt2_golden.py
    python3 tests/oracle/check_hf_export.py --self-test

DIR holds config.json, model.safetensors (or shards + model.safetensors.index.json) and
levanter_logits.h5 with datasets tokens int32 [B, T] and logits float32 [B, T, V] from the C++
model. Fails (exit 1) if AutoConfig cannot read config.json, if from_pretrained reports a missing,
mismatched or newly initialised weight, or unless max|diff| <= 1e-4 * max(1, max|hf logits|).
--self-test builds good and broken directories from tests/golden/ and checks the verdicts.
"""

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_hf_gpt2_golden import GOLDEN, ensure_venv  # noqa: E402


def compare_logits(d, model, errors):
    """Runs `model` on the tokens of DIR/levanter_logits.h5 and appends to `errors` unless its logits equal ours
    to 1e-4 * max(1, max|logits|)."""
    import h5py
    import numpy as np
    import torch

    with h5py.File(os.path.join(d, "levanter_logits.h5"), "r") as f:
        tokens = np.asarray(f["tokens"])
        ours = np.asarray(f["logits"], dtype=np.float32)
    with torch.no_grad():
        ref = model(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()
    if ours.shape != ref.shape:
        errors.append(f"logits shape {ours.shape} != transformers' {ref.shape}")
        return
    diff = float(np.abs(ours - ref).max())
    tol = 1e-4 * max(1.0, float(np.abs(ref).max()))
    print(f"tokens {tokens.shape}, max|logits| {np.abs(ref).max():.6g}, max|diff| {diff:.3g} (tol {tol:.3g})")
    if not diff <= tol:
        errors.append(f"max|diff| {diff:.3g} > tol {tol:.3g}")


def check(d):
    import h5py
    import numpy as np
    import torch
    from transformers import AutoConfig, GPT2LMHeadModel

    errors = []
    config = AutoConfig.from_pretrained(d)
    print(f"config: model_type={config.model_type} vocab={config.vocab_size} n_embd={config.n_embd} "
          f"n_layer={config.n_layer} n_head={config.n_head} n_positions={config.n_positions} "
          f"act={config.activation_function} eps={config.layer_norm_epsilon}")
    if config.model_type != "gpt2":
        errors.append(f"model_type is {config.model_type!r}, not 'gpt2'")

    model, info = GPT2LMHeadModel.from_pretrained(d, output_loading_info=True)
    model = model.float().eval()
    for key, value in info.items():
        print(f"loading info {key}: {value if value else 'none'}")
    for key in ("missing_keys", "mismatched_keys", "error_msgs"):
        if info.get(key):
            errors.append(f"{key}: {info[key]}")
    if model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
        print("note: lm_head.weight is not tied to wte.weight")

    compare_logits(d, model, errors)

    for e in errors:
        print("FAIL:", e)
    print("OK" if not errors else f"FAILED ({len(errors)} problems)")
    return not errors


def self_test():
    import h5py
    import numpy as np

    with h5py.File(os.path.join(GOLDEN, "hf_gpt2_tiny_logits.h5"), "r") as f:
        tokens, logits = np.asarray(f["tokens"]), np.asarray(f["logits"])
    verdicts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for src, case, scale in [("", "ok", 1.0), ("_sharded", "sharded_ok", 1.0),
                                 ("_noprefix", "noprefix_ok", 1.0), ("", "bad_logits", 1.01)]:
            d = os.path.join(tmp, case)
            shutil.copytree(os.path.join(GOLDEN, "hf_gpt2_tiny" + src), d)
            with h5py.File(os.path.join(d, "levanter_logits.h5"), "w") as f:
                f["tokens"], f["logits"] = tokens, logits * scale
            print(f"=== {case}")
            verdicts[case] = check(d)
        d = os.path.join(tmp, "missing_weight")  # noprefix copy with one tensor dropped
        shutil.copytree(os.path.join(tmp, "noprefix_ok"), d)
        from safetensors.torch import load_file, save_file
        sd = load_file(os.path.join(d, "model.safetensors"))
        del sd["h.1.mlp.c_fc.bias"]
        save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        print("=== missing_weight")
        verdicts["missing_weight"] = check(d)
    expected = {"ok": True, "sharded_ok": True, "noprefix_ok": True, "bad_logits": False, "missing_weight": False}
    print("self-test verdicts:", verdicts)
    return verdicts == expected


def main():
    ensure_venv(__file__)
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    ok = self_test() if sys.argv[1] == "--self-test" else check(sys.argv[1])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
