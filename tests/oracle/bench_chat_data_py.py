#!/usr/bin/env python3
"""Upstream Levanter's multi-turn chat data path on the chat corpus of bench/bench_cache (BM_chat_rows /
BM_chat_pack), for the side-by-side figures in docs/benchmarks.md.

  rows  upstream's ChatProcessor on batches of 128 records (its map batch size): the JSON line parsed, then
        `tokenizer.apply_chat_template(messages, tokenize=True, return_assistant_tokens_mask=True, return_dict=True)`
        with the template of tests/golden/chat_data (transformers' Jinja2 and fast tokenizer, Rust), and the
        per-record arrays made. Writing the cache is not counted (ours is).
  pack  the rows in JaggedArrayStores (input_ids, assistant_masks; writing them is not counted), then upstream's
        MultiturnChatDataset at seq_len 1024 (GreedyPrepackedDataset, 64 segments per example) and every example
        made.

Usage (from the repository root; the venv of gen_chat_data_golden.py):
  build/bench/bench_cache --benchmark_filter=chat      # writes the corpus, prints its path in the temp directory
  RAYON_NUM_THREADS=2 /tmp/order-venv/bin/python tests/oracle/bench_chat_data_py.py \\
      /tmp/levanter_bench_cache/chat-20000.jsonl tests/golden/chat_data
"""

import json
import os
import sys
import tempfile
import time
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402


def main():
    corpus, tok_dir = sys.argv[1], sys.argv[2]
    from transformers import PreTrainedTokenizerFast

    import haliax as hax
    from levanter.data.text import ChatProcessor, MultiturnChatDataset
    from levanter.store.jagged_array import JaggedArrayStore

    with open(os.path.join(tok_dir, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tok_dir, "tokenizer.json"),
                                        bos_token=cfg["bos_token"], eos_token=cfg["eos_token"])
    tokenizer.chat_template = cfg["chat_template"]
    processor = ChatProcessor(tokenizer, messages_field="messages", mask_user_turns=True)

    t0 = time.perf_counter()
    with open(corpus) as f:
        records = [json.loads(line) for line in f]
    rows = []
    tokens = 0
    for i in range(0, len(records), 128):
        for r in processor(records[i:i + 128]):
            rows.append(r)
            tokens += len(r["input_ids"])
    rows_s = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as tmp:
        ids = JaggedArrayStore.open(os.path.join(tmp, "input_ids"), mode="w", item_rank=1, dtype=np.int32)
        masks = JaggedArrayStore.open(os.path.join(tmp, "assistant_masks"), mode="w", item_rank=1, dtype=np.int32)
        ids.extend([r["input_ids"] for r in rows])
        masks.extend([r["assistant_masks"] for r in rows])
        cache = types.SimpleNamespace(store=types.SimpleNamespace(tree={"input_ids": ids, "assistant_masks": masks}),
                                      await_finished=lambda: None)
        t0 = time.perf_counter()
        ds = MultiturnChatDataset(cache, hax.Axis("position", 1024), max_segments_per_example=64, mask_user_turns=True)
        sync = ds.as_sync_dataset()
        n = len(sync)
        examples = 0
        for start in range(0, n, 256):
            examples += len(sync.get_batch(list(range(start, min(n, start + 256)))))
        pack_s = time.perf_counter() - t0

    docs = len(rows)
    print(json.dumps({"docs": docs, "tokens": tokens, "rows_seconds": rows_s, "rows_docs_per_s": docs / rows_s,
                      "rows_Mtokens_per_s": tokens / rows_s / 1e6, "pack_seconds": pack_s,
                      "pack_docs_per_s": docs / pack_s, "pack_Mtokens_per_s": tokens / pack_s / 1e6,
                      "examples": examples, "rayon_threads": os.environ.get("RAYON_NUM_THREADS")}, indent=1))


if __name__ == "__main__":
    main()
