#!/usr/bin/env python3
"""Golden data for tests/test_packing.cpp (tests/golden/packing/supervised.json).

Runs upstream Levanter's own packing code (levanter.data.packing.pack_documents and GreedyPrepackedDataset over
JaggedArrayStores, SupervisedDataset._make_sequence_mask, LmExample.causal) on generated document lengths and
supervised rows, and writes what they produce:

  pack_documents  for random lengths, max_length, max_segments_per_example and slice_too_long_examples: the
                  document ranges of each pack, or "error" where upstream raises
  supervised      for random rows (token ids and sources_len, one per document) at seq_len 32: every pack's
                  tokens, segment ids, SupervisedDataset._make_sequence_mask (with mask_inputs) and the loss mask
                  LmExample.causal makes of it (pack: 64 segments or 1, mask_inputs true or false, slice_strategy
                  right as SupervisedDataset uses, and left)

and tests/golden/packing/sft.json:

  prompt_completions  upstream sft's examples (main/sft.py: PermutationDataset, EpochDataset,
                  create_prompt_completion_iterator, pack_prompt_completions) of random rows: tokens, loss mask and
                  segment ids of every packed example
  mixture         upstream sft_mixture's (main/sft_mixture.py: MixtureDataset of PermutationDatasets, its endless
                  iterator, the same packing): the first 40 examples

Usage (from the repository root; the same venv as gen_data_order_golden.py):
  python3 -m venv /tmp/order-venv && /tmp/order-venv/bin/pip install -r tests/oracle/requirements-data-order.txt
  /tmp/order-venv/bin/python tests/oracle/gen_packing_golden.py tests/golden/packing
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

import haliax as hax  # noqa: E402
from levanter.data.packing import GreedyPrepackedDataset, pack_documents  # noqa: E402
from levanter.data.text import SupervisedDataset  # noqa: E402
from levanter.models.lm_model import LmExample  # noqa: E402
from levanter.store.jagged_array import JaggedArrayStore  # noqa: E402


def gen_pack_documents(rng):
    out = []
    for case in range(40):
        n = int(rng.integers(1, 40))
        max_length = int(rng.choice([8, 32, 64]))
        lengths = [int(x) for x in rng.integers(0, max_length + (max_length // 2 if case % 3 == 0 else 1), size=n)]
        max_segments = [None, 1, 3, 64][case % 4]
        for slice_too_long in (False, True):
            entry = {"lengths": lengths, "max_length": max_length, "max_segments": max_segments,
                     "slice_too_long": slice_too_long}
            try:
                ranges = pack_documents(np.array(lengths, dtype=np.int64), max_length, max_segments, slice_too_long)
                entry["packs"] = [[r.start, r.stop] for r in ranges]
            except ValueError:
                entry["error"] = True
            out.append(entry)
    return out


def gen_supervised(rng, tmp):
    seq_len = 32
    Pos = hax.Axis("position", seq_len)
    out = []
    for case in range(8):
        n = int(rng.integers(1, 18))
        long_docs = case % 2 == 0
        rows, sources = [], []
        for _ in range(n):
            length = int(rng.integers(1, 50 if long_docs else 20))
            rows.append(rng.integers(1, 300, size=length).astype(np.int32))
            sources.append(int(rng.integers(0, length + 1)))
        d = os.path.join(tmp, f"case{case}")
        ids_store = JaggedArrayStore.open(os.path.join(d, "input_ids"), mode="w", item_rank=1, dtype=np.int32)
        src_store = JaggedArrayStore.open(os.path.join(d, "sources_len"), mode="w", item_rank=1, dtype=np.int32)
        ids_store.extend(rows)
        src_store.extend([np.array([s], dtype=np.int32) for s in sources])
        tree = {"input_ids": ids_store, "sources_len": src_store}
        for max_segments in (64, 1):
            for slice_strategy in ("right",):
                for mask_inputs in (True, False):
                    packed = GreedyPrepackedDataset(tree, seq_len, max_segments_per_example=max_segments,
                                                    slice_strategy=slice_strategy)
                    sync = packed.as_sync_dataset()
                    count = len(sync)
                    packs = []
                    for ex, seg in sync.get_batch(list(range(count))):
                        segment_ids = seg["input_ids"]
                        tokens = hax.named(ex["input_ids"], Pos)
                        loss_mask = None
                        entry = {"tokens": [int(x) for x in np.asarray(ex["input_ids"])],
                                 "segment_ids": [int(x) for x in np.asarray(segment_ids)]}
                        if mask_inputs:
                            seq_mask = SupervisedDataset._make_sequence_mask(segment_ids, ex["sources_len"])
                            entry["sequence_mask"] = [int(x) for x in np.asarray(seq_mask)]
                            loss_mask = hax.named(seq_mask, Pos)
                        lm = LmExample.causal(tokens, loss_mask=loss_mask, segment_ids=hax.named(segment_ids, Pos))
                        entry["loss_mask"] = [int(x) for x in np.asarray(lm.loss_mask.array)]
                        packs.append(entry)
                    out.append({"rows": [[int(x) for x in r] for r in rows], "sources_len": sources,
                                "seq_len": seq_len, "max_segments": max_segments, "slice_strategy": slice_strategy,
                                "mask_inputs": mask_inputs, "packs": packs})
    return out


def _segments(ex):
    s = ex.attn_mask.segment_ids
    return s[0] if isinstance(s, tuple) else s  # (query, key) segment ids, the same array twice


def gen_prompt_completions(rng):
    """Upstream sft's data path (main/sft.py): PermutationDataset (Feistel, the key), EpochDataset when epochs > 0,
    create_prompt_completion_iterator (drops and cuts rows) and pack_prompt_completions (4 segments, 16 open)."""
    import asyncio  # noqa: F401

    import jax.random as jrandom

    from levanter.data import PermutationDataset
    from levanter.data.dataset import EpochDataset, ListAsyncDataset
    from levanter.data.packing import pack_prompt_completions
    from levanter.main.sft import create_prompt_completion_iterator

    out = []
    for case in range(12):
        seq_len = [16, 32, 64][case % 3]
        n = int(rng.integers(1, 60))
        epochs = [0, 0, 1, 2, 3][case % 5]
        max_seq_len = [seq_len, seq_len // 2, 2 * seq_len][case % 3]  # the tokenizer's cut, applied to the rows
        seed = int(rng.integers(0, 1000))
        pad = int(rng.integers(0, 5))
        rows, sources = [], []
        for _ in range(n):
            length = int(rng.integers(2, seq_len + seq_len // 2))  # upstream asserts on a 1-token row
            sources.append(int(rng.integers(0, length + 1)))
            rows.append([int(x) for x in rng.integers(5, 300, size=length)])
        # What the cache holds after tokenizer truncation at max_seq_len (model_max_length): both cut.
        items = [{"input_ids": np.array(r[:max_seq_len], dtype=np.int32),
                  "sources_len": np.array(min(s, max_seq_len), dtype=np.int32)} for r, s in zip(rows, sources)]
        ds = ListAsyncDataset(items, is_complete=True)
        ds = PermutationDataset(ds, jrandom.PRNGKey(seed))
        if epochs > 0:
            ds = EpochDataset(ds, max_epochs=epochs)
        Pos = hax.Axis("position", seq_len)
        packs = []
        for ex in pack_prompt_completions(Pos, create_prompt_completion_iterator(ds, Pos), pad_token=pad,
                                          max_segments_per_example=4, max_buffered_examples=16):
            packs.append({"tokens": [int(x) for x in np.asarray(ex.tokens.array)],
                          "loss_mask": [int(x) for x in np.asarray(ex.loss_mask.array)],
                          "segment_ids": [int(x) for x in np.asarray(_segments(ex).array)]})
        out.append({"rows": rows, "sources_len": sources, "seq_len": seq_len, "max_seq_len": max_seq_len,
                    "epochs": epochs, "key_seed": seed, "pad": pad, "packs": packs})
    return out


def gen_mixture_prompt_completions(rng):
    """Upstream sft_mixture's data path (main/sft_mixture.py): each dataset's rows through PermutationDataset with the
    data key, MixtureDataset of them (weights, block size, the same key, restart), its endless
    create_prompt_completion_iterator, pack_prompt_completions (4 segments, 16 open): the first examples."""
    import itertools

    import jax.random as jrandom

    from levanter.data import PermutationDataset
    from levanter.data.dataset import ListAsyncDataset
    from levanter.data.mixture import MixtureDataset
    from levanter.data.packing import pack_prompt_completions
    from levanter.main.sft_mixture import create_prompt_completion_iterator

    out = []
    for case in range(6):
        seq_len = [16, 32][case % 2]
        block_size = [8, 16, 64][case % 3]
        seed = int(rng.integers(0, 1000))
        pad = int(rng.integers(0, 5))
        names = ["a", "b", "c"][: 2 + case % 2]
        datasets, weights, all_rows = {}, {}, {}
        for name in names:
            n = int(rng.integers(3, 40))
            rows, sources = [], []
            for _ in range(n):
                length = int(rng.integers(2, seq_len + seq_len // 2))
                sources.append(int(rng.integers(0, length + 1)))
                rows.append([int(x) for x in rng.integers(5, 300, size=length)])
            items = [{"input_ids": np.array(r, dtype=np.int32), "sources_len": np.array(s, dtype=np.int32)}
                     for r, s in zip(rows, sources)]
            key = jrandom.PRNGKey(seed)
            datasets[name] = PermutationDataset(ListAsyncDataset(items, is_complete=True), key)
            weights[name] = float(rng.integers(1, 10))
            all_rows[name] = {"rows": rows, "sources_len": sources}
        mix = MixtureDataset(datasets, weights, block_size=block_size, key=jrandom.PRNGKey(seed),
                             stop_strategy="restart")
        Pos = hax.Axis("position", seq_len)
        count = 40
        packs = []
        it = pack_prompt_completions(Pos, create_prompt_completion_iterator(mix, Pos), pad_token=pad,
                                     max_segments_per_example=4, max_buffered_examples=16)
        for ex in itertools.islice(it, count):
            packs.append({"tokens": [int(x) for x in np.asarray(ex.tokens.array)],
                          "loss_mask": [int(x) for x in np.asarray(ex.loss_mask.array)],
                          "segment_ids": [int(x) for x in np.asarray(_segments(ex).array)]})
        out.append({"datasets": [{"name": k, **all_rows[k]} for k in names], "weights": weights,
                    "block_size": block_size, "seq_len": seq_len, "key_seed": seed, "pad": pad, "packs": packs})
    return out


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/packing"
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(2026)
    with tempfile.TemporaryDirectory() as tmp:
        data = {"pack_documents": gen_pack_documents(rng), "supervised": gen_supervised(rng, tmp)}
    path = os.path.join(out_dir, "supervised.json")
    with open(path, "w") as f:
        json.dump(data, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")
    path = os.path.join(out_dir, "sft.json")
    with open(path, "w") as f:
        json.dump({"prompt_completions": gen_prompt_completions(np.random.default_rng(2027)),
                   "mixture": gen_mixture_prompt_completions(np.random.default_rng(2028))}, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
