#!/usr/bin/env python3
"""Golden token ids of upstream Levanter's document encoding (`BatchTokenizer`, levanter/data/text.py) for
tests/test_upstream_tokens.cpp: BOS/EOS added as text, and the long-text workaround.

Upstream's rule, applied here with the Hugging Face `tokenizers` library:
  * BOS is always requested and EOS follows `data.enforce_eos`; either is dropped when the tokenizer has no such
    token. The probe `encode("hi there")` (template applied) decides: EOS is added when its last id is not the EOS
    id, BOS when its first id is not the BOS id.
  * They are added as text: `bos_token + " " + text`, `text + " " + eos_token` (text.py:250-255).
  * Tokenizers whose normalizer is `Replace` or a `Sequence` (text.py:378-388) get the long-text workaround
    (text.py:287-312): while the text is longer than `workaround_len` characters (code points; 10,000 upstream), it
    is cut at the first white space (`regex` `\\s`) at or after character `workaround_len`, or at its end when there is
    none (leaving an empty last piece); every piece is encoded with the template and the ids are concatenated.

Usage (from the repository root):
    python3 -m venv /tmp/tok-venv
    /tmp/tok-venv/bin/pip install -r tests/oracle/requirements-tokenizers.txt
    /tmp/tok-venv/bin/python tests/oracle/gen_long_text_golden.py

`--check-upstream` also runs upstream's own `BatchTokenizer` (needs levanter and transformers, e.g. the venv of
requirements-upstream-train.txt) on every case and fails unless it gives the same ids:
    /tmp/lev-venv/bin/python tests/oracle/gen_long_text_golden.py --check-upstream

Writes tests/golden/tokenizers/long_text.json:
  tokenizers: {name: {bos_token, eos_token, append_bos, append_eos, splits_long_texts}}  (enforce_eos = true)
  cases: [{name, text, workaround_len, pieces: {tokenizer: number of pieces},
           ids: {tokenizer: [...]} for short cases, or count/fnv/head/tail for the 10,000-character ones}]
Ids are hashed as int32 little-endian bytes with FNV-1a-64 (offset 0xcbf29ce484222325, prime 0x100000001b3).
"""
import argparse
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer, normalizers

HERE = os.path.dirname(os.path.abspath(__file__))
TOKDIR = os.path.normpath(os.path.join(HERE, "..", "golden", "tokenizers"))
OUT = os.path.join(TOKDIR, "long_text.json")
TOKENIZERS = ["sentencepiece_style", "gpt2_style"]
MASK64 = (1 << 64) - 1

# Unicode White_Space, what the `regex` module's \s matches (checked code point by code point).
WHITE_SPACE = set([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680] + list(range(0x2000, 0x200B)) +
                  [0x2028, 0x2029, 0x202F, 0x205F, 0x3000])


def fnv_ids(ids):
    h = 0xCBF29CE484222325
    for b in b"".join(int(i).to_bytes(4, "little", signed=True) for i in ids):
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


def split_long(d, n):
    """BatchTokenizer._break_for_long_sequences for one document."""
    pieces = []
    while len(d) > n:
        split = next((i for i in range(n, len(d)) if ord(d[i]) in WHITE_SPACE), len(d))
        pieces.append(d[:split])
        d = d[split:]
    pieces.append(d)
    return pieces


class Upstream:
    def __init__(self, name):
        self.tok = Tokenizer.from_file(os.path.join(TOKDIR, name, "tokenizer.json"))
        with open(os.path.join(TOKDIR, name, "tokenizer_config.json")) as f:
            cfg = json.load(f)
        self.bos_token, self.eos_token = cfg.get("bos_token"), cfg.get("eos_token")
        bos = self.tok.token_to_id(self.bos_token) if self.bos_token else None
        eos = self.tok.token_to_id(self.eos_token) if self.eos_token else None
        probe = self.tok.encode("hi there").ids
        self.append_bos = bos is not None and probe[0] != bos
        self.append_eos = eos is not None and probe[-1] != eos
        self.splits = isinstance(self.tok.normalizer, (normalizers.Replace, normalizers.Sequence))

    def pieces(self, text, n):
        d = text
        if self.append_bos:
            d = self.bos_token + " " + d
        if self.append_eos:
            d = d + " " + self.eos_token
        return split_long(d, n) if self.splits else [d]

    def encode(self, text, n):
        return [i for p in self.pieces(text, n) for i in self.tok.encode(p).ids]


def words(rng, count, pool):
    return " ".join(rng.choice(pool) for _ in range(count))


def cases():
    rng = random.Random(1495)
    ascii_words = ["the", "cache", "holds", "tokens", "of", "every", "document", "Levanter", "reads", "windows",
                   "upstream", "splits", "long", "texts", "at", "white", "space", "42", "3.14", "don't"]
    uni_words = ["caf\u00e9", "na\u00efve", "\u65e5\u672c\u8a9e", "\U0001F600", "\u041f\u0440\u0438\u0432\u0435\u0442",
                 "\u0928\u092e\u0938\u094d\u0924\u0947", "x", "\u00e9t\u00e9", "\U0001F44D\U0001F3FD"]
    out = []
    # Short cases with a small workaround length: every id is kept.
    n = 40
    out.append(("short, no split", "a short text", n))
    out.append(("short, split at spaces", words(rng, 30, ascii_words), n))
    out.append(("white space exactly at the limit", "x" * (n - 4) + " " + "y" * 50 + " z", n))
    out.append(("no white space after the limit: an empty last piece", "ab " + "c" * 80, n))
    out.append(("multi-byte characters count as one", words(rng, 25, uni_words), n))
    out.append(("other white space splits (NBSP, ideographic space, tab, newline)",
                "p" * 38 + "\u00a0q" + "r" * 30 + "\u3000s" + "t" * 35 + "\tu" + "v" * 40 + "\nw", n))
    out.append(("runs of spaces", "a" * 39 + "     b" + "  c" * 20 + "   ", n))
    out.append(("the EOS text inside the document", "before </s> and <|endoftext|> " + words(rng, 12, ascii_words), n))
    # Upstream's own length.
    n = 10000
    out.append(("25,000 characters at upstream's 10,000", words(rng, 4000, ascii_words + uni_words), n))
    text = words(rng, 3000, ascii_words)[:9990].rstrip()
    text += "x" * (9995 - len(text))
    # With " </s>" added: 10,000 characters (not split), then 10,001 with no white space after the limit.
    out.append(("10,000 characters with the EOS text: not split", text, n))
    out.append(("10,001 characters with the EOS text: an empty last piece", text + "y", n))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-upstream", action="store_true")
    args = ap.parse_args()
    toks = {name: Upstream(name) for name in TOKENIZERS}
    doc = {"description": "upstream BatchTokenizer encodings (tests/oracle/gen_long_text_golden.py, tokenizers "
                          + tokenizers.__version__ + "); enforce_bos and enforce_eos true",
           "tokenizers": {name: {"bos_token": t.bos_token, "eos_token": t.eos_token, "append_bos": t.append_bos,
                                 "append_eos": t.append_eos, "splits_long_texts": t.splits}
                          for name, t in toks.items()},
           "cases": []}
    for name, text, n in cases():
        c = {"name": name, "text": text, "workaround_len": n, "pieces": {}, "ids": {}}
        for tname, t in toks.items():
            ids = t.encode(text, n)
            c["pieces"][tname] = len(t.pieces(text, n))
            if n < 1000:
                c["ids"][tname] = ids
            else:
                c["ids"][tname] = {"count": len(ids), "fnv": format(fnv_ids(ids), "016x"), "head": ids[:50],
                                   "tail": ids[-50:]}
        doc["cases"].append(c)
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=None, ensure_ascii=False)
        f.write("\n")
    for c in doc["cases"]:
        print(f"{c['name']}: {len(c['text'])} chars, pieces {c['pieces']}")

    if args.check_upstream:
        from levanter.data.text import BatchTokenizer
        from transformers import AutoTokenizer

        bad = 0
        for tname, t in toks.items():
            hf = AutoTokenizer.from_pretrained(os.path.join(TOKDIR, tname))
            for name, text, n in cases():
                bt = BatchTokenizer(hf, enforce_bos=True, enforce_eos=True, _workaround_len=n)
                got = bt([{"text": text}])[0]["input_ids"]
                got = [int(i) for i in got]
                if got != t.encode(text, n):
                    bad += 1
                    print(f"MISMATCH {tname} / {name}", file=sys.stderr)
        print("upstream BatchTokenizer agrees on every case" if not bad else f"{bad} mismatches")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
