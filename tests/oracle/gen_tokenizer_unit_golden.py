#!/usr/bin/env python3
"""Golden data for tests/test_tokenizer_unit.cpp (levanter/data/tokenizer.hpp's own unit tests), from the Python
`tokenizers` library.

Usage (from the repository root, after tests/oracle/gen_tokenizer_golden.py has written the base tokenizers):
    python3 -m venv /tmp/tok-venv
    /tmp/tok-venv/bin/pip install -r tests/oracle/requirements-tokenizers.txt
    /tmp/tok-venv/bin/python tests/oracle/gen_tokenizer_unit_golden.py

Writes tests/golden/tokenizer_unit/golden.json:
  classes   [code point, class] pairs (1 letter \\p{L}, 2 number \\p{N}, 3 space \\s, 0 other) as the library's
            regex engine sees them: characters whose class changed since Python 3.11's Unicode 14 (every 16th)
            and random ones (checks include/levanter/data/unicode_tables.hpp)
  splits    for each known split regex (gpt2, llama3, qwen2): the byte lengths of the pieces that
            Split(Regex(pattern), "isolated") makes of each of `split_texts` (checks the hand-written scanners)
  variants  tokenizers derived from the committed ones in tests/golden/tokenizers/ by a JSON patch (RFC 6902
            "replace"/"add" operations, applied by the C++ test with nlohmann::json::patch), each with the SHA-256
            of its base file (so the test tells a stale golden from a bug), its vocab size and, for every one of
            `texts`: the ids with special tokens ("s") and without ("n", only where they differ), the decode of
            "s" with skip_special_tokens False ("d") and True ("k", only where it differs)
"""
import copy
import hashlib
import json
import os
import random
import unicodedata

import tokenizers
from tokenizers import Regex, Tokenizer, pre_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = os.path.join(ROOT, "tests", "golden", "tokenizers")
OUT = os.path.join(ROOT, "tests", "golden", "tokenizer_unit")

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")

TRICKY = [
    "", " ", "  ", "\n", "Hello world", " Hello  world ", "I'm you're we've they'll he'd it's 'S 'RE 'Ll \u017f '\u017f",
    "Don'T DON'T 'tis 'hello", "a\n\nb", "a \n\n b", "x   \t\n  y", "trailing   ", "   leading", "\r\n\r\nfoo\r\n",
    "12345678 1 22 333 4444", "\u0661\u0662\u0663 \u2167 \u00bd 3.14", "caf\u00e9 na\u00efve \u03a9\u03bc\u03ad\u03b3\u03b1 \u65e5\u672c\u8a9e",
    "emoji \U0001F600\U0001F44D\U0001F3FD family \U0001F468\u200d\U0001F469\u200d\U0001F467", "tabs\tand\u00a0nbsp\u2003em\u3000ideo",
    "zero\u200bwidth", "<|endoftext|>", "a<|endoftext|>b", " <|endoftext|> ", "<|endoftext|><|endoftext|>",
    "<|begin_of_text|>hi<|end_of_text|>", "<s>Hello</s> world <unk>", "x <tool>  y", "  <tool>  ", "hello world",
    "say hello world!", "xhello world", "_hello world", "Levanter levanter", " [MASK] x", "a  [MASK]",
    "$$$ ... !!! ??? ---", "a!!\n\n", "x ?!\r\n\n", "'''", "''s", "\u0085next\u2028line", "mixed123abc456",
    "\U0001D518\U0001D52B \U0001D7D9\U0001D7DA", "a\u0301 combining", "  \n  \n", "\t\t", "I've  got  'em", "tabs",
    "eee", "beekeeper", "a-e-e--eb", "ee ee e",
]
ALPHABET = list("abc XYZ'\n\t 0123!?.,_") + ["\u00e9", "\u65e5", "\U0001F600", "\u00a0", "\u2003", "<s>", "<|endoftext|>",
                                              "\u017f", "\u0661", "\r", "\u0301", "\u0085", "\u2167", "ab", "ld", "<tool>"]


def patch(doc, ops):
    doc = copy.deepcopy(doc)
    for op in ops:
        keys = op["path"].split("/")[1:]
        target = doc
        for k in keys[:-1]:
            target = target[int(k)] if isinstance(target, list) else target[k]
        last = keys[-1]
        if isinstance(target, list):
            if last == "-":
                target.append(op["value"])
            else:
                target[int(last)] = op["value"]
        else:
            target[last] = op["value"]
    return doc


def variants():
    meta = []
    for scheme in ("always", "first", "never"):
        for split in (True, False):
            ms = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme, "split": split}
            meta.append((f"metaspace_{scheme}_{int(split)}", "sentencepiece_style",
                         [{"op": "replace", "path": "/normalizer", "value": None},
                          {"op": "replace", "path": "/pre_tokenizer", "value": ms},
                          {"op": "replace", "path": "/decoder", "value": ms}]))
    extra_added = [{"id": 1200, "content": "ab", "single_word": False, "lstrip": False, "rstrip": False,
                    "normalized": True, "special": False},
                   {"id": 1201, "content": "ld", "single_word": False, "lstrip": True, "rstrip": True,
                    "normalized": True, "special": False},
                   {"id": 1202, "content": "<tool>", "single_word": False, "lstrip": False, "rstrip": True,
                    "normalized": False, "special": False}]
    return [
        ("gpt2_style", "gpt2_style", []),
        ("llama3_style", "llama3_style", []),
        ("sentencepiece_style", "sentencepiece_style", []),
        ("added_tokens", "added_tokens", []),
        ("gpt2_add_prefix_space", "gpt2_style", [{"op": "replace", "path": "/pre_tokenizer/add_prefix_space", "value": True}]),
        ("qwen2_style", "llama3_style",
         [{"op": "replace", "path": "/pre_tokenizer/pretokenizers/0/pattern/Regex", "value": QWEN2}]),
        ("split_gpt2_regex", "llama3_style",
         [{"op": "replace", "path": "/pre_tokenizer/pretokenizers/0/pattern/Regex", "value": GPT2},
          {"op": "replace", "path": "/model/ignore_merges", "value": False}]),
        ("llama3_merges_not_ignored", "llama3_style", [{"op": "replace", "path": "/model/ignore_merges", "value": False}]),
        ("sp_unk_fused", "sentencepiece_style", [{"op": "replace", "path": "/model/byte_fallback", "value": False}]),
        ("sp_unk", "sentencepiece_style", [{"op": "replace", "path": "/model/byte_fallback", "value": False},
                                           {"op": "replace", "path": "/model/fuse_unk", "value": False}]),
        ("sp_normalized_added", "sentencepiece_style",
         [{"op": "add", "path": "/added_tokens/-", "value": t} for t in extra_added]),
        ("roberta_processor", "gpt2_style",
         [{"op": "replace", "path": "/post_processor",
           "value": {"type": "RobertaProcessing", "sep": ["<|endoftext|>", 0], "cls": ["<|endoftext|>", 0],
                     "trim_offsets": True, "add_prefix_space": False}}]),
    ] + meta + [
        (f"split_string_{b}", "gpt2_style",
         [{"op": "replace", "path": "/pre_tokenizer",
           "value": {"type": "Sequence", "pretokenizers": [
               {"type": "Split", "pattern": {"String": "e"}, "behavior": b, "invert": False},
               {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}}])
        for b in ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")]


def main():
    random.seed(1234)
    texts = list(TRICKY)
    for _ in range(30):
        texts.append("".join(random.choice(ALPHABET) for _ in range(random.randint(1, 24))))
    split_texts = list(TRICKY)
    for _ in range(400):
        split_texts.append("".join(random.choice(ALPHABET) for _ in range(random.randint(1, 16))))

    classes = []
    probes = [pre_tokenizers.Split(Regex(p), behavior="removed") for p in (r"\p{L}", r"\p{N}", r"\s")]

    def observed(cp):
        for k, pt in enumerate(probes):
            if pt.pre_tokenize_str(chr(cp)) == []:
                return k + 1
        return 0

    def py_class(cp):
        c = chr(cp)
        if c.isspace() and unicodedata.category(c)[0] != "C" or cp in (0x85, 9, 10, 11, 12, 13):
            return 3
        return {"L": 1, "N": 2}.get(unicodedata.category(c)[0], 0)

    changed = [cp for cp in range(0x80, 0x110000) if not 0xD800 <= cp < 0xE000 and observed(cp) != py_class(cp)]
    sample = changed[::16] + [random.randrange(0x80, 0x110000) for _ in range(400)] + list(range(0, 0x80))
    classes = [[cp, observed(cp)] for cp in sorted(set(sample)) if not 0xD800 <= cp < 0xE000]

    splits = {}
    for name, pat in (("gpt2", GPT2), ("llama3", LLAMA3), ("qwen2", QWEN2)):
        pt = pre_tokenizers.Split(Regex(pat), behavior="isolated")
        splits[name] = [[len(p.encode("utf-8")) for p, _ in pt.pre_tokenize_str(s)] for s in split_texts]

    out_variants = []
    for name, base, ops in variants():
        with open(os.path.join(BASE, base, "tokenizer.json"), "rb") as f:
            raw = f.read()
        doc = patch(json.loads(raw.decode("utf-8")), ops)
        tok = Tokenizer.from_str(json.dumps(doc))
        cases = []
        for s in texts:
            ids = tok.encode(s, add_special_tokens=True).ids
            case = {"s": ids, "d": tok.decode(ids, skip_special_tokens=False)}
            plain = tok.encode(s, add_special_tokens=False).ids
            if plain != ids:
                case["n"] = plain
            skip = tok.decode(ids, skip_special_tokens=True)
            if skip != case["d"]:
                case["k"] = skip
            cases.append(case)
        out_variants.append({"name": name, "base": base, "base_sha256": hashlib.sha256(raw).hexdigest(), "patch": ops,
                             "vocab_size": tok.get_vocab_size(with_added_tokens=True), "cases": cases})

    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "golden.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers_version": tokenizers.__version__, "classes": classes, "texts": texts, "split_texts": split_texts,
                   "splits": splits, "variants": out_variants}, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
