#!/usr/bin/env python3
"""Generates tests/golden/chat_data_sp/: token ids and assistant masks of chat records under SentencePiece-style
tokenizers (a normalizer or a Metaspace pre-tokenizer that rewrites the text before the model sees it), as
`transformers`' `apply_chat_template(..., return_assistant_tokens_mask=True)` makes them (what upstream Levanter's
chat processing calls). The masks come from transformers' offset mapping back to the rendered text, so they test
that our token ends follow the text through the normalizer.

Written files:
* normalizer/tokenizer.json: tests/golden/tokenizers/sentencepiece_style (BPE with byte fallback, normalizer
  Prepend("▁") + Replace(" " -> "▁"), as Llama 2 and Mistral ship it) with chat special tokens added;
* metaspace/tokenizer.json: the same model with no normalizer and a Metaspace pre-tokenizer (prepend_scheme
  "first", as newer Llama 2 conversions ship it);
* each directory's tokenizer_config.json (bos/eos tokens, the "mistral_gen" template);
* golden.json: the templates and, per (tokenizer, template, conversation), the rendered text, `input_ids` and
  `assistant_masks`.

Usage: python gen_chat_masks_sp_golden.py [--out tests/golden/chat_data_sp]
Requirements: tests/oracle/requirements-hf.txt (transformers, tokenizers, jinja2).
"""

import argparse
import copy
import json
import os

import transformers
from tokenizers import AddedToken, Tokenizer, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from gen_chat_data_golden import CONVERSATIONS as BYTE_LEVEL_CONVERSATIONS
from gen_chat_data_golden import TEMPLATES as BYTE_LEVEL_TEMPLATES

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = os.path.join(HERE, "..", "golden", "tokenizers", "sentencepiece_style", "tokenizer.json")

CHAT_SPECIALS = ["[INST]", "[/INST]", "<start_of_turn>", "<end_of_turn>"]

TEMPLATES = {
    # Mistral / Llama 2 layout: the system text leads the first user turn; the answer and its EOS are the generation.
    "mistral_gen": (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}"
        "{% set turns = messages[1:] %}{% else %}{% set turns = messages %}{% endif %}{% for message in turns %}"
        "{% if message['role'] == 'user' %}[INST] {% if loop.first and sys is defined %}{{ sys }}\n\n{% endif %}"
        "{{ message['content'] }} [/INST]{% elif message['role'] == 'assistant' %}{% generation %}"
        "{{ message['content'] }}{{ eos_token }}{% endgeneration %}{% endif %}{% endfor %}"
    ),
    # Gemma layout: turns between special tokens, the assistant's named "model".
    "gemma_gen": (
        "{{ bos_token }}{% for message in messages %}{% if message['role'] != 'system' %}<start_of_turn>"
        "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n{% if message['role'] == 'assistant' %}"
        "{% generation %}{{ message['content'] | trim }}<end_of_turn>\n{% endgeneration %}{% else %}"
        "{{ message['content'] | trim }}<end_of_turn>\n{% endif %}{% endif %}{% endfor %}"
    ),
    # Plain-text roles, a generation that starts with a space: the span's first character is the one the
    # normalizer turns into "▁", inside a token (the byte-level golden's template).
    "space_gen": BYTE_LEVEL_TEMPLATES["space_gen"],
}

# The byte-level golden's conversations: system or not, several turns, non-ASCII text, spaces at the edges.
CONVERSATIONS = BYTE_LEVEL_CONVERSATIONS


def make_tokenizer(out_dir, variant):
    tok = Tokenizer.from_file(BASE)
    if variant == "metaspace":
        spec = json.loads(tok.to_str())
        spec["normalizer"] = None
        tok = Tokenizer.from_str(json.dumps(spec))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHAT_SPECIALS])
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "chat_template": TEMPLATES["mistral_gen"],
           "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return PreTrainedTokenizerFast(tokenizer_file=path, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(HERE, "..", "golden", "chat_data_sp"))
    args = parser.parse_args()
    cases = []
    for variant in ("normalizer", "metaspace"):
        hf = make_tokenizer(os.path.join(args.out, variant), variant)
        for tname, template in TEMPLATES.items():
            for i, conv in enumerate(CONVERSATIONS):
                text = hf.apply_chat_template(conv, tokenize=False, chat_template=template)
                out = hf.apply_chat_template(copy.deepcopy(conv), tokenize=True, chat_template=template,
                                             return_assistant_tokens_mask=True, return_dict=True)
                ids = list(out["input_ids"])
                mask = list(out["assistant_masks"])
                assert ids == hf(text, add_special_tokens=False)["input_ids"], (variant, tname, i)
                assert any(mask), (variant, tname, i)
                cases.append({"tokenizer": variant, "template": tname, "conversation": i, "text": text,
                              "input_ids": ids, "assistant_masks": mask})
    golden = {"generator": "tests/oracle/gen_chat_masks_sp_golden.py", "transformers_version": transformers.__version__,
              "templates": TEMPLATES, "conversations": CONVERSATIONS, "cases": cases}
    with open(os.path.join(args.out, "golden.json"), "w") as f:
        json.dump(golden, f, ensure_ascii=False)
        f.write("\n")
    print(f"{len(cases)} cases written to {args.out}")


if __name__ == "__main__":
    main()
