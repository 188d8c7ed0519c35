#!/usr/bin/env python3
"""Times the Python `tokenizers` library (Rust) on the documents bench/bench_tokenizer.cpp uses, for comparison.

Usage (from the repository root):
    python3 -m venv /tmp/tok-venv
    /tmp/tok-venv/bin/pip install -r tests/oracle/requirements-tokenizers.txt
    /tmp/tok-venv/bin/python tests/oracle/bench_tokenizers_py.py [--tokenizer PATH] [--text JSONL] [--threads 1 2]

--tokenizer: a tokenizer.json or its directory (default: tests/golden/tokenizers/gpt2_style, as the C++ bench);
--text: JSON lines with a "text" field (default: the fortunes corpus, built by scripts/make-fortunes-corpus.sh
into <tmp>/levanter_bench_fortunes like the C++ bench does). The thread count is set with RAYON_NUM_THREADS
in a fresh process per count, since Rayon reads it once.

Prints, per thread count, MB/s of UTF-8 input (best of --repeats timed passes after one warm-up pass, which
fills the BPE word cache as the C++ bench's warm-up does) for `encode_batch` and, where the installed version
has it, `encode_batch_fast` (no offsets), both with add_special_tokens=False.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def default_text():
    out = os.path.join(tempfile.gettempdir(), "levanter_bench_fortunes")
    train = os.path.join(out, "train.jsonl")
    if not os.path.exists(train):
        subprocess.check_call(["sh", os.path.join(ROOT, "scripts", "make-fortunes-corpus.sh"), out])
    return train


def measure(args):
    from tokenizers import Tokenizer  # imported after RAYON_NUM_THREADS is set

    path = args.tokenizer
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    tok = Tokenizer.from_file(path)
    with open(args.text, encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f if line.strip()]
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    results = {"threads": int(os.environ["RAYON_NUM_THREADS"]), "docs": len(docs), "bytes": nbytes}
    methods = [("encode_batch", tok.encode_batch)]
    if hasattr(tok, "encode_batch_fast"):
        methods.append(("encode_batch_fast", tok.encode_batch_fast))
    for name, fn in methods:
        out = fn(docs, add_special_tokens=False)  # warm-up: fills the word cache
        ntok = sum(len(e.ids) for e in out)
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn(docs, add_special_tokens=False)
            best = min(best, time.perf_counter() - t0)
        results[name] = {"seconds": best, "MB_per_s": nbytes / best / 1e6, "tokens": ntok}
    print(json.dumps(results))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", default=os.path.join(ROOT, "tests", "golden", "tokenizers", "gpt2_style"))
    p.add_argument("--text", default=None)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.text is None:
        args.text = default_text()
    if args.child:
        measure(args)
        return
    import tokenizers

    print(f"tokenizers {tokenizers.__version__}, tokenizer {args.tokenizer}, text {args.text}")
    for n in args.threads:
        env = dict(os.environ, RAYON_NUM_THREADS=str(n), TOKENIZERS_PARALLELISM="true")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--tokenizer", args.tokenizer, "--text",
               args.text, "--repeats", str(args.repeats)]
        r = json.loads(subprocess.check_output(cmd, env=env).decode().strip().splitlines()[-1])
        line = f"threads={r['threads']} docs={r['docs']} bytes={r['bytes']}"
        for name in ("encode_batch", "encode_batch_fast"):
            if name in r:
                line += f"  {name}: {r[name]['MB_per_s']:.2f} MB/s ({r[name]['tokens']} tokens)"
        print(line)


if __name__ == "__main__":
    main()
