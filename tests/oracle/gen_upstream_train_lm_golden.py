#!/usr/bin/env python3
"""Golden run of the real upstream `levanter.main.train_lm` on a tiny committed config.

Writes, under tests/golden/upstream_train_lm/ (formats: tests/oracle/README.md, "Upstream train_lm golden run"):

* `upstream_losses.json`: the metrics upstream's `json_logger` tracker logged while training `config.yaml` for
  60 steps (JAX on CPU): per-step `train/loss` and `optim/learning_rate`, the eval metrics with the step number
  upstream logs them at, the watch norms, a cross-check of the eval aggregation, the versions used, and
  (`stock_upstream`) the same run with upstream's train-step buffer donation left on (see below).
* `upstream_tokens.json`: upstream's token caches: per split the number of documents, tokens and seq_len windows,
  the preprocessor metadata (append_bos/append_eos), the SHA-256 of the whole token stream (int32 little-endian),
  the first 2000 train / 300 validation ids and the token counts of the first 20 documents.

Each run happens in a child process (`--child`); the golden one turns off the buffer donation of upstream's jitted
train step (`_turn_off_train_step_donation`: with it, JAX 0.7.2 on CPU computes wrong gradients from the third
update on whenever the step runs without jit hooks; the stock numbers are kept in `stock_upstream`).

With `--write-inputs` it first (re)writes the committed inputs `train.jsonl` and `validation.jsonl` from a
deterministic generator (splitmix64; no dependence on Python's `random`). `config.yaml` is hand-written.
`--compare logs/<run id>/metrics.jsonl` prints our train_lm's metrics against the golden file (plain python3).

Usage (repository root):

    python3 -m venv /tmp/lev-venv
    /tmp/lev-venv/bin/pip install -r tests/oracle/requirements-upstream-train.txt
    /tmp/lev-venv/bin/python tests/oracle/gen_upstream_train_lm_golden.py [--write-inputs] [--workdir DIR]
    python3 tests/oracle/gen_upstream_train_lm_golden.py --compare /tmp/x/logs/<run id>/metrics.jsonl

It runs on CPU (JAX_PLATFORMS=cpu, HF_HUB_OFFLINE=1, WANDB_MODE=disabled; the config selects json_logger and
require_accelerator: false), Ray started locally by upstream's cache builder, and the cache, logs and checkpoints
in a scratch directory (`--workdir`, default a fresh temporary directory) given as overrides, so `config.yaml`
keeps its repository-relative paths. About 3 minutes on 2 cores for both runs.

Upstream code paths used (levanter 1.2.dev1644 from PyPI; line numbers are of that package's files):

* `levanter.main.train_lm.main` (main/train_lm.py:74): keys `split(PRNGKey(trainer.seed), 4)` (:116),
  `config.data.train_set` / `tagged_eval_sets` (:140, :148), eval hook `levanter.eval.cb_tagged_lm_evaluate`
  added with `every=steps_per_eval` (:186-195), `trainer.train` (:268).
* Patches (only these two): (1) the train step's donation, above (trainer.py:623-639, `donate_args=(True,)`);
  (2) offline: `Gpt2Config.hf_checkpoint_converter` (models/gpt2.py:78-80) is replaced by the
  same `HFCheckpointConverter` with `HfConfigClass=transformers.GPT2Config` and the config's tokenizer instead of
  the hub reference `gpt2`; train_lm.main only uses it for HF export/import (neither is configured).
* Tokenization: `levanter.data.text.BatchTokenizer` (data/text.py:199-285) through `preprocessor_for_format`
  (text.py:605-610, enforce_bos=True always) and `build_lm_dataset_cache` (text.py:874-901).
* Windows: `TokenSeqDataset` (text.py:95-146, len = tokens // seq_len) and `CausalLmDataset` /
  `LmExample.causal` (text.py:156-175; models/lm_model.py:30-73: loss mask drops the last position and
  targets equal to ignore_token_id; segment ids start after each EOS).
* Training loop and hooks: `Trainer.train_step`, `training_steps`, `train` (trainer.py:465-538),
  `TrainerHooks.run_hooks` (trainer.py:124-127), `StepInfo.step = state.step - 1` (callbacks/_core.py:37),
  `log_step_info` (callbacks/_metrics.py:71-78: train/loss, global_step, run_progress, optim/*).
* Watch hook (`trainer.watch`, default interval 10): a JitCallback run inside the step on the pre-update state
  (trainer.py:470, 134-144, 665-668; callbacks/watch.py:90-).
* Evaluation: `TaggedEvaluator.evaluate` / `accum_for_batch` (eval.py:325-455), `RunningMean.add`
  (utils/stat_utils.py:24-31), `DataLoader` with `pad_final_batch=True` (data/loader.py:82, 315-347, 349-368,
  632-634: padding example = zeros).
* Tracker: `levanter.tracker.json_logger.JsonLoggerTracker.log` (tracker/json_logger.py): the records are
  captured here from the Python logger `levanter.json_logger`.
* Cache read-back: `SingleDatasetLMConfigBase.build_or_load_cache` (text.py:1074-1099) and the cache's
  `JaggedArrayStore` (`store.tree["input_ids"]`: `data_size`, `num_rows`, `data`, `offsets`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "upstream_train_lm"
CONFIG = GOLDEN / "config.yaml"

# --------------------------------------------------------------------------------------------------------------
# Deterministic English-ish text (inputs). Only used with --write-inputs.
# --------------------------------------------------------------------------------------------------------------


class SplitMix64:
    def __init__(self, seed: int):
        self.s = seed & 0xFFFFFFFFFFFFFFFF

    def next(self) -> int:
        self.s = (self.s + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return self.next() % n

    def pick(self, xs):
        return xs[self.below(len(xs))]


NAMES = ["Anna", "Ben", "Clara", "David", "Elena", "Felix", "Grace", "Henry", "Iris", "Jonas", "Kate", "Leo",
         "Mara", "Noah", "Olga", "Paul", "Rosa", "Sam", "Tara", "Victor", "Zoe", "Renée", "José"]
NOUNS = ["cat", "dog", "river", "garden", "house", "letter", "window", "train", "book", "city", "forest",
         "teacher", "market", "bridge", "song", "storm", "boat", "village", "mountain", "road", "lamp", "table",
         "child", "friend", "doctor", "farmer", "school", "kitchen", "island", "winter", "summer", "morning",
         "evening", "story", "question", "answer", "machine", "engine", "paper", "bottle", "apple", "bread",
         "coffee", "café", "piano", "window", "door", "field", "horse", "bird", "ship", "station", "clock"]
ADJS = ["old", "young", "quiet", "bright", "small", "large", "red", "green", "cold", "warm", "strange",
        "happy", "tired", "careful", "busy", "empty", "heavy", "gentle", "narrow", "distant", "naïve", "dark"]
VERBS_T = ["saw", "found", "opened", "closed", "painted", "carried", "followed", "watched", "built", "cleaned",
           "visited", "remembered", "wrote", "read", "heard", "lost", "fixed", "sold", "bought", "crossed"]
VERBS_I = ["slept", "waited", "laughed", "smiled", "arrived", "left", "worked", "sang", "listened", "walked",
           "returned", "stayed", "disappeared", "began to rain", "fell silent"]
ADVS = ["slowly", "quickly", "quietly", "again", "together", "alone", "suddenly", "carefully", "happily", "early",
        "late", "once more"]
PLACES = ["in the garden", "near the river", "at the station", "on the bridge", "by the window", "in the city",
          "under the old lamp", "behind the school", "across the field", "at the market", "in the kitchen"]
TIMES = ["In the morning", "That evening", "Last winter", "On Sunday", "After the storm", "Before dawn",
         "Every summer", "At noon", "Years later", "Meanwhile"]
CONNECT = ["and", "but", "so", "because", "while", "although"]


def _np(r: SplitMix64) -> str:
    det = r.pick(["the", "the", "a", "her", "his", "our", "that"])
    if r.below(3) == 0:
        return f"{det} {r.pick(ADJS)} {r.pick(NOUNS)}"
    return f"{det} {r.pick(NOUNS)}"


def _clause(r: SplitMix64) -> str:
    subj = r.pick(NAMES) if r.below(2) == 0 else _np(r)
    k = r.below(4)
    if k == 0:
        return f"{subj} {r.pick(VERBS_I)} {r.pick(PLACES)}"
    if k == 1:
        return f"{subj} {r.pick(VERBS_T)} {_np(r)} {r.pick(ADVS)}"
    if k == 2:
        return f"{subj} {r.pick(VERBS_T)} {_np(r)}"
    return f"{subj} {r.pick(VERBS_I)} {r.pick(ADVS)}"


def _sentence(r: SplitMix64) -> str:
    k = r.below(10)
    if k < 5:
        s = _clause(r)
    elif k < 7:
        s = f"{_clause(r)} {r.pick(CONNECT)} {_clause(r)}"
    elif k < 9:
        s = f"{r.pick(TIMES)}, {_clause(r)}"
    else:
        n = 2 + r.below(97)
        s = f"{r.pick(NAMES)} counted {n} {r.pick(NOUNS)}s {r.pick(PLACES)}"
    s = s[0].upper() + s[1:]
    end = r.pick([".", ".", ".", ".", "!", "?"])
    if k == 3 and r.below(2) == 0:
        return f'"{s}{end}" said {r.pick(NAMES)}.'
    return s + end


def _document(r: SplitMix64) -> str:
    paras = []
    for _ in range(1 + (r.below(5) == 0) + (r.below(9) == 0)):
        paras.append(" ".join(_sentence(r) for _ in range(1 + r.below(6))))
    return "\n\n".join(paras) if r.below(2) == 0 else "\n".join(paras)


def write_inputs(train_bytes: int, valid_docs: int) -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    r = SplitMix64(20250101)
    with open(GOLDEN / "train.jsonl", "w", encoding="utf-8", newline="\n") as f:
        n = 0
        while n < train_bytes:
            line = json.dumps({"text": _document(r)}, ensure_ascii=False) + "\n"
            f.write(line)
            n += len(line.encode("utf-8"))
    r = SplitMix64(777)
    with open(GOLDEN / "validation.jsonl", "w", encoding="utf-8", newline="\n") as f:
        for _ in range(valid_docs):
            f.write(json.dumps({"text": _document(r)}, ensure_ascii=False) + "\n")


# --------------------------------------------------------------------------------------------------------------
# The upstream run.
# --------------------------------------------------------------------------------------------------------------

DETERMINISTIC_PREFIXES = ("train/", "optim/", "eval/", "grad/", "params/", "updates/", "global_step", "run_progress")
NONDETERMINISTIC = ("loading_time", "total_time")


def _keep(name: str) -> bool:
    return name.startswith(DETERMINISTIC_PREFIXES) and not any(x in name for x in NONDETERMINISTIC)


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.INFO)
        self.records: list[dict] = []

    def emit(self, record):
        try:
            self.records.append(json.loads(record.getMessage()))
        except Exception:  # not one of the tracker's JSON lines
            pass


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        name = f"{prefix}/{k}" if prefix else k
        if isinstance(v, dict):
            out.update(_flatten(v, name))
        else:
            out[name] = v
    return out


def _collapse(metrics):
    """Metric names of one log call, the per-parameter watch norms folded into `grad/norm/* (N)`."""
    out, folded = [], {}
    for k in sorted(metrics):
        for p in ("grad/norm/", "params/norm/", "updates/norm/"):
            if k.startswith(p) and k != p + "total":
                folded[p] = folded.get(p, 0) + 1
                break
        else:
            out.append(k)
    return out + [f"{p}* ({n})" for p, n in folded.items()]


def _eval_crosscheck(evaluator, model, log):
    """Per-window sums on upstream's eval dataset and several ways to aggregate them (see the JSON description)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import haliax as hax
    from levanter.models.lm_model import compute_next_token_loss
    from levanter.utils.thread_utils import blocking_wait

    ds = evaluator.dataset
    n = int(blocking_wait(ds.async_len()))
    items = blocking_wait(ds.get_batch(list(range(n))))
    examples = [ex for ex, _tags in items]
    batch = jax.tree.map(lambda *xs: hax.stack("window", xs), *examples, is_leaf=lambda x: isinstance(x, hax.NamedArray))

    @hax.named_jit
    def per_window(m, b):
        losses = compute_next_token_loss(m, b, reduction=None, reduction_axis=())
        mask = b.loss_mask
        next_tokens = hax.roll(b.tokens, -1, "position")
        bytes_ = evaluator.bytes_per_token.take("vocab", next_tokens)
        return (hax.sum(losses * mask, "position").array, hax.sum(mask, "position").array,
                hax.sum(bytes_ * mask, "position").array)

    with hax.axis_mapping({}):  # one CPU device; keep the trainer's axis mapping out of this side computation
        loss_sum, count, nbytes = (np.asarray(x, dtype=np.float64) for x in per_window(model, batch))
    bs = evaluator.EvalBatch.size
    nb = -(-n // bs)
    b_loss = [loss_sum[i * bs:(i + 1) * bs].sum() for i in range(nb)]
    b_cnt = [count[i * bs:(i + 1) * bs].sum() for i in range(nb)]
    b_bytes = [nbytes[i * bs:(i + 1) * bs].sum() for i in range(nb)]
    full = (n // bs) * bs
    log2e = 1.0 / np.log(2.0)
    return {
        "num_windows": n,
        "eval_batch_size": bs,
        "batch_rows": [min(bs, n - i * bs) for i in range(nb)],
        "batch_targets": [int(x) for x in b_cnt],
        "upstream_eval_loss": float(log["eval/loss"]),
        "upstream_eval_bpb": float(log["eval/bpb"]) if "eval/bpb" in log else None,
        "token_mean_all_windows": float(loss_sum.sum() / count.sum()),
        "token_mean_full_batches_only": float(loss_sum[:full].sum() / count[:full].sum()),
        "mean_of_batch_means": float(np.mean([a / c for a, c in zip(b_loss, b_cnt)])),
        "bpb_token_weighted_batch_bpb": float(sum(c * (a / max(b, 1)) for a, c, b in zip(b_loss, b_cnt, b_bytes))
                                              / sum(b_cnt) * log2e),
        "bpb_total_loss_over_total_bytes": float(loss_sum.sum() / nbytes.sum() * log2e),
        "bpb_total_full_batches_only": float(loss_sum[:full].sum() / nbytes[:full].sum() * log2e),
    }


def _store_of(cache):
    # TreeCache -> TreeStore -> JaggedArrayStore of input_ids
    return cache.store.tree["input_ids"]


def _turn_off_train_step_donation():
    """Trainer._jit_train_step_fn / _jit_train_step_fn_no_hook (trainer.py:623-639) without donate_args.

    With donation (upstream as shipped), JAX 0.7.2 on CPU computes different, wrong numbers from the third update
    (update 2) on when the step runs without jit hooks (the default for 9 steps in 10): that update's loss is
    right but the Adam moments it produces are far smaller than the same update's without donation. Donation is
    only a memory optimisation, so the golden run turns it off; the stock run is recorded beside it
    (`stock_upstream`). Checked: without donation and without hooks the run equals, bit for bit, the stock run with
    the watch hook on every step (trainer.watch.interval 1, whose train step keeps the old state alive); with the
    default watch interval it equals it to 1.5e-6.
    """
    import functools

    from haliax.partitioning import named_jit
    from levanter.trainer import Trainer

    def with_hooks(self):
        return named_jit(self._train_step, axis_resources=self.parameter_axis_mapping,
                         out_axis_resources=self.parameter_axis_mapping)

    def without_hooks(self):
        return named_jit(functools.partial(self._train_step, _no_hooks=True),
                         axis_resources=self.parameter_axis_mapping, out_axis_resources=self.parameter_axis_mapping)

    for name, fn in (("_jit_train_step_fn", with_hooks), ("_jit_train_step_fn_no_hook", without_hooks)):
        prop = functools.cached_property(fn)
        prop.__set_name__(Trainer, name)
        setattr(Trainer, name, prop)


def run(workdir: Path, config_path: Path, extra_args, donate: bool) -> dict:
    """One upstream train_lm run in this process; returns {"losses": ..., "tokens": ...}."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for the hub
    os.chdir(REPO)  # config.yaml's paths are relative to the repository root

    import draccus
    import jax
    import numpy as np

    import haliax
    import levanter
    import levanter.main.train_lm as train_lm

    cache_dir = workdir / "cache"
    args = [
        "--config_path", str(config_path),
        "--data.cache_dir", str(cache_dir),
        "--trainer.log_dir", str(workdir / "logs"),
        "--trainer.checkpointer.base_path", str(workdir / "checkpoints"),
        "--trainer.id", "upstream_train_lm",
        *extra_args,
    ]
    config = draccus.parse(train_lm.TrainLmConfig, args=args)

    if not donate:
        _turn_off_train_step_donation()

    # train_lm.main (:97-99) builds Gpt2Config.hf_checkpoint_converter() for every GPT-2 run; upstream's
    # (models/gpt2.py:78-80) reads the hub `gpt2` config.json (network). It is only used to export HF checkpoints
    # (hf_save_path, unset here) or to initialize from HF, so give it the same classes without the hub.
    from transformers import GPT2Config as HfGpt2Config

    from levanter.compat.hf_checkpoints import HFCheckpointConverter
    from levanter.models.gpt2 import Gpt2Config

    def _offline_converter(self, ref_checkpoint=None):
        return HFCheckpointConverter(self.__class__, HfConfigClass=HfGpt2Config, tokenizer=config.data.the_tokenizer,
                                     ignore_prefix="transformer")

    Gpt2Config.hf_checkpoint_converter = _offline_converter

    # Cross-check of the eval aggregation (recorded next to upstream's numbers, not used by upstream): every time
    # the eval hook runs, recompute per-window loss sums / target counts / target bytes of the same model on the
    # same eval dataset and aggregate them in the alternative ways a port might.
    import levanter.eval as lev_eval

    crosschecks = []
    orig_eval_model = lev_eval.eval_model

    def eval_model_with_crosscheck(evaluator, model, prefix=""):
        log = orig_eval_model(evaluator, model, prefix=prefix)
        crosschecks.append(_eval_crosscheck(evaluator, model, log))
        return log

    lev_eval.eval_model = eval_model_with_crosscheck

    cap = _Capture()
    jl = logging.getLogger("levanter.json_logger")
    jl.addHandler(cap)
    jl.setLevel(logging.INFO)

    train_lm.main(config)

    # ---- metrics
    events = []
    per_step: dict[int, dict] = {}
    hparams = None
    for rec in cap.records:
        if rec.get("event") == "hparams":
            hparams = rec.get("hparams")
        if rec.get("event") != "log" or rec.get("step") is None:
            continue
        m = {k: v for k, v in _flatten(rec["metrics"]).items() if _keep(k)}
        if not m:
            continue
        events.append({"step": rec["step"], "metrics": m})
        per_step.setdefault(int(rec["step"]), {}).update(m)

    def series(name):
        return {str(s): per_step[s][name] for s in sorted(per_step) if name in per_step[s]}

    eval_events = [e for e in events if any(k.startswith("eval/") for k in e["metrics"])]
    assert len(crosschecks) == len(eval_events)
    for e, c in zip(eval_events, crosschecks):
        c["step"] = e["step"]
    out = {
        "description": "upstream levanter.main.train_lm on tests/golden/upstream_train_lm/config.yaml, JAX CPU; "
        "see tests/oracle/gen_upstream_train_lm_golden.py and tests/oracle/README.md",
        "versions": {
            "levanter": _version("levanter"),
            "haliax": _version("haliax"),
            "jax": jax.__version__,
            "jaxlib": _version("jaxlib"),
            "numpy": np.__version__,
            "tokenizers": _version("tokenizers"),
            "transformers": _version("transformers"),
            "python": sys.version.split()[0],
            "backend": jax.default_backend(),
            "devices": len(jax.devices()),
        },
        "step_convention": "step = StepInfo.step = number of optimizer updates applied so far minus 1 "
        "(train/loss at step s is the loss of the (s+1)-th batch, computed before that update; eval metrics "
        "at step s are computed after s+1 updates)",
        "num_train_steps": config.trainer.num_train_steps,
        "steps_per_eval": config.trainer.steps_per_eval,
        "train_loss": series("train/loss"),
        "learning_rate": series("optim/learning_rate"),
        "eval": [{"step": e["step"], **e["metrics"]} for e in eval_events],
        "per_step": {str(s): per_step[s] for s in sorted(per_step)},
        "eval_crosscheck": crosschecks,
        "log_events": [{"step": e["step"], "keys": _collapse(e["metrics"])} for e in events],
    }

    # ---- tokens
    toks = {"description": "upstream's token caches for config.yaml (int32 ids; sha256 over the whole "
            "concatenated stream as int32 little-endian)"}
    seq_len = config.model.Pos.size
    for split in ("train", "validation"):
        cache = config.data.build_or_load_cache(split)
        store = _store_of(cache)
        n_tokens = int(store.data_size)
        n_rows = int(store.num_rows)
        data = np.asarray(store.data[0:n_tokens].read().result(), dtype="<i4")
        offsets = np.asarray(store.offsets[0 : n_rows + 1].read().result(), dtype=np.int64)
        # upstream's offsets array holds the row count at [0] and row ends at [1..]
        ends = offsets[1:]
        lens = np.diff(np.concatenate([[0], ends]))
        meta = json.loads((cache_dir / split / "shard_ledger.json").read_text()).get("metadata", {})
        toks[split] = {
            "num_documents": n_rows,
            "num_tokens": n_tokens,
            "num_windows": n_tokens // seq_len,
            "seq_len": seq_len,
            "preprocessor_metadata": meta.get("preprocessor_metadata"),
            "sha256_int32le": hashlib.sha256(data.tobytes()).hexdigest(),
            "first_doc_lengths": [int(x) for x in lens[:20]],
            "first_ids": [int(x) for x in data[: 2000 if split == "train" else 300]],
        }
    del haliax, levanter, hparams
    return {"losses": out, "tokens": toks}


def _version(pkg):
    from importlib.metadata import version

    try:
        return version(pkg)
    except Exception:
        return None


def compare(metrics_jsonl: Path, golden_path: Path, tol: float = 2e-6) -> int:
    """Print our train_lm's metrics next to the golden ones. Eval: ours logs eval at S = updates applied, upstream
    at S - 1 (see README), so ours at S is matched with upstream at S - 1."""
    g = json.loads(golden_path.read_text())
    ours: dict[int, dict] = {}
    ours_eval: list[tuple[int, dict]] = []
    for line in metrics_jsonl.read_text().splitlines():
        r = json.loads(line)
        if r.get("event") != "log" or r.get("step") is None:
            continue
        ours.setdefault(int(r["step"]), {}).update(r["metrics"])
        if any(k.startswith("eval/") for k in r["metrics"]):
            ours_eval.append((int(r["step"]), r["metrics"]))
    worst, first_bad = 0.0, None
    print("step  upstream train/loss   ours            diff       lr diff")
    for k, u in g["train_loss"].items():
        s = int(k)
        if s not in ours or "train/loss" not in ours[s]:
            print(f"{s:4d}  {u:.7f}  (missing in ours)")
            continue
        d = ours[s]["train/loss"] - u
        lr_d = ours[s].get("optim/learning_rate", float("nan")) - g["learning_rate"].get(k, float("nan"))
        worst = max(worst, abs(d))
        if abs(d) > tol and first_bad is None:
            first_bad = s
        print(f"{s:4d}  {u:.7f}  {ours[s]['train/loss']:.7f}  {d:+.2e}  {lr_d:+.1e}")
    print(f"train/loss: max |diff| {worst:.3g}; first step over {tol:g}: {first_bad}")
    ups = {e["step"]: e for e in g["eval"]}
    cross = {c["step"]: c for c in g.get("eval_crosscheck", [])}
    for s, m in ours_eval:
        u, c = ups.get(s - 1), cross.get(s - 1)
        if u is None:
            print(f"eval ours step {s}: loss {m.get('eval/loss')}; upstream has no eval after {s} updates")
            continue
        print(f"eval after {s} updates: ours loss {m.get('eval/loss'):.7f} bpb {m.get('eval/bpb', float('nan')):.7f} | "
              f"upstream loss {u['eval/loss']:.7f} bpb {u.get('eval/bpb', float('nan')):.7f} | upstream model, full "
              f"batches only: loss {c['token_mean_full_batches_only']:.7f}" if c else "")
    return 0 if first_bad is None else 1


def _merge(golden: dict, stock: dict | None) -> dict:
    out = dict(golden)
    if stock is None:
        return out
    g, st = golden["train_loss"], stock["train_loss"]
    diffs = {k: abs(st[k] - g[k]) for k in g if k in st}
    bad = sorted((int(k) for k, d in diffs.items() if d > 1e-5))
    out["stock_upstream"] = {
        "note": "the same run with upstream's train step as shipped (buffer donation on; JAX 0.7.2 CPU): from update 2 "
        "on, in steps run without jit hooks, its updates are wrong (see _turn_off_train_step_donation in the "
        "script), so its losses leave the golden ones at step 3; kept for reference only",
        "first_step_differing_by_more_than_1e-5": bad[0] if bad else None,
        "max_abs_train_loss_difference": max(diffs.values()),
        "train_loss": st,
        "eval": stock["eval"],
    }
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-inputs", action="store_true", help="(re)write train.jsonl and validation.jsonl first")
    ap.add_argument("--train-bytes", type=int, default=110_000)
    ap.add_argument("--valid-docs", type=int, default=30)
    ap.add_argument("--inputs-only", action="store_true", help="write the inputs and stop")
    ap.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a new temp dir)")
    ap.add_argument("--config", type=Path, default=CONFIG.relative_to(REPO),
                    help="train_lm config (relative paths: from the repository root); for experiments")
    ap.add_argument("--out-dir", type=Path, default=GOLDEN, help="where the two JSON files go (default: the golden dir)")
    ap.add_argument("--no-stock", action="store_true", help="skip the second run with upstream's donation left on")
    ap.add_argument("--compare", type=Path, default=None, metavar="METRICS_JSONL",
                    help="compare our train_lm's metrics.jsonl with the golden file and exit (no JAX needed)")
    ap.add_argument("--child", choices=["golden", "stock"], help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="extra draccus overrides for experiments, e.g. "
                    "-- --optimizer.learning_rate 0 (after --)")
    a = ap.parse_args()
    if a.compare:
        sys.exit(compare(a.compare, a.out_dir / "upstream_losses.json"))
    if a.child:
        res = run(a.workdir, a.config, a.overrides, donate=a.child == "stock")
        a.child_out.write_text(json.dumps(res))
        return
    if a.write_inputs or a.inputs_only:
        write_inputs(a.train_bytes, a.valid_docs)
        if a.inputs_only:
            return
    workdir = (a.workdir or Path(tempfile.mkdtemp(prefix="upstream_train_lm_"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if any(workdir.iterdir()):
        sys.exit(f"--workdir {workdir} is not empty (a leftover cache or checkpoint would change the run)")
    results = {}
    for variant in ("golden",) + (() if a.no_stock else ("stock",)):
        vdir = workdir / variant
        vdir.mkdir()
        res_path = workdir / f"{variant}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", variant, "--workdir", str(vdir),
               "--child-out", str(res_path), "--config", str(a.config), "--", *a.overrides]
        print("running", variant, "->", vdir, flush=True)
        with open(workdir / f"{variant}.log", "w") as log:
            rc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            sys.exit(f"upstream run '{variant}' failed (exit {rc}); see {workdir / (variant + '.log')}")
        results[variant] = json.loads(res_path.read_text())
    if "stock" in results:
        assert results["stock"]["tokens"] == results["golden"]["tokens"], "the two runs tokenized differently"
    losses = _merge(results["golden"]["losses"], results.get("stock", {}).get("losses"))
    out_dir = a.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "upstream_losses.json").write_text(json.dumps(losses, indent=1) + "\n")
    (out_dir / "upstream_tokens.json").write_text(json.dumps(results["golden"]["tokens"]) + "\n")
    print("wrote", out_dir / "upstream_losses.json", "and", out_dir / "upstream_tokens.json")


if __name__ == "__main__":
    main()
