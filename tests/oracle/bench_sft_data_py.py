#!/usr/bin/env python3
"""Upstream Levanter's sft data path on the chat corpus of bench/bench_cache (BM_sft_rows / BM_sft_pack), for the
side-by-side figures in docs/benchmarks.md.

  rows  what upstream's sft does per record before its cache: the JSON line parsed and the first user and assistant
        messages taken (SingleTurnChatJsonlDataSource), then preprocess_legacy_chat_template in batches of 128
        (upstream's map_batches batch size): prompt and prompt + response (+ EOS text) tokenized by the same
        tokenizer.json through transformers' fast tokenizer (Rust). Writing the cache is not counted (ours is).
  pack  the rows in a PermutationDataset, create_prompt_completion_iterator and pack_prompt_completions into
        examples of 1024 tokens (main/sft.py's settings), every example made.

Usage (from the repository root; the venv of gen_packing_golden.py):
  build/bench/bench_cache --benchmark_filter=sft      # writes the corpus, prints its path in the temp directory
  RAYON_NUM_THREADS=2 /tmp/order-venv/bin/python tests/oracle/bench_sft_data_py.py \\
      /tmp/levanter_bench_cache/chat-20000.jsonl tests/golden/tokenizers/gpt2_style
"""

import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402


def main():
    corpus, tok_dir = sys.argv[1], sys.argv[2]
    import jax.random as jrandom
    from transformers import PreTrainedTokenizerFast

    import haliax as hax
    from levanter.data import PermutationDataset
    from levanter.data.dataset import ListAsyncDataset
    from levanter.data.packing import pack_prompt_completions
    from levanter.data.text import preprocess_legacy_chat_template
    from levanter.main.sft import create_prompt_completion_iterator

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tok_dir, "tokenizer.json"),
                                        eos_token="<|endoftext|>", model_max_length=1024)
    should_append_eos = tokenizer("hi there")["input_ids"][-1] != tokenizer.eos_token_id

    t0 = time.perf_counter()
    pairs = []
    with open(corpus) as f:
        for line in f:
            messages = json.loads(line)["messages"]
            pairs.append({"input": next(m["content"] for m in messages if m["role"] == "user"),
                          "output": next(m["content"] for m in messages if m["role"] == "assistant")})
    items = []
    tokens = 0
    for i in range(0, len(pairs), 128):
        out = preprocess_legacy_chat_template(pairs[i:i + 128], tokenizer, should_append_eos)
        for ids, s in zip(out["input_ids"], out["sources_len"]):
            items.append({"input_ids": ids, "sources_len": np.array(s, dtype=np.int32)})
            tokens += len(ids)
    rows_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    ds = PermutationDataset(ListAsyncDataset(items, is_complete=True), jrandom.PRNGKey(0))
    Pos = hax.Axis("position", 1024)
    examples = 0
    for _ in pack_prompt_completions(Pos, create_prompt_completion_iterator(ds, Pos), pad_token=0,
                                     max_segments_per_example=4, max_buffered_examples=16):
        examples += 1
    pack_s = time.perf_counter() - t0

    docs = len(items)
    print(json.dumps({"docs": docs, "tokens": tokens, "rows_seconds": rows_s, "rows_docs_per_s": docs / rows_s,
                      "rows_Mtokens_per_s": tokens / rows_s / 1e6, "pack_seconds": pack_s,
                      "pack_docs_per_s": docs / pack_s, "pack_Mtokens_per_s": tokens / pack_s / 1e6,
                      "examples": examples, "rayon_threads": os.environ.get("RAYON_NUM_THREADS")}, indent=1))


if __name__ == "__main__":
    main()
