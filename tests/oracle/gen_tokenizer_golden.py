#!/usr/bin/env python3
"""Train small tokenizers with Hugging Face `tokenizers` and write golden encodings for tests/test_tokenizer.cpp.

Usage (from the repository root):
    python3 -m venv /tmp/tok-venv
    /tmp/tok-venv/bin/pip install -r tests/oracle/requirements-tokenizers.txt
    /tmp/tok-venv/bin/python tests/oracle/gen_tokenizer_golden.py [--no-train]

Writes under tests/golden/tokenizers/:
  <name>/tokenizer.json, <name>/tokenizer_config.json   trained tokenizers (gpt2_style, llama3_style,
                                                        sentencepiece_style, added_tokens)
  <name>/patch.json       qwen2_style, metaspace_style: another tokenizer with top-level keys replaced
  <name>/meta.json        vocab_size, bos/eos ids, adds_bos/adds_eos as Levanter derives them
  <name>/encode_golden.txt per generated document: id count, FNV-1a-64 of the ids, decode check (format below)
  corpus.txt              per generated document: UTF-8 byte length and FNV-1a-64 of its bytes (low 32 bits)
  tricky.json             hand-picked strings with their full id lists and decode outputs for every tokenizer
                          (ids_nospecial / decode_skip only where they differ from ids / decode)
  random_decode.json      decode() of random id lists (split UTF-8 characters, specials, out-of-range ids)
  errors/                 tokenizer.json files the C++ loader must refuse (or, for `odd_regex`, get right)

--no-train reuses the tokenizer.json files already there (retraining is deterministic for a given `tokenizers`
version, but pinning the committed vocabularies keeps the goldens stable across versions).

The document generator (`Doc`/`gen_doc`) is mirrored byte for byte by tests/tokenizer_corpus.hpp; corpus.txt's
header carries FNV-1a-64 over all documents (each followed by a 0xFF byte) so the C++ side can check it.

encode_golden.txt format ('#' lines are comments):
  corpus docs=<n> fnv=<hex16>
  prefix <json string>                        what decode() puts before the text (e.g. "<s> ", the BOS)
  d <count> <fnv ids hex16> <decode>          one per document, in order; ids = encode(text).ids (special
                                              tokens added); <decode> is '=' when decode(ids) == text, '^'
                                              when decode(ids) == prefix + text, else the FNV-1a-64 (hex16)
                                              of decode(ids) (skip_special_tokens=False)
  n <doc> <count> <fnv hex16> <decode_skip>   for every 16th document: encode(text, add_special_tokens=False)
                                              and decode(those ids, skip_special_tokens=True), coded as above
                                              ('^' is not used)
Ids are hashed as int32 little-endian bytes. FNV-1a-64: offset 0xcbf29ce484222325, prime 0x100000001b3.
"""
import argparse
import glob
import hashlib
import json
import os
import sys

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "golden", "tokenizers"))

NUM_DOCS = 5000
VOCAB_SIZE = 1200
NOSPECIAL_EVERY = 16
MASK64 = (1 << 64) - 1

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# ---------------------------------------------------------------------------------------------------------------
# Deterministic text generator (mirrored in tests/tokenizer_corpus.hpp: keep both in step)
# ---------------------------------------------------------------------------------------------------------------


def fnv1a64(data, h=0xCBF29CE484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


def fnv_ids(ids):
    return fnv1a64(b"".join(int(i).to_bytes(4, "little", signed=True) for i in ids))


class Rng:
    """splitmix64."""

    def __init__(self, seed):
        self.s = seed & MASK64

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n


WORDS = ("the of and to in is was that for it with as his on be at by had are but from or have an they which one "
         "you were her all she there would their we him been has when who will more no if out so said what up its "
         "about into than them can only other new some could time these two may then do first any my now such like "
         "our over man me even most made after also did many before must through back years where much your way "
         "well down should because each just those people how too little state good very make world still own see "
         "men work long get here between both life being under never day same another know while last might us "
         "great old year off come since against go came right used take three tokenizer levanter haliax transformer "
         "attention gradient internationalization").split()
WS = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "   ", " \n", "\r", " \t ", "\u00a0", "\u3000", "\u2009", "\n   ",
      "\t\t", "\x0b", "\x0c", "\u0085", "\u2028", "    "]
PUNCT = ".,;:!?-()[]{}\"'/\\@#$%^&*_+=<>|~`"
SUFFIXES = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D", "'Ll", "'x",
            "\u2019s"]
SPECIALS = ["<|endoftext|>", "<s>", "</s>", "<|begin_of_text|>", "<|end_of_text|>", "<unk>", "<|endoftext|", "<s",
            "<tool>", "[MASK]"]
FRAGMENTS = ["http://www.example.com/a?b=c&d=1", "foo_bar", "x=1;", "3.14159", "e-mail", "O'Neil", "l'\u00e9t\u00e9",
             "i++", "a->b", "#include <vector>", "    return 0;", "<0x41>", "\u2581already\u2581spaced", "C:\\path\\x",
             "snake_case_name", "CamelCaseName", "1,000,000", "10:30pm", "$5.00", "--flag=value", "::", "..."]
# (first code point, count): long-assigned blocks only, so the result does not depend on the Unicode version.
SCRIPTS = [(0xC0, 64), (0x100, 128), (0x3B1, 25), (0x410, 64), (0x621, 26), (0x5D0, 27), (0x915, 37), (0xE01, 46),
           (0x3041, 83), (0x30A1, 90), (0x4E00, 20902), (0xAC00, 11172), (0x561, 38)]
DEVANAGARI = 6
DIGIT_BLOCKS = [(0x660, 10), (0x966, 10), (0xFF10, 10), (0x30, 10)]
NUMBER_MISC = [0xB2, 0xB3, 0xB9, 0xBD, 0xBC, 0x2160, 0x2161, 0x216B]
HANDS = [0x1F44B, 0x1F44C, 0x1F44D, 0x1F44E, 0x1F44F, 0x1F450]
# piece weights per document style: word ws punct digits contraction uni emoji combining special odddigit long frag
STYLES = [
    [40, 14, 10, 6, 6, 4, 1, 1, 1, 1, 1, 3],
    [10, 10, 4, 3, 2, 30, 6, 5, 1, 3, 1, 2],
    [15, 25, 15, 8, 3, 3, 1, 1, 2, 1, 1, 12],
    [10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 3, 10],
]


class Doc:
    def __init__(self):
        self.parts = []
        self.n = 0

    def add(self, s):
        self.parts.append(s)
        self.n += len(s.encode("utf-8"))

    def text(self):
        return "".join(self.parts)


def gen_word(r, d):
    w = WORDS[r.below(len(WORDS))]
    c = r.below(8)
    if c == 0:
        w = w[0].upper() + w[1:]
    elif c == 1:
        w = w.upper()
    if r.below(4) != 0:
        d.add(" ")
    d.add(w)


def gen_piece(r, d, kind):
    if kind == 0:
        gen_word(r, d)
    elif kind == 1:
        d.add(WS[r.below(len(WS))])
    elif kind == 2:
        p = PUNCT[r.below(len(PUNCT))]
        d.add(p * (1 + r.below(3)))
    elif kind == 3:
        if r.below(2) == 0:
            d.add(" ")
        d.add("".join(chr(0x30 + r.below(10)) for _ in range(1 + r.below(12))))
    elif kind == 4:
        gen_word(r, d)
        d.add(SUFFIXES[r.below(len(SUFFIXES))])
    elif kind == 5:
        si = r.below(len(SCRIPTS))
        start, count = SCRIPTS[si]
        if r.below(2) == 0:
            d.add(" ")
        for _ in range(1 + r.below(8)):
            d.add(chr(start + r.below(count)))
            if si == DEVANAGARI and r.below(2) == 0:
                d.add(chr(0x93E + r.below(15)))
    elif kind == 6:
        e = r.below(5)
        if e == 0:
            d.add(chr(0x1F600 + r.below(64)))
        elif e == 1:
            d.add(chr(HANDS[r.below(len(HANDS))]) + chr(0x1F3FB + r.below(5)))
        elif e == 2:
            d.add("\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466")
        elif e == 3:
            d.add("\u2764\uFE0F")
        else:
            d.add(chr(0x1F1E6 + r.below(26)) + chr(0x1F1E6 + r.below(26)))
    elif kind == 7:
        d.add(chr(0x61 + r.below(26)))
        for _ in range(1 + r.below(3)):
            d.add(chr(0x300 + r.below(0x70)))
    elif kind == 8:
        if r.below(2) == 0:
            d.add(" ")
        d.add(SPECIALS[r.below(len(SPECIALS))])
        if r.below(2) == 0:
            d.add(" ")
    elif kind == 9:
        if r.below(3) == 0:
            d.add(chr(NUMBER_MISC[r.below(len(NUMBER_MISC))]))
        else:
            start, count = DIGIT_BLOCKS[r.below(len(DIGIT_BLOCKS))]
            d.add("".join(chr(start + r.below(count)) for _ in range(1 + r.below(5))))
    elif kind == 10:
        if r.below(4) == 0:
            d.add("".join(chr(0x30 + r.below(10)) for _ in range(20 + r.below(80))))
        else:
            d.add(" ")
            d.add("".join(chr((0x41 if r.below(8) == 0 else 0x61) + r.below(26)) for _ in range(30 + r.below(300))))
    else:
        if r.below(2) == 0:
            d.add(" ")
        d.add(FRAGMENTS[r.below(len(FRAGMENTS))])


def gen_doc(i):
    r = Rng(0x70C7E5700000000 + i)
    d = Doc()
    if i % 1000 == 999:
        kind = (i // 1000) % 3
        if kind == 0:  # one huge pre-token: letters without a break
            d.add("".join(chr(0x61 + r.below(26)) for _ in range(100000 + r.below(40000))))
        elif kind == 1:  # long whitespace runs between short words
            while d.n < 110000:
                d.add(WS[r.below(len(WS))] * (1 + r.below(3000)))
                gen_word(r, d)
        else:  # a long ordinary document
            weights = STYLES[3]
            while d.n < 150000:
                gen_piece(r, d, pick(r, weights))
        return d.text()
    weights = STYLES[r.below(len(STYLES))]
    target = 200 + r.below(3800)
    while d.n < target:
        gen_piece(r, d, pick(r, weights))
    return d.text()


def pick(r, weights):
    x = r.below(sum(weights))
    for k, w in enumerate(weights):
        if x < w:
            return k
        x -= w
    raise AssertionError


# ---------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------


def training_texts(docs):
    out = [d for d in docs[:1500] if len(d) < 20000]
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if "." in os.path.basename(path) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            out.extend(p.strip() for p in f.read().split("\n%\n") if p.strip())
    return out


def save(tok, name, config):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def edit_json(name, fn):
    path = os.path.join(OUT, name, "tokenizer.json")
    with open(path) as f:
        j = json.load(f)
    fn(j)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
    Tokenizer.from_file(path)  # must still load


def train_gpt2(texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tr = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, tr)
    save(tok, "gpt2_style", {"add_prefix_space": False, "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                             "unk_token": "<|endoftext|>", "model_max_length": 1024,
                             "tokenizer_class": "GPT2Tokenizer"})

    def fix(j):  # GPT-2's own file moves the endoftext token to the end of the vocabulary; keep the trained ids
        j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                               "use_regex": True}
    edit_json("gpt2_style", fix)


def train_llama3(texts):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, tr)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A:0",
                                      pair="<|begin_of_text|>:0 $A:0 <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])
    # Llama 3 keeps its special tokens at the end of the vocabulary: move them there (ids vocab-2, vocab-1).
    save(tok, "llama3_style", {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                               "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"})

    def fix(j):
        vocab = j["model"]["vocab"]
        specials = ["<|begin_of_text|>", "<|end_of_text|>"]
        rest = sorted((t for t in vocab if t not in specials), key=lambda t: vocab[t])
        new = {t: k for k, t in enumerate(rest)}
        for s in specials:
            new[s] = len(new)
        j["model"]["vocab"] = new
        for a in j["added_tokens"]:
            a["id"] = new[a["content"]]
        j["added_tokens"].sort(key=lambda a: a["id"])
        for p in j["post_processor"]["processors"]:
            if p["type"] == "TemplateProcessing":
                p["special_tokens"]["<|begin_of_text|>"]["ids"] = [new["<|begin_of_text|>"]]
        j["model"]["ignore_merges"] = True
        j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": LLAMA3_PATTERN}
    edit_json("llama3_style", fix)


def train_sentencepiece(texts):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    # Training needs word boundaries; encoding (like Llama 2) runs with no pre-tokenizer.
    tok.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_next")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tr = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - 256, special_tokens=["<unk>", "<s>", "</s>"],
                             limit_alphabet=160, show_progress=False)
    tok.train_from_iterator(texts, tr)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A:0", pair="<s>:0 $A:0 <s>:1 $B:1",
                                                       special_tokens=[("<s>", 1)])
    save(tok, "sentencepiece_style", {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
                                      "eos_token": "</s>", "unk_token": "<unk>", "legacy": False,
                                      "tokenizer_class": "LlamaTokenizer"})

    def fix(j):
        vocab = j["model"]["vocab"]
        order = sorted(vocab, key=lambda t: vocab[t])
        assert order[:3] == ["<unk>", "<s>", "</s>"], order[:3]
        new = {t: k for k, t in enumerate(order[:3])}
        for b in range(256):
            new[f"<0x{b:02X}>"] = len(new)
        for t in order[3:]:
            if t not in new:
                new[t] = len(new)
        j["model"]["vocab"] = new
        j["pre_tokenizer"] = None
        j["model"]["byte_fallback"] = True
        j["model"]["fuse_unk"] = True
    edit_json("sentencepiece_style", fix)


def make_added_tokens():
    """gpt2_style plus added tokens with lstrip / rstrip / single_word / non-special / normalized flags."""
    tok = Tokenizer.from_file(os.path.join(OUT, "gpt2_style", "tokenizer.json"))
    tok.add_tokens([AddedToken("<tool>", special=False, lstrip=True, rstrip=True, normalized=False),
                    AddedToken("hello world", special=False, single_word=True, normalized=False),
                    AddedToken("Levanter", special=False, single_word=False, normalized=True)])
    tok.add_special_tokens([AddedToken("[MASK]", special=True, lstrip=True, rstrip=False, normalized=False),
                            AddedToken("<s>", special=True, normalized=False)])
    save(tok, "added_tokens", {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                               "mask_token": "[MASK]", "tokenizer_class": "GPT2Tokenizer"})


# ---------------------------------------------------------------------------------------------------------------
# Goldens
# ---------------------------------------------------------------------------------------------------------------

NAMES = ["gpt2_style", "llama3_style", "sentencepiece_style", "added_tokens", "qwen2_style", "metaspace_style"]
DOCS_FOR = {"added_tokens": 1000, "qwen2_style": 600, "metaspace_style": 600}
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
METASPACE = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
# Tokenizers stored as a patch of another one (to keep the goldens small): <name>/patch.json holds the base's name
# and top-level keys of tokenizer.json to replace; the C++ test applies it the same way (and uses the base's
# tokenizer_config.json).
DERIVED = {
    # Qwen 2: the Llama 3 layout with single digits, on the GPT-2 vocabulary.
    "qwen2_style": {"base": "gpt2_style", "replace": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}}},
    # Newer Llama 2 / Mistral conversions (transformers' LlamaConverter with legacy=False): a Metaspace
    # pre-tokenizer (prepend_scheme "first", no split) instead of the Prepend/Replace normalizers.
    "metaspace_style": {"base": "sentencepiece_style", "replace": {"normalizer": None, "pre_tokenizer": METASPACE}},
}


def tokenizer_path(name):
    """The tokenizer.json of `name` (for a derived one: written to a temporary file from its patch)."""
    if name not in DERIVED:
        return os.path.join(OUT, name, "tokenizer.json")
    import tempfile
    spec = DERIVED[name]
    os.makedirs(os.path.join(OUT, name), exist_ok=True)
    with open(os.path.join(OUT, name, "patch.json"), "w") as f:
        json.dump(spec, f, indent=1, ensure_ascii=True)
        f.write("\n")
    with open(os.path.join(OUT, spec["base"], "tokenizer.json")) as f:
        j = json.load(f)
    j.update(spec["replace"])
    path = os.path.join(tempfile.mkdtemp(), "tokenizer.json")
    with open(path, "w") as f:
        json.dump(j, f)
    return path


def config_of(name):
    base = DERIVED[name]["base"] if name in DERIVED else name
    with open(os.path.join(OUT, base, "tokenizer_config.json")) as f:
        return json.load(f)


def corpus_hash(docs):
    h = 0xCBF29CE484222325
    for d in docs:
        h = fnv1a64(d.encode("utf-8") + b"\xff", h)
    return h


def write_golden(name, docs, chash):
    tok = Tokenizer.from_file(tokenizer_path(name))
    n = DOCS_FOR.get(name, len(docs))
    encs = tok.encode_batch(docs[:n], add_special_tokens=True)
    lines = [f"# {name}: tokenizers {tokenizers.__version__}, written by tests/oracle/gen_tokenizer_golden.py",
             f"corpus docs={n} fnv={corpus_hash(docs[:n]):016x}"]
    decs = tok.decode_batch([e.ids for e in encs], skip_special_tokens=False)
    probe = "probe text"
    pd = tok.decode(tok.encode(probe).ids, skip_special_tokens=False)
    prefix = pd[:-len(probe)] if pd.endswith(probe) else ""
    lines.append("prefix " + json.dumps(prefix))
    for doc, e, dec in zip(docs, encs, decs):
        code = "=" if dec == doc else "^" if dec == prefix + doc else format(fnv1a64(dec.encode()), "016x")
        lines.append(f"d {len(e.ids)} {fnv_ids(e.ids):016x} {code}")
    sample = list(range(0, n, NOSPECIAL_EVERY))
    encs = tok.encode_batch([docs[i] for i in sample], add_special_tokens=False)
    decs = tok.decode_batch([e.ids for e in encs], skip_special_tokens=True)
    for i, e, dec in zip(sample, encs, decs):
        d = "=" if dec == docs[i] else format(fnv1a64(dec.encode()), "016x")
        lines.append(f"n {i} {len(e.ids)} {fnv_ids(e.ids):016x} {d}")
    with open(os.path.join(OUT, name, "encode_golden.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")

    cfg = config_of(name)
    probe = tok.encode("hi there", add_special_tokens=True).ids
    bos = tok.token_to_id(cfg["bos_token"]) if "bos_token" in cfg else None
    eos = tok.token_to_id(cfg["eos_token"]) if "eos_token" in cfg else None
    meta = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "bos_id": bos, "eos_id": eos,
            "adds_bos": bos is not None and probe[0] == bos, "adds_eos": eos is not None and probe[-1] == eos,
            "probe_ids": probe}
    with open(os.path.join(OUT, name, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


TRICKY = ["", " ", "  ", "\n", "\r\n", "\r", "\r\r\n\n", "Hello world", " Hello", "hello  world  ", "x  ",
          "I'm can't WE'LL they've She'S it'D", "'s", "don\u2019t", "1234567890", "12345 678 9", "3.14159",
          "tab\tsep\t\tend", "<|endoftext|>", "a<|endoftext|>b", " <|endoftext|> ", "<|endoftext|><|endoftext|>",
          "<s>", " <s> </s> ", "<s>hello</s>", "<|begin_of_text|>hi<|end_of_text|>", "<unk>", "<|endoftext",
          "\u00e9", "e\u0301", "caf\u00e9 na\u00efve r\u00e9sum\u00e9", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
          "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466",
          "\U0001F44D\U0001F3FD", "\u2764\uFE0F", "\U0001F600\U0001F601 \U0001F1EB\U0001F1F7",
          "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645", "\u0928\u092e\u0938\u094d\u0924\u0947",
          "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac", "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440",
          "\u00a0nbsp", "ideographic\u3000space", "trailing   ", "   leading", "x\n\n\ny", "  \n  \n", "a" * 300,
          "1" * 50, "<0x41>", "\u2581already\u2581metaspace", "\t\t\tindent", "\u216b \u00bd \u00b2\u00b3",
          "\u0661\u0662\u0663 \uff11\uff12", "\x00 nul \x7f", "\x0b\x0c vt ff", "\u0085nel\u2028ls", "<tool>",
          " <tool> call", "say hello world now", "sayhello worldnow", "Levanter levanter", " [MASK] x", "x[MASK]",
          "A\nB\r\nC\rD", "!!!???...", "a   b    c", "  \u00a0  ", "emoji\U0001F600\U0001F600\U0001F600",
          "\u0915\u094d\u0937\u093e", "ZWJ\u200Dalone", "`code` __init__ x->y", "\u00c0\u0100\u03b1\u0430\u05d0"]


def write_tricky():
    toks = {n: Tokenizer.from_file(tokenizer_path(n)) for n in NAMES}
    out = []
    for t in TRICKY:
        rec = {"text": t, "expect": {}}
        for n, tok in toks.items():
            ids = tok.encode(t).ids
            ids_ns = tok.encode(t, add_special_tokens=False).ids
            # ids_nospecial / decode_skip are left out when equal to ids / decode.
            dec = tok.decode(ids, skip_special_tokens=False)
            dec_skip = tok.decode(ids, skip_special_tokens=True)
            rec["expect"][n] = {"ids": ids, "decode": dec}
            if ids_ns != ids:
                rec["expect"][n]["ids_nospecial"] = ids_ns
            if dec_skip != dec:
                rec["expect"][n]["decode_skip"] = dec_skip
        out.append(rec)
    with open(os.path.join(OUT, "tricky.json"), "w") as f:
        json.dump(out, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")


def write_random_decode():
    """decode() of random id lists (partial UTF-8 sequences, specials, byte-fallback tokens, out-of-range ids)."""
    import random
    rnd = random.Random(20240611)
    out = {}
    for n in NAMES:
        tok = Tokenizer.from_file(tokenizer_path(n))
        v = tok.get_vocab_size(with_added_tokens=True)
        recs = []
        for k in range(40):
            ids = [rnd.randrange(v + 3 if rnd.random() < 0.05 else v) for _ in range(1 + rnd.randrange(16))]
            if k < 10:  # low ids: single bytes / byte-fallback tokens, often pieces of a multi-byte character
                ids = [rnd.randrange(min(v, 300)) for _ in range(1 + rnd.randrange(8))]
            recs.append({"ids": ids, "decode": tok.decode(ids, skip_special_tokens=False),
                         "decode_skip": tok.decode(ids, skip_special_tokens=True)})
        out[n] = recs
    with open(os.path.join(OUT, "random_decode.json"), "w") as f:
        json.dump(out, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")


def write_errors(texts):
    e = os.path.join(OUT, "errors")
    os.makedirs(e, exist_ok=True)
    wp = Tokenizer(models.WordPiece(vocab={"[UNK]": 0, "a": 1, "b": 2, "##a": 3, "##b": 4, "ab": 5},
                                    unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.Whitespace()
    os.makedirs(os.path.join(e, "wordpiece"), exist_ok=True)
    wp.save(os.path.join(e, "wordpiece", "tokenizer.json"))
    ug = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -1.5), ("ab", -2.0)], unk_id=0))
    os.makedirs(os.path.join(e, "unigram"), exist_ok=True)
    ug.save(os.path.join(e, "unigram", "tokenizer.json"))
    with open(os.path.join(OUT, "gpt2_style", "tokenizer.json")) as f:
        gpt2 = f.read()
    os.makedirs(os.path.join(e, "malformed"), exist_ok=True)
    with open(os.path.join(e, "malformed", "tokenizer.json"), "w") as f:
        f.write(gpt2[:200])  # truncated mid-vocabulary
    # A Split pattern outside the GPT-2 / Llama-3 family (valid for the Rust library): either refused with a message
    # naming the pattern, or encoded exactly like Python (tricky ids recorded in odd_regex/expect.json).
    j = json.loads(gpt2)
    odd = r"\p{Greek}+|[[:digit:]]{2}|(?<=a)b|\X"
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": odd}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    os.makedirs(os.path.join(e, "odd_regex"), exist_ok=True)
    path = os.path.join(e, "odd_regex", "tokenizer.json")
    with open(path, "w") as f:
        json.dump(j, f, separators=(",", ":"))
    tok = Tokenizer.from_file(path)
    probes = ["\u03b1\u03b2\u03b3 1234 ab", "hello world", "e\u0301x"]
    with open(os.path.join(e, "odd_regex", "expect.json"), "w") as f:
        json.dump([{"text": p, "ids": tok.encode(p).ids} for p in probes], f, ensure_ascii=True)
        f.write("\n")
    # A normalizer this port does not implement (Qwen 2's tokenizer.json has NFC).
    j = json.loads(gpt2)
    j["normalizer"] = {"type": "NFC"}
    os.makedirs(os.path.join(e, "nfc_normalizer"), exist_ok=True)
    with open(os.path.join(e, "nfc_normalizer", "tokenizer.json"), "w") as f:
        json.dump(j, f, separators=(",", ":"))
    # An unknown pre-tokenizer type.
    j = json.loads(gpt2)
    j["pre_tokenizer"] = {"type": "MadeUpPreTokenizer", "frobnicate": True}
    os.makedirs(os.path.join(e, "unknown_pretokenizer"), exist_ok=True)
    with open(os.path.join(e, "unknown_pretokenizer", "tokenizer.json"), "w") as f:
        json.dump(j, f, separators=(",", ":"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-train", action="store_true")
    args = ap.parse_args()
    docs = [gen_doc(i) for i in range(NUM_DOCS)]
    chash = corpus_hash(docs)
    total = sum(len(d.encode("utf-8")) for d in docs)
    print(f"corpus: {len(docs)} docs, {total} bytes, fnv {chash:016x}", file=sys.stderr)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "corpus.txt"), "w") as f:
        f.write("# tests/tokenizer_corpus.hpp must reproduce these documents; per line: utf-8 bytes, fnv64 & 0xffffffff\n")
        f.write(f"corpus docs={len(docs)} bytes={total} fnv={chash:016x} sha256="
                f"{hashlib.sha256(b''.join(d.encode() + bytes([255]) for d in docs)).hexdigest()}\n")
        for d in docs:
            b = d.encode("utf-8")
            f.write(f"{len(b)} {fnv1a64(b) & 0xFFFFFFFF:08x}\n")
    texts = training_texts(docs)
    if not args.no_train:
        train_gpt2(texts)
        train_llama3(texts)
        train_sentencepiece(texts)
        make_added_tokens()
    for n in NAMES:
        write_golden(n, docs, chash)
        print(f"{n}: done", file=sys.stderr)
    write_tricky()
    write_random_decode()
    write_errors(texts)


if __name__ == "__main__":
    main()
