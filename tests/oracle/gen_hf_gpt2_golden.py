#!/usr/bin/env python3
"""Golden Hugging Face GPT-2 checkpoints and logits from the real `transformers` + `torch` (CPU).

Run from anywhere; the script creates/updates its venv ($HF_VENV, default /tmp/hf-venv) from
tests/oracle/requirements-hf.txt and re-runs itself there:

    python3 tests/oracle/gen_hf_gpt2_golden.py

Writes under tests/golden/:
  hf_gpt2_tiny/           GPT2LMHeadModel.save_pretrained(dir, safe_serialization=True)
  hf_gpt2_tiny_sharded/   the same with max_shard_size="20KB" (+ model.safetensors.index.json)
  hf_gpt2_tiny_noprefix/  the same weights via safetensors.torch.save_file, names without
                          "transformer.", no lm_head (layout of the hub `gpt2` checkpoint and of
                          upstream Levanter's export), plus the same config.json
  hf_gpt2_tiny_logits.h5  datasets tokens int32 [2,16], logits float32 [2,16,101]; root attributes
                          hold the package versions

Every parameter is overwritten after init (LayerNorm weights 1 + 0.1*N(0,1), everything else
0.1*N(0,1), torch.Generator seeded 0, drawn in named_parameters() order) so a wrong mapping shows.

check_hf_export.py and check_checkpoint_h5py.py import ensure_venv() from here.
"""

import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GOLDEN = os.path.join(ROOT, "tests", "golden")
REQS = os.path.join(HERE, "requirements-hf.txt")
VENV = os.environ.get("HF_VENV", "/tmp/hf-venv")


def ensure_venv(script):
    """Re-exec `script` under the venv, creating or updating it from requirements-hf.txt first.

    Set HF_TORCH_INDEX to a CPU-only torch wheel index to avoid the large CUDA wheels of PyPI."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for the hub
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    py = os.path.join(VENV, "bin", "python")
    stamp = os.path.join(VENV, "requirements-hf.installed")
    with open(REQS) as f:
        wanted = f.read()
    if not (os.path.exists(stamp) and open(stamp).read() == wanted):
        if not os.path.exists(py):
            subprocess.check_call([sys.executable, "-m", "venv", VENV])
        pip = [py, "-m", "pip", "install", "-q"]
        index = os.environ.get("HF_TORCH_INDEX")
        if index:
            torch_pin = next(l.strip() for l in wanted.splitlines() if l.startswith("torch=="))
            subprocess.check_call(pip + ["--index-url", index, torch_pin])
        subprocess.check_call(pip + ["-r", REQS])
        with open(stamp, "w") as f:
            f.write(wanted)
    os.execv(py, [py, os.path.abspath(script)] + sys.argv[1:])


def versions():
    import importlib.metadata as md
    pkgs = ["torch", "transformers", "safetensors", "tokenizers", "huggingface_hub", "h5py", "numpy"]
    out = {p: md.version(p) for p in pkgs}
    out["python"] = sys.version.split()[0]
    return out


def make_model():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=101, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                        activation_function="gelu_new", layer_norm_epsilon=1e-5,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        # the defaults (50256) lie outside this vocabulary; transformers warns
                        bos_token_id=100, eos_token_id=100)
    model = GPT2LMHeadModel(config).float().eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():  # lm_head.weight is tied to wte: listed once
            noise = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
            is_ln_weight = name.endswith(".weight") and (".ln_" in name or name.startswith("transformer.ln_"))
            p.copy_(1.0 + noise if is_ln_weight else noise)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    return model


def tokens_array():
    import numpy as np
    tokens = np.random.default_rng(7).integers(0, 101, size=(2, 16)).astype(np.int32)
    tokens[0, 0], tokens[0, 5], tokens[1, 15], tokens[1, 3] = 0, 100, 100, 0
    return tokens


def describe(path):
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return [(k, tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in sorted(f.keys())]


def main():
    ensure_venv(__file__)
    import h5py
    import json
    import numpy as np
    import torch
    from safetensors.torch import save_file

    model = make_model()
    out_dirs = {k: os.path.join(GOLDEN, "hf_gpt2_tiny" + k) for k in ("", "_sharded", "_noprefix")}
    for d in out_dirs.values():
        shutil.rmtree(d, ignore_errors=True)

    model.save_pretrained(out_dirs[""], safe_serialization=True)
    model.save_pretrained(out_dirs["_sharded"], safe_serialization=True, max_shard_size="20KB")

    noprefix = {}
    for name, t in model.state_dict().items():
        if name.startswith("lm_head."):
            continue
        assert name.startswith("transformer."), name
        noprefix[name[len("transformer."):]] = t.detach().clone().contiguous()
    os.makedirs(out_dirs["_noprefix"])
    save_file(noprefix, os.path.join(out_dirs["_noprefix"], "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(out_dirs[""], "config.json"), out_dirs["_noprefix"])

    tokens = tokens_array()
    with torch.no_grad():
        logits = model(torch.from_numpy(tokens).long()).logits.float().numpy()
    h5_path = os.path.join(GOLDEN, "hf_gpt2_tiny_logits.h5")
    with h5py.File(h5_path, "w") as f:
        f.create_dataset("tokens", data=tokens)
        f.create_dataset("logits", data=logits.astype(np.float32))
        for k, v in versions().items():
            f.attrs[k + "_version"] = v
        f.attrs["description"] = ("GPT2LMHeadModel(tests/golden/hf_gpt2_tiny) eval mode, float32, "
                                  "logits = model(tokens).logits")

    # summary
    print("versions:", json.dumps(versions()))
    for key, d in out_dirs.items():
        files = sorted(os.listdir(d))
        print(f"{d}: " + ", ".join(f"{n} ({os.path.getsize(os.path.join(d, n))} B)" for n in files))
    for name, shape, dtype in describe(os.path.join(out_dirs[""], "model.safetensors")):
        print(f"  {name:40s} {dtype} {list(shape)}")
    print(f"{h5_path}: {os.path.getsize(h5_path)} B, tokens {tokens.shape}, logits {logits.shape}, "
          f"max|logits| {np.abs(logits).max():.4f}")


if __name__ == "__main__":
    main()
