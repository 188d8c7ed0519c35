#!/usr/bin/env python3
"""Golden data for tests/test_permutation.cpp and tests/test_mixture.cpp (tests/golden/data_order/).

Runs upstream Levanter's own classes (levanter.data._prp, levanter.data.permutation, levanter.data.mixture,
levanter.schedule) and NumPy/JAX themselves, and writes what they produce:

  numpy_jax.json   NumPy PCG64 raw outputs, Generator.integers sequences, jax.random.randint seeds
  permutations.json  LcgPermutation / FeistelPermutation images for many (length, key)
  shuffles.json    PermutationDataset and EraShufflingDataset orders
  mixtures.json    MixtureDataset outputs (dataset name, index) and per-stage block counts, with and without
                   component shuffles keyed as LMMixtureDatasetConfig.train_set does

Usage (from the repository root):
  python3 -m venv /tmp/order-venv && /tmp/order-venv/bin/pip install -r tests/oracle/requirements-data-order.txt
  /tmp/order-venv/bin/python tests/oracle/gen_data_order_golden.py tests/golden/data_order
"""

import asyncio
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.random as jrandom  # noqa: E402
import numpy as np  # noqa: E402

from levanter.data._prp import FeistelPermutation, LcgPermutation  # noqa: E402
from levanter.data.dataset import ListAsyncDataset  # noqa: E402
from levanter.data.mixture import MixtureDataset, rescale_mixture_schedule_for_batch_schedule  # noqa: E402
from levanter.data.permutation import EraShufflingDataset, PermutationDataset  # noqa: E402
from levanter.schedule import BatchSchedule  # noqa: E402
from levanter.utils.jax_utils import key_iterator  # noqa: E402


def key_words(key):
    return [int(w) for w in np.asarray(jax.device_get(key)).reshape(-1)]


def dump(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


# ------------------------------------------------------------------------------------------------------------
# NumPy / JAX primitives


def gen_numpy_jax():
    out = {"pcg64_raw": [], "integers": [], "integers_u64": [], "randint": []}
    for seed in [0, 1, 12345, 2**30 - 1, 2**32 + 5, 2**64 - 1]:
        bg = np.random.PCG64(seed)
        out["pcg64_raw"].append({"seed": seed, "values": [int(v) for v in bg.random_raw(6)]})
    # Interleaved int64 draws with varying bounds exercise the 32-bit buffer and both Lemire variants.
    bounds = [(1, 2), (0, 3), (1, 7), (0, 1000), (1, 2**31 + 11), (0, 2**32), (0, 2**32 + 1), (1, 2**40 + 3),
              (0, 2**62 + 12345), (5, 6), (-100, 100), (0, 2**63 - 1)]
    for seed in [0, 7, 2**29 + 3]:
        rng = np.random.Generator(np.random.PCG64(seed))
        seq = []
        for rep in range(3):
            for lo, hi in bounds:
                seq.append([lo, hi, int(rng.integers(lo, hi))])
        out["integers"].append({"seed": seed, "draws": seq})
    for seed in [0, 99]:
        for bits in [0, 1, 5, 16, 31, 32, 33, 63]:
            rng = np.random.Generator(np.random.PCG64(seed))
            vals = rng.integers(0, 1 << bits, size=7, dtype=np.uint64)
            after = int(rng.integers(0, 1000))  # where the stream stands afterwards
            out["integers_u64"].append({"seed": seed, "bits": bits, "values": [int(v) for v in vals], "after": after})
    for seed in [0, 1, 42, 2**31 - 1]:
        k = jrandom.PRNGKey(seed)
        for fold in [None, 0, 5, 123456]:
            kk = k if fold is None else jrandom.fold_in(k, fold)
            out["randint"].append({"key": key_words(kk), "value": int(jrandom.randint(kk, (), 0, 2**30).item())})
    return out


# ------------------------------------------------------------------------------------------------------------
# Permutations


def sample_indices(length, count, seed):
    if length <= count:
        return list(range(length))
    r = np.random.default_rng(seed)
    pick = set(int(x) for x in r.integers(0, length, size=count - 4))
    pick.update([0, 1, length - 2, length - 1])
    return sorted(pick)


def gen_permutations():
    lengths = [1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, 32, 64, 97, 100, 127, 128, 255, 1000, 1024, 4099, 65536,
               10**6, 2**24 + 3, 10**8 + 7, 10**9 + 7, 2**33 + 5]
    keys = [("PRNGKey(0)", jrandom.PRNGKey(0)), ("PRNGKey(42)", jrandom.PRNGKey(42)),
            ("fold_in(PRNGKey(3),7)", jrandom.fold_in(jrandom.PRNGKey(3), 7))]
    out = []
    for kind in ["linear", "feistel"]:
        for length in lengths:
            for kname, key in keys:
                if kind == "linear":
                    p = LcgPermutation(length, key)
                    params = {"a": int(p.a), "b": int(p.b)}
                else:
                    p = FeistelPermutation(length, key)
                    params = {"round_keys": [int(x) for x in p.keys]}
                full = length <= 256
                idx = list(range(length)) if full else sample_indices(length, 48, length % 1000)
                vals = [int(p(int(i))) for i in idx]
                entry = {"kind": kind, "length": length, "key": key_words(key), "key_name": kname, **params}
                if full:
                    entry["image"] = vals
                else:
                    entry["indices"] = idx
                    entry["values"] = vals
                out.append(entry)
    return out


# ------------------------------------------------------------------------------------------------------------
# Dataset orders


async def read_all(ds, n):
    return [int(x) for x in await ds.get_batch(list(range(n)))]


def gen_shuffles():
    out = []
    cases = []
    for kind in ["linear", "feistel"]:
        for n in [1, 10, 100, 1000]:
            cases.append((kind, n, True, jrandom.PRNGKey(0)))
        for n, era in [(10, 1), (10, 3), (100, 7), (100, 100), (1000, 64), (1000, 256), (777, 1000), (1000, 999)]:
            cases.append((kind, n, era, jrandom.PRNGKey(5)))
    for kind, n, shuffle, key in cases:
        base = ListAsyncDataset(list(range(n)), is_complete=True)
        if shuffle is True:
            ds = PermutationDataset(base, key, perm_type=kind)
        else:
            ds = EraShufflingDataset(base, shuffle, key=key, perm_type=kind)
        order = asyncio.run(read_all(ds, n))
        out.append({"kind": kind, "length": n, "shuffle": shuffle, "key": key_words(key), "order": order})
    return out


# ------------------------------------------------------------------------------------------------------------
# Mixtures


def build_mixture(case):
    """Builds MixtureDataset over ListAsyncDataset components whose items are (name, underlying index).

    With case["shuffle"], components are shuffled and keyed as LMMixtureDatasetConfig.train_set does:
    mix_key, shuffle_key = split(data_key); one key per nonzero-weight component from key_iterator(shuffle_key),
    in config order."""
    names = case["names"]
    weights = case["weights"]
    if isinstance(weights, list):
        all_weights = [w for _, w in weights]
    else:
        all_weights = [weights]
    used = [n for n in names if any(w.get(n, 0) > 0 for w in all_weights)]
    datasets = {n: ListAsyncDataset([(n, i) for i in range(case["lengths"][n])], is_complete=True) for n in used}
    data_key = jrandom.PRNGKey(case["seed"])
    mix_key, shuffle_key = jrandom.split(data_key)
    if case.get("shuffle") is not None:
        it = key_iterator(shuffle_key)
        shuffled = {}
        for n, ds in datasets.items():
            k = next(it)
            if case["shuffle"] is True:
                shuffled[n] = ds.shuffle(k, perm_type=case["perm_type"])
            else:
                shuffled[n] = ds.era_shuffle(case["shuffle"], key=k, perm_type=case["perm_type"])
        datasets = shuffled
    if isinstance(weights, list):
        stages = rescale_mixture_schedule_for_batch_schedule(
            [(s, w) for s, w in weights], BatchSchedule(case["batch_size"])
        )
    else:
        stages = weights
    mixture = MixtureDataset(datasets=datasets, weights=stages, block_size=case["block_size"], key=mix_key)
    return mixture, stages


def gen_mixtures():
    cases = [
        {"name": "three_unequal", "names": ["a", "b", "c"], "weights": {"a": 0.5, "b": 0.3, "c": 0.2},
         "block_size": 10, "lengths": {"a": 1000, "b": 37, "c": 5}, "seed": 0, "count": 3000},
        {"name": "zero_weight_unnormalised", "names": ["a", "b", "c", "d"],
         "weights": {"a": 3.0, "b": 0.0, "c": 1.0, "d": 2.5}, "block_size": 64,
         "lengths": {"a": 50, "b": 10, "c": 1000, "d": 7}, "seed": 1, "count": 2500},
        {"name": "thirds_remainder", "names": ["x", "y", "z"], "weights": {"z": 1, "x": 1, "y": 1},
         "block_size": 100, "lengths": {"x": 333, "y": 1000, "z": 90}, "seed": 2, "count": 2000},
        {"name": "default_block", "names": ["web", "code", "books"],
         "weights": {"web": 0.7, "code": 0.2, "books": 0.1}, "block_size": 2048,
         "lengths": {"web": 100000, "code": 3000, "books": 777}, "seed": 3, "count": 4200},
        {"name": "tiny_weight", "names": ["big", "small"], "weights": {"big": 0.99, "small": 0.005},
         "block_size": 128, "lengths": {"big": 10000, "small": 3}, "seed": 4, "count": 600},
        {"name": "staged", "names": ["a", "b", "c"],
         "weights": [[0, {"a": 1.0, "b": 0.0}], [10, {"a": 0.2, "b": 0.8}], [30, {"a": 0.5, "b": 0.5, "c": 1.0}]],
         "batch_size": 8, "block_size": 16, "lengths": {"a": 40, "b": 1000, "c": 11}, "seed": 5, "count": 3000},
        {"name": "staged_unused_first", "names": ["p", "q"],
         "weights": [[0, {"p": 0.0, "q": 1.0}], [4, {"p": 1.0, "q": 3.0}]],
         "batch_size": 32, "block_size": 64, "lengths": {"p": 100, "q": 100}, "seed": 6, "count": 1500},
        {"name": "shuffled_full_linear", "names": ["a", "b", "c"], "weights": {"a": 0.6, "b": 0.0, "c": 0.4},
         "block_size": 32, "lengths": {"a": 100, "b": 50, "c": 9}, "seed": 7, "count": 2000,
         "shuffle": True, "perm_type": "linear"},
        # Era shuffle under a mixture only with linear: upstream's mixture hands NumPy int64 indices to
        # EraShufflingDataset, and FeistelPermutation then fails on `numpy.int64.bit_length` (upstream bug).
        {"name": "shuffled_era_linear", "names": ["a", "b"], "weights": {"a": 0.5, "b": 0.5},
         "block_size": 16, "lengths": {"a": 1000, "b": 130}, "seed": 8, "count": 2000,
         "shuffle": 64, "perm_type": "linear"},
        {"name": "shuffled_full_feistel", "names": ["a", "b"], "weights": {"a": 0.25, "b": 0.75},
         "block_size": 16, "lengths": {"a": 1000, "b": 130}, "seed": 9, "count": 2000,
         "shuffle": True, "perm_type": "feistel"},
    ]
    out = []
    for case in cases:
        mixture, stages = build_mixture(case)
        items = asyncio.run(mixture.get_batch(list(range(case["count"]))))
        used = list(mixture.dataset_index)
        entry = dict(case)
        entry["stages_offsets"] = [s for s, _ in stages] if isinstance(stages, list) else [0]
        entry["used"] = used
        entry["dataset"] = [used.index(n) for n, _ in items]
        entry["index"] = [int(i) for _, i in items]
        entry["counts_per_stage"] = [[int(c) for c in cs] for cs in mixture._counts_per_block_per_stage]
        entry["first_block_ids"] = [int(x) for x in asyncio.run(mixture._get_block(0))]
        out.append(entry)
    return out


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/data_order"
    os.makedirs(outdir, exist_ok=True)
    meta = {"jax": jax.__version__, "numpy": np.__version__, "threefry_partitionable": bool(jax.config.jax_threefry_partitionable)}
    dump(os.path.join(outdir, "numpy_jax.json"), {"meta": meta, **gen_numpy_jax()})
    dump(os.path.join(outdir, "permutations.json"), {"meta": meta, "cases": gen_permutations()})
    dump(os.path.join(outdir, "shuffles.json"), {"meta": meta, "cases": gen_shuffles()})
    dump(os.path.join(outdir, "mixtures.json"), {"meta": meta, "cases": gen_mixtures()})


if __name__ == "__main__":
    main()
