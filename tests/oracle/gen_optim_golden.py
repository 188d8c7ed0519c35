#!/usr/bin/env python3
"""Golden learning-rate schedules from the real upstream Levanter (JAX, CPU backend).

Writes tests/golden/lr_schedule_golden.txt. Run from the repository root with the venv described in
tests/oracle/README.md ("Levanter golden data"):

    /tmp/lev-venv/bin/python tests/oracle/gen_optim_golden.py

For every case, `levanter.optim.AdamConfig(**fields).lr_scheduler(num_train_steps)` (the method lives on
the base class levanter.optim.OptimizerConfig; AdamConfig.build wraps it in optax.inject_hyperparams) is
evaluated at the int32 steps 0..num_train_steps inclusive, under jax.jit(jax.vmap(schedule)) as the
optimizer does inside the jitted train step (inject_hyperparams calls it with the int32 update count).
The values are float32; they are written with 9 significant digits (round-trips float32 exactly).

Format, one block per case:
    case <name> <json: num_train_steps and the config fields set; unset fields keep upstream defaults>
    <num_train_steps+1 space-separated floats>
Upstream defaults (levanter 1.2.dev1644): learning_rate=6e-4, weight_decay=0.1, min_lr_ratio=0.1,
warmup=0.01, decay=None, rewarmup=0.0, cooldown=None, cycle_length=None, cycles=None, lr_schedule="cosine".
lr_schedule given as an object (power, cosine with exponent) is written as {"type": ..., <its fields>}.
"""

import dataclasses
import importlib.metadata
import json
import os
import sys
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np

from levanter.optim import AdamConfig
from levanter.optim.config import CosineLrSchedule, InvSqrtLrSchedule, LrSchedule, PowerLrSchedule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "golden", "lr_schedule_golden.txt")

N = 100
LR = 1e-3

CASES = [
    # name, num_train_steps, fields
    ("constant_nowarmup", N, dict(learning_rate=LR, lr_schedule="constant", warmup=0.0)),
    ("constant_warmup_frac", N, dict(learning_rate=LR, lr_schedule="constant", warmup=0.1)),
    ("constant_warmup_steps", N, dict(learning_rate=LR, lr_schedule="constant", warmup=7)),
    ("cosine_defaults", N, dict(learning_rate=LR)),
    ("cosine_warmup_frac_min0.1", N, dict(learning_rate=LR, lr_schedule="cosine", warmup=0.1, min_lr_ratio=0.1)),
    ("cosine_warmup_frac_min0", N, dict(learning_rate=LR, lr_schedule="cosine", warmup=0.1, min_lr_ratio=0.0)),
    ("cosine_warmup_steps", N, dict(learning_rate=LR, lr_schedule="cosine", warmup=15, min_lr_ratio=0.1)),
    ("cosine_nowarmup", N, dict(learning_rate=LR, lr_schedule="cosine", warmup=0.0, min_lr_ratio=0.1)),
    # (warmup=1 means the fraction 1.0 -> zero decay steps -> optax raises; not a case)
    ("cosine_warmup_two_steps", N, dict(learning_rate=LR, lr_schedule="cosine", warmup=2, min_lr_ratio=0.1)),
    ("cosine_decay_frac", N, dict(learning_rate=LR, lr_schedule="cosine", warmup=0.1, decay=0.5, min_lr_ratio=0.1)),
    ("cosine_decay_steps", N, dict(learning_rate=LR, lr_schedule="cosine", warmup=10, decay=30, min_lr_ratio=0.0)),
    ("cosine_exponent2", N, dict(learning_rate=LR, lr_schedule=CosineLrSchedule(exponent=2.0), warmup=0.1,
                                 min_lr_ratio=0.1)),
    ("cosine_odd_steps", 37, dict(learning_rate=LR, lr_schedule="cosine", warmup=0.1, decay=0.3, min_lr_ratio=0.1)),
    ("linear_warmup_frac_min0.1", N, dict(learning_rate=LR, lr_schedule="linear", warmup=0.1, min_lr_ratio=0.1)),
    ("linear_warmup_steps_min0", N, dict(learning_rate=LR, lr_schedule="linear", warmup=5, min_lr_ratio=0.0)),
    ("linear_decay_frac", N, dict(learning_rate=LR, lr_schedule="linear", warmup=0.05, decay=0.25, min_lr_ratio=0.1)),
    ("linear_odd_steps", 37, dict(learning_rate=LR, lr_schedule="linear", warmup=0.2, min_lr_ratio=0.0)),
    ("inv_sqrt_warmup_frac_min0.1", N, dict(learning_rate=LR, lr_schedule="inv_sqrt", warmup=0.1, min_lr_ratio=0.1)),
    ("inv_sqrt_nowarmup_min0", N, dict(learning_rate=LR, lr_schedule="inv_sqrt", warmup=0.0, min_lr_ratio=0.0)),
    ("inv_sqrt_timescale10", N, dict(learning_rate=LR, lr_schedule=InvSqrtLrSchedule(timescale=10.0), warmup=0.1,
                                     min_lr_ratio=0.1)),
    ("inv_warmup_frac_min0.1", N, dict(learning_rate=LR, lr_schedule="inv", warmup=0.1, min_lr_ratio=0.1)),
    ("inv_warmup_steps_min0.5", N, dict(learning_rate=LR, lr_schedule="inv", warmup=20, min_lr_ratio=0.5)),
    ("inv_decay_frac", N, dict(learning_rate=LR, lr_schedule="inv", warmup=0.1, decay=0.4, min_lr_ratio=0.1)),
    ("power", N, dict(learning_rate=LR, lr_schedule=PowerLrSchedule(batch_size=8, seq_length=128), warmup=0.1,
                      min_lr_ratio=0.1)),
    ("power_nowarmup", N, dict(learning_rate=LR, lr_schedule=PowerLrSchedule(batch_size=4, seq_length=64, a=2.0,
                                                                               b=-0.3), warmup=0.0)),
    ("power_decaying", N, dict(learning_rate=LR, lr_schedule=PowerLrSchedule(batch_size=1, seq_length=1, a=0.005,
                                                                              b=-0.5), warmup=0.05)),
    ("cycles_int2", N, dict(learning_rate=LR, lr_schedule="cosine", warmup=0.1, cycles=2, min_lr_ratio=0.1)),
    ("cycles_int3_rewarmup", N, dict(learning_rate=LR, lr_schedule="cosine", warmup=0.1, cycles=3, rewarmup=0.1,
                                     min_lr_ratio=0.1)),
    ("cycles_int2_rewarmup_steps_linear", N, dict(learning_rate=LR, lr_schedule="linear", warmup=5, cycles=2,
                                                  rewarmup=4, min_lr_ratio=0.0)),
    ("cycles_list", N, dict(learning_rate=LR, lr_schedule="cosine", warmup=0.1, cycles=[30, 70], min_lr_ratio=0.1)),
    ("cycles_list_rewarmup_decay", N, dict(learning_rate=LR, lr_schedule="cosine", warmup=0.1, cycles=[40],
                                           rewarmup=0.2, decay=0.5, min_lr_ratio=0.1)),
    ("cycle_length_steps", N, dict(learning_rate=LR, lr_schedule="cosine", warmup=0.1, cycle_length=25,
                                   min_lr_ratio=0.1)),
    ("cycle_length_frac_rewarmup", N, dict(learning_rate=LR, lr_schedule="linear", warmup=0.1, cycle_length=0.5,
                                           rewarmup=0.1, min_lr_ratio=0.1)),
    ("cycle_length_list", N, dict(learning_rate=LR, lr_schedule="cosine", warmup=0.1, cycle_length=[20, 30, 50],
                                  rewarmup=0.1, min_lr_ratio=0.0)),
    ("cycle_length_uneven", N, dict(learning_rate=LR, lr_schedule="cosine", warmup=0.0, cycle_length=30,
                                    min_lr_ratio=0.1)),
    ("cooldown_deprecated", N, dict(learning_rate=LR, lr_schedule="cosine", warmup=0.1, cooldown=0.2,
                                    min_lr_ratio=0.1)),
]


def jsonable(fields, n):
    out = {"num_train_steps": n}
    for k, v in fields.items():
        if isinstance(v, LrSchedule):
            kind = {CosineLrSchedule: "cosine", InvSqrtLrSchedule: "inv_sqrt", PowerLrSchedule: "power"}[type(v)]
            out[k] = {"type": kind, **dataclasses.asdict(v)}
        else:
            out[k] = v
    return out


def main():
    lines = [
        "# generated by tests/oracle/gen_optim_golden.py from upstream "
        + ", ".join(f"{p} {importlib.metadata.version(p)}" for p in ["levanter", "jax", "optax"]),
        "# lr at steps 0..num_train_steps of AdamConfig(**fields).lr_scheduler(num_train_steps), float32, "
        "jax.jit(jax.vmap(schedule)) over int32 steps",
    ]
    max_eager_diff = 0.0
    for name, n, fields in CASES:
        cfg = AdamConfig(**fields)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sched = cfg.lr_scheduler(n)
        steps = jnp.arange(n + 1, dtype=jnp.int32)
        vals = np.asarray(jax.jit(jax.vmap(sched))(steps), dtype=np.float32)
        eager = np.asarray([np.float32(sched(jnp.asarray(i, jnp.int32))) for i in range(n + 1)], dtype=np.float32)
        max_eager_diff = max(max_eager_diff, float(np.max(np.abs(vals - eager))))
        assert np.all(np.isfinite(vals)), name
        lines.append(f"case {name} {json.dumps(jsonable(fields, n), separators=(',', ':'))}")
        lines.append(" ".join(f"{float(v):.9g}" for v in vals))
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {OUT}: {len(CASES)} cases, {os.path.getsize(OUT)} bytes; max |jit - eager| = {max_eager_diff:.3g}")


if __name__ == "__main__":
    sys.exit(main())
