#!/usr/bin/env python3
"""Golden data for tests/test_tokenizer_hostile.cpp: small tokenizer.json files with overlapping added tokens
(one a substring of another; special or not; lstrip, rstrip, single_word; normalized or not; the same content twice)
and edge-case normalizers and decoders (Replace with an empty pattern, a content holding its pattern, a pattern with
regex metacharacters, Prepend, Sequences of them), encoded by the Python `tokenizers` library.

Usage (from the repository root):
    python3 -m venv /tmp/tok-venv
    /tmp/tok-venv/bin/pip install -r tests/oracle/requirements-tokenizers.txt
    /tmp/tok-venv/bin/python tests/oracle/gen_tokenizer_hostile_golden.py

Writes tests/golden/tokenizer_hostile/golden.json:
  model     the BPE model every case shares (printable ASCII, "\u2581", "\\t", "\u00e9"; no merges)
  cases     [{"name", "tokenizer" (a tokenizer.json without "model"), "texts", "ids" (encode(text).ids per text),
            "decoded" (decode(ids, skip_special_tokens=False) per text), "vocab_size"}]

Left out, because the library itself does not give one answer: two added tokens whose matched text is the same
(a duplicate pattern in its Aho-Corasick automaton: the winner changes from one process to the next), inputs on which
it panics or aborts (an lstrip start past an rstrip end; in random cases, a Replace that deletes characters), and the
Metaspace "first" scheme after a normalizer (it tests the original offset, which a deleting Replace moves).
"""
import json
import os
import random

from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "golden", "tokenizer_hostile")

VOCAB = {chr(c): i for i, c in enumerate(range(32, 127))}
for extra in ("\u2581", "\t", "\u00e9"):
    VOCAB[extra] = len(VOCAB)
MODEL = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
         "vocab": VOCAB, "merges": []}
ALPHABET = ["a", "b", "<", ">", "|", " ", " ", "\t", "x", "\u00e9", ".", "*"]


def added(content, special=False, lstrip=False, rstrip=False, single_word=False, normalized=None):
    return {"id": 0, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def replace(pattern, content):
    return {"type": "Replace", "pattern": {"String": pattern}, "content": content}


def doc(added_tokens=(), normalizer=None, pre_tokenizer=None, decoder=None):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": list(added_tokens),
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": None, "decoder": decoder}


def hand_written():
    ab = ["<|a|>", "<|a|><|b|>", "<|b|>", "x<|a|><|b|>y", " <|a|><|b|> <|a|> ", "<|a|><|a|><|b|><|b|>", "ab", "b ab",
          "a b", "aab", " ab b ", "abab", "<|a|>ab<|b|>b", "", " ", "a.b a*b", "aaaa", "\u00e9\u00e9"]
    cases = []
    for sp1 in (False, True):
        for sp2 in (False, True):
            for n1 in (False, True):
                cases.append((f"overlap_special{int(sp1)}{int(sp2)}_normalized{int(n1)}",
                              doc([added("<|a|>", sp1, normalized=n1), added("<|a|><|b|>", sp2, normalized=not n1),
                                   added("ab", sp2, normalized=n1), added("b", sp1, normalized=not n1)]), ab))
    for flag in ("lstrip", "rstrip", "single_word"):
        cases.append((f"overlap_{flag}", doc([added("<|a|>", **{flag: True}), added("<|a|><|b|>"),
                                              added("b", **{flag: True}), added("ab", special=True)]), ab))
    cases.append(("same_content_twice_last_wins",
                  doc([added("ab", lstrip=True), added("<|b|>"), added("ab", special=True, rstrip=True)]), ab))
    cases.append(("same_content_twice_flags_of_the_last",
                  doc([added("ab", lstrip=True, normalized=False), added("ab", rstrip=True, normalized=False)]), ab))
    cases.append(("empty_added_token_is_ignored", doc([added(""), added("<|b|>"), added("zz")]), ab))
    for pattern, content in (("", "X"), ("", ""), ("", "\u00e9"), ("a", "aa"), ("a", "ba"), ("aa", "a"), ("ab", "ba"),
                             ("a.b", "Q"), ("*", ".*"), (" ", "\u2581")):
        name = f"replace_{pattern!r}_{content!r}".encode("ascii", "backslashreplace").decode()
        cases.append((name, doc([added("<|a|>"), added("ab")], replace(pattern, content),
                                decoder=replace(content, pattern) if content else None), ab))
    cases.append(("replace_sequence_growing",
                  doc([added("<|a|>", special=True), added("aa")],
                      {"type": "Sequence", "normalizers": [replace("a", "aa")] * 4 + [replace("", "b")]}), ab))
    cases.append(("replace_then_prepend",
                  doc([added("b", rstrip=True)], {"type": "Sequence", "normalizers": [
                      replace("", "a"), {"type": "Prepend", "prepend": "\u2581"}, replace("a", "\u2581a")]},
                      {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}), ab))
    return cases


def random_case(rng):
    def normalizer():
        def one():
            if rng.random() < 0.75:
                contents = ["a", "x", "ab", "ba", "  "]  # deleting ones can crash the library (an abort)
                return replace(rng.choice(["", "a", "b", "ab", " ", "<", "x", "."]), rng.choice(contents))
            return {"type": "Prepend", "prepend": rng.choice(["x", "\u2581", "a"])}
        r = rng.random()
        if r < 0.4:
            return None
        return one() if r < 0.7 else {"type": "Sequence", "normalizers": [one() for _ in range(rng.randint(1, 3))]}

    norm = normalizer()
    r = rng.random()
    pre = None
    if r > 0.6:
        schemes = ["always", "never"] + (["first"] if norm is None else [])
        pre = ({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": rng.choice(schemes),
                "split": rng.random() < 0.5} if r < 0.8 else
               {"type": "Split", "pattern": {"String": rng.choice([" ", "a", "<"])}, "invert": False,
                "behavior": rng.choice(["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"])})
    toks = []
    for _ in range(rng.randint(1, 5)):
        content = "".join(rng.choice(["a", "b", "<", ">", "|", "ab", " ", "x"]) for _ in range(rng.randint(1, 4)))
        special = rng.random() < 0.5
        toks.append(added(content, special, rng.random() < 0.3, rng.random() < 0.3, rng.random() < 0.2,
                          rng.random() < 0.5 if rng.random() < 0.8 else not special))
    texts = ["".join(rng.choice(ALPHABET + [t["content"] for t in toks] * 2) for _ in range(rng.randint(0, 8)))
             for _ in range(12)]
    return doc(toks, norm, pre), texts


def ambiguous(tok):
    """Whether two added tokens (by id, the last entry's flags) match the same text in the same automaton."""
    patterns = set()
    for id_, t in tok.get_added_tokens_decoder().items():
        text = t.content
        if t.normalized and tok.normalizer is not None:
            text = tok.normalizer.normalize_str(text)
        if (t.normalized, text) in patterns:
            return True
        patterns.add((t.normalized, text))
    return False


def run(name, d, texts):
    full = dict(d, model=MODEL)
    try:
        tok = Tokenizer.from_str(json.dumps(full))
        if ambiguous(tok):
            return None
        ids = [tok.encode(t).ids for t in texts]
        decoded = [tok.decode(i, skip_special_tokens=False) for i in ids]
    except BaseException:  # the library's panics (pyo3_runtime.PanicException) included
        return None
    return {"name": name, "tokenizer": d, "texts": texts, "ids": ids, "decoded": decoded,
            "vocab_size": tok.get_vocab_size()}


def main():
    cases = []
    for name, d, texts in hand_written():
        c = run(name, d, texts)
        assert c is not None, name
        cases.append(c)
    rng = random.Random(20261125)
    while len(cases) < 200:
        d, texts = random_case(rng)
        c = run(f"random_{len(cases)}", d, texts)
        if c is not None:
            cases.append(c)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "golden.json"), "w", encoding="utf-8") as f:
        json.dump({"model": MODEL, "cases": cases}, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases to {OUT}/golden.json")


if __name__ == "__main__":
    main()
