#!/usr/bin/env python3
"""The special-token ids an export must carry, and an export's tokenizer, checked by Hugging Face transformers.

    python3 tests/oracle/check_hf_export_tokenizer.py --golden   # writes tests/golden/hf_export_tokenizer_ids.json
    python3 tests/oracle/check_hf_export_tokenizer.py DIR        # checks an export_lm_to_hf output directory

--golden loads each committed tokenizer directory (tests/golden/tokenizers/<name>) with
transformers.AutoTokenizer and records its bos_token_id and eos_token_id: what config.json must say for a model
trained with that tokenizer (tests/hf_programs.sh compares export_lm_to_hf's config.json with it).

DIR mode: AutoTokenizer, AutoConfig and GPT2LMHeadModel load the export; config.json's bos_token_id and
eos_token_id equal the tokenizer's; generate() from a prompt stops at (and only at) the tokenizer's EOS, i.e.
transformers treats the same id as the end of text that training did. Exit 1 on any mismatch.

Uses the venv of gen_hf_gpt2_golden.py (requirements-hf.txt: torch, transformers, tokenizers).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_hf_gpt2_golden import ensure_venv  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZERS = os.path.join(ROOT, "tests", "golden", "tokenizers")
OUT = os.path.join(ROOT, "tests", "golden", "hf_export_tokenizer_ids.json")


def golden():
    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    out = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__, "tokenizers_dirs": {}}
    for name in sorted(os.listdir(TOKENIZERS)):
        d = os.path.join(TOKENIZERS, name)
        if not os.path.exists(os.path.join(d, "tokenizer.json")):
            continue
        tok = AutoTokenizer.from_pretrained(d)
        out["tokenizers_dirs"][name] = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
                                        "vocab_size": len(tok)}
        print(name, out["tokenizers_dirs"][name])
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote", OUT)


def check(d):
    import torch
    from transformers import AutoConfig, AutoTokenizer, GPT2LMHeadModel

    errors = []
    tok = AutoTokenizer.from_pretrained(d)
    config = AutoConfig.from_pretrained(d)
    print(f"tokenizer bos={tok.bos_token_id} eos={tok.eos_token_id}; config.json bos={config.bos_token_id} "
          f"eos={config.eos_token_id} vocab={config.vocab_size}")
    if config.bos_token_id != tok.bos_token_id:
        errors.append(f"config.json bos_token_id {config.bos_token_id} != tokenizer's {tok.bos_token_id}")
    if config.eos_token_id != tok.eos_token_id:
        errors.append(f"config.json eos_token_id {config.eos_token_id} != tokenizer's {tok.eos_token_id}")
    model = GPT2LMHeadModel.from_pretrained(d).float().eval()
    if model.generation_config.eos_token_id != tok.eos_token_id:
        errors.append(f"generation eos {model.generation_config.eos_token_id} != tokenizer's {tok.eos_token_id}")
    # Make EOS the most likely next token everywhere: generation must stop right after the prompt.
    with torch.no_grad():
        model.lm_head.weight.data.zero_()
        model.lm_head.weight.data[tok.eos_token_id] = 1.0
        model.transformer.ln_f.bias.data.fill_(10.0)
        model.transformer.ln_f.weight.data.zero_()
    prompt = tok("the quick brown fox", return_tensors="pt")
    gen = model.generate(**prompt, max_new_tokens=8, do_sample=False, pad_token_id=tok.eos_token_id)
    new = gen[0, prompt["input_ids"].shape[1]:].tolist()
    print("generated after the prompt:", new)
    if new != [tok.eos_token_id]:
        errors.append(f"generate() did not stop at the tokenizer's EOS {tok.eos_token_id}: {new}")
    for e in errors:
        print("FAIL:", e)
    print("OK" if not errors else f"{len(errors)} problem(s)")
    return 0 if not errors else 1


if __name__ == "__main__":
    ensure_venv(__file__)
    if len(sys.argv) == 2 and sys.argv[1] == "--golden":
        golden()
    elif len(sys.argv) == 2:
        sys.exit(check(sys.argv[1]))
    else:
        print(__doc__)
        sys.exit(2)
