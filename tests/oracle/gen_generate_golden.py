#!/usr/bin/env python3
"""Generates tests/golden/generate/greedy.json: greedy continuations by `transformers`' `generate()` of the tiny
Hugging Face models the other goldens use (tests/golden/hf_gpt2_tiny and tests/golden/hf_llama/*), for
tests/test_generate.cpp (our generate() with a KV cache must give the same tokens).

Each model: float32, eager attention, eval mode, `do_sample=False`, exactly `max_new_tokens` new tokens (the EOS id is
unset, so nothing stops or forbids a token), from two fixed prompts of ids below the vocabulary size.

Usage: python3 tests/oracle/gen_generate_golden.py [--out tests/golden/generate/greedy.json]
(re-runs itself in $HF_VENV, default /tmp/hf-venv, made from requirements-hf.txt; see README-hf.md)
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "golden")
VENV = os.environ.get("HF_VENV", "/tmp/hf-venv")

MODELS = ["hf_gpt2_tiny"] + ["hf_llama/" + n for n in [
    "llama_mha", "llama_gqa_tied_linear", "llama_mqa_llama3", "llama_yarn_headdim", "mistral_sw", "qwen2_sw", "qwen3",
    "gemma_mqa", "gemma2_softcap", "gemma3_local", "olmo2_gqa", "mixtral_top2"]]


def ensure_venv():
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    py = os.path.join(VENV, "bin", "python")
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
        subprocess.check_call([os.path.join(VENV, "bin", "pip"), "install", "-q", "-r",
                               os.path.join(HERE, "requirements-hf.txt")])
    os.execv(py, [py] + sys.argv)


def main():
    ensure_venv()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(GOLDEN, "generate", "greedy.json"))
    args = parser.parse_args()
    torch.manual_seed(0)
    cases = []
    for name in MODELS:
        path = os.path.join(GOLDEN, name)
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager")
        model.eval()
        # No EOS: generation runs to max_new_tokens and every token is the plain argmax (min_new_tokens would
        # instead forbid the EOS token, which our greedy decoding may pick).
        model.generation_config.eos_token_id = None
        model.config.eos_token_id = None
        cfg = model.config
        vocab = cfg.vocab_size
        positions = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", 64)
        total = min(positions, 24)
        for prompt in ([3, 17, 5], [(7 * i + 2) % vocab for i in range(9)]):
            new = total - len(prompt)
            with torch.no_grad():
                out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new,
                                     attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                     pad_token_id=0)
            assert out.shape[1] == len(prompt) + new
            cases.append({"model": name, "prompt": prompt, "tokens": [int(t) for t in out[0][len(prompt):]]})
        print(name, cases[-1]["tokens"])
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"generator": "tests/oracle/gen_generate_golden.py", "transformers_version": transformers.__version__,
                   "torch_version": torch.__version__, "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
