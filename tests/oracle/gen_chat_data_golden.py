#!/usr/bin/env python3
"""Generates tests/golden/chat_data/: the golden token ids and assistant masks of multi-turn chat records, as upstream
Levanter's ChatProcessor makes them (`tokenizer.apply_chat_template(messages, tokenize=True,
return_assistant_tokens_mask=True, return_dict=True, chat_template=...)` in `transformers`).

Written files:
* tokenizer.json: the small Llama-3-style byte-level BPE of tests/golden/tokenizers/llama3_style with chat special
  tokens added (<|start_header_id|>, <|end_header_id|>, <|eot_id|>, <|im_start|>, <|im_end|>);
* tokenizer_config.json: its bos/eos tokens and, as `chat_template`, the "llama3_gen" template below (so the C++
  side also reads a template from the tokenizer's own config);
* golden.json: the templates (each with `{% generation %}` blocks, as upstream requires when user turns are masked)
  and, per (template, conversation), the rendered text, `input_ids` and `assistant_masks`; and `upstream_packs`:
  upstream Levanter's own MultiturnChatDataset over the "chatml_gen" rows at seq_len 128 (tokens, segment ids and
  loss mask of every example, 64 segments per example and 1).

Usage: python gen_chat_data_golden.py [--out tests/golden/chat_data]
Requirements: tests/oracle/requirements-hf.txt (transformers, tokenizers, jinja2) and upstream Levanter with JAX on
the CPU (tests/oracle/requirements-data-order.txt); one venv with both:
  /tmp/order-venv/bin/python tests/oracle/gen_chat_data_golden.py
"""

import argparse
import copy
import json
import os

import transformers
from tokenizers import AddedToken, Tokenizer
from transformers import PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = os.path.join(HERE, "..", "golden", "tokenizers", "llama3_style", "tokenizer.json")

CHAT_SPECIALS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"]

TEMPLATES = {
    # Llama 3 layout; the assistant's text and its <|eot_id|> are the generation.
    "llama3_gen": (
        "{{ bos_token }}{% for message in messages %}"
        "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
        "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim }}<|eot_id|>"
        "{% endgeneration %}{% else %}{{ message['content'] | trim }}<|eot_id|>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    # ChatML (Qwen) with a default system message; the newline after <|im_end|> is outside the generation.
    "chatml_gen": (
        "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
        "<|im_start|>{{ message['role'] }}\n{% if message['role'] == 'assistant' %}{% generation %}"
        "{{ message['content'] }}<|im_end|>{% endgeneration %}\n{% else %}{{ message['content'] }}<|im_end|>\n"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    # Tulu / OLMo 2 layout with plain-text role markers and the EOS inside the generation.
    "tulu_gen": (
        "{% for message in messages %}{% if message['role'] == 'system' %}<|system|>\n{{ message['content'] }}\n"
        "{% elif message['role'] == 'user' %}<|user|>\n{{ message['content'] }}\n"
        "{% elif message['role'] == 'assistant' %}<|assistant|>\n{% generation %}{{ message['content'] }}"
        "{{ eos_token }}{% endgeneration %}\n{% endif %}{% endfor %}"
    ),
    # A generation that starts with a space and ends inside a word: the span's edges fall inside tokens.
    "space_gen": (
        "{% for message in messages %}{% if message['role'] == 'assistant' %}Assistant:{% generation %} "
        "{{ message['content'] }}{% endgeneration %}\n{% else %}{{ message['role'] | capitalize }}: "
        "{{ message['content'] }}\n{% endif %}{% endfor %}"
    ),
}

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there!"}, {"role": "assistant", "content": "Hello. How can I help?"}],
    [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "What is 2 + 2?"},
     {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3 + 3?"},
     {"role": "assistant", "content": "6, which is 2 * 3."}],
    [{"role": "user", "content": "Translate 'café' to English."}, {"role": "assistant", "content": "coffee shop ☕"},
     {"role": "user", "content": "Danke schön — and this: ünïcödé?"},
     {"role": "assistant", "content": "  leading and trailing spaces  "}],
    [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}, {"role": "user", "content": "three"},
     {"role": "assistant", "content": "four"}, {"role": "user", "content": "five"},
     {"role": "assistant", "content": "six\nseven\n\neight"}, {"role": "user", "content": "the last user turn"}],
    [{"role": "system", "content": "Multi\nline\nsystem"}, {"role": "user", "content": "x"},
     {"role": "assistant", "content": "日本語のテキスト and emoji 🙂🙂"}],
    [{"role": "user", "content": "Tell me a story."},
     {"role": "assistant", "content": "Once upon a time, " * 12 + "the end."}],
]


def make_tokenizer(out_dir):
    tok = Tokenizer.from_file(BASE)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHAT_SPECIALS])
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    with open(os.path.join(HERE, "..", "golden", "tokenizers", "llama3_style", "tokenizer_config.json")) as f:
        base_cfg = json.load(f)
    cfg = {"bos_token": base_cfg["bos_token"], "eos_token": base_cfg["eos_token"],
           "chat_template": TEMPLATES["llama3_gen"], "model_max_length": 131072,
           "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return PreTrainedTokenizerFast(tokenizer_file=path, bos_token=cfg["bos_token"], eos_token=cfg["eos_token"])


def upstream_packs(rows, seq_len=128):
    """Upstream Levanter's MultiturnChatDataset (the pinned release) over the given rows, as its cache would hold
    them: every example's tokens, segment ids and loss mask, with 64 segments per example and with 1."""
    import tempfile
    import types

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import haliax as hax
    import numpy as np
    from levanter.data.text import MultiturnChatDataset
    from levanter.store.jagged_array import JaggedArrayStore

    Pos = hax.Axis("position", seq_len)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        ids = JaggedArrayStore.open(os.path.join(tmp, "input_ids"), mode="w", item_rank=1, dtype=np.int32)
        masks = JaggedArrayStore.open(os.path.join(tmp, "assistant_masks"), mode="w", item_rank=1, dtype=np.int32)
        ids.extend([np.array(r["input_ids"], dtype=np.int32) for r in rows])
        masks.extend([np.array(r["assistant_masks"], dtype=np.int32) for r in rows])
        cache = types.SimpleNamespace(store=types.SimpleNamespace(tree={"input_ids": ids, "assistant_masks": masks}),
                                      await_finished=lambda: None)
        for max_segments in (64, 1):
            ds = MultiturnChatDataset(cache, Pos, max_segments_per_example=max_segments, mask_user_turns=True)
            sync = ds.as_sync_dataset()
            examples = []
            for ex in sync.get_batch(list(range(len(sync)))):
                seg = ex.attn_mask.segment_ids
                seg = seg[0] if isinstance(seg, tuple) else seg
                examples.append({"tokens": [int(x) for x in np.asarray(ex.tokens.array)],
                                 "segment_ids": [int(x) for x in np.asarray(seg.array)],
                                 "loss_mask": [int(x) for x in np.asarray(ex.loss_mask.array)]})
            out.append({"seq_len": seq_len, "max_segments": max_segments, "examples": examples})
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(HERE, "..", "golden", "chat_data"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    hf = make_tokenizer(args.out)
    cases = []
    for tname, template in TEMPLATES.items():
        for i, conv in enumerate(CONVERSATIONS):
            text = hf.apply_chat_template(conv, tokenize=False, chat_template=template)
            out = hf.apply_chat_template(copy.deepcopy(conv), tokenize=True, chat_template=template,
                                         return_assistant_tokens_mask=True, return_dict=True)
            ids = list(out["input_ids"])
            mask = list(out["assistant_masks"])
            assert ids == hf(text, add_special_tokens=False)["input_ids"]
            assert any(mask), (tname, i)
            cases.append({"template": tname, "conversation": i, "text": text, "input_ids": ids,
                          "assistant_masks": mask})
    golden = {"generator": "tests/oracle/gen_chat_data_golden.py", "transformers_version": transformers.__version__,
              "templates": TEMPLATES, "conversations": CONVERSATIONS, "cases": cases,
              "upstream_packs": upstream_packs([c for c in cases if c["template"] == "chatml_gen"])}
    with open(os.path.join(args.out, "golden.json"), "w") as f:
        json.dump(golden, f, ensure_ascii=False)
        f.write("\n")
    print(f"{len(cases)} cases written to {args.out}")


if __name__ == "__main__":
    main()
