"""Writes tests/golden/lr_schedule_golden_optim.txt: upstream Levanter's learning-rate schedules
(`OptimizerConfig.lr_scheduler`) for the configurations tests/test_optim.cpp replays.

Format: per case, a line `case <name> <json>` (the AdamConfig fields set, plus num_train_steps), then one line with
the learning rate at steps 0..num_train_steps (inclusive; the last is past the end).

    /tmp/optim-venv/bin/python tests/oracle/gen_lr_golden.py       # venv as in gen_adam_golden.py
"""

import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from levanter.optim.config import (  # noqa: E402
    AdamConfig,
    ConstantLrSchedule,
    CosineLrSchedule,
    InvLrSchedule,
    InvSqrtLrSchedule,
    LinearLrSchedule,
    PowerLrSchedule,
)

SCHEDULES = {
    "constant": ConstantLrSchedule,
    "cosine": CosineLrSchedule,
    "linear": LinearLrSchedule,
    "inv_sqrt": InvSqrtLrSchedule,
    "inv": InvLrSchedule,
    "power": PowerLrSchedule,
}

CASES = [
    ("default", 1000, {}),
    ("cosine_warmup_steps", 200, dict(learning_rate=1e-3, warmup=20, min_lr_ratio=0.0)),
    ("cosine_exponent", 200, dict(warmup=0.05, lr_schedule=dict(type="cosine", exponent=2.0))),
    ("linear", 100, dict(lr_schedule="linear", warmup=0.1, min_lr_ratio=0.2)),
    ("linear_decay_frac", 100, dict(lr_schedule="linear", warmup=10, decay=0.5)),
    ("constant", 50, dict(lr_schedule="constant", warmup=0.2)),
    ("constant_nowarmup", 50, dict(lr_schedule="constant", warmup=0.0)),
    ("inv_sqrt", 300, dict(lr_schedule="inv_sqrt", warmup=30)),
    ("inv_sqrt_timescale", 300, dict(lr_schedule=dict(type="inv_sqrt", timescale=50.0), warmup=0.1)),
    ("inv", 200, dict(lr_schedule="inv", warmup=0.1, min_lr_ratio=0.05)),
    ("power", 200, dict(lr_schedule=dict(type="power", batch_size=8, seq_length=16), learning_rate=0.02, warmup=10)),
    ("power_ab", 200, dict(lr_schedule=dict(type="power", batch_size=4, seq_length=32, a=2.0, b=-0.3), warmup=0.0)),
    ("wsd_decay_steps", 100, dict(lr_schedule="linear", warmup=10, decay=20)),
    ("cycles_int", 300, dict(cycles=3, warmup=0.1, rewarmup=0.05)),
    ("cycles_int_norewarm", 301, dict(cycles=4, warmup=10, lr_schedule="linear", decay=0.3)),
    ("cycles_list", 300, dict(cycles=[50, 170], warmup=5, rewarmup=8, lr_schedule="linear")),
    ("cycle_length_frac", 200, dict(cycle_length=0.25, warmup=0.1, rewarmup=0.1)),
    ("cycle_length_steps", 230, dict(cycle_length=60, warmup=6, decay=0.5)),
    ("cycle_length_list", 200, dict(cycle_length=[40, 60, 50], warmup=4, rewarmup=3, lr_schedule="linear")),
    ("haps", 120, dict(haps=[30, 80], warmup=0.1, lr_schedule="cosine")),
    ("cooldown", 100, dict(cooldown=0.2, warmup=10, lr_schedule="cosine")),
    ("warmup_all", 40, dict(warmup=1.0, lr_schedule="constant")),
    ("decay_one", 60, dict(decay=1.0, warmup=0.0, lr_schedule="linear")),
    ("min_lr_ratio_zero_linear", 80, dict(lr_schedule="linear", min_lr_ratio=0.0, warmup=8)),
    ("inv_cycles", 150, dict(lr_schedule="inv", cycles=2, warmup=0.1, rewarmup=0.1)),
]


def build(fields):
    kw = dict(fields)
    s = kw.get("lr_schedule")
    if isinstance(s, dict):
        s = dict(s)
        kw["lr_schedule"] = SCHEDULES[s.pop("type")](**s)
    return AdamConfig(**kw)


def main():
    path = os.path.join(os.path.dirname(__file__), "..", "golden", "lr_schedule_golden_optim.txt")
    with open(path, "w") as out:
        out.write(f"# upstream levanter OptimizerConfig.lr_scheduler; optax {optax.__version__}, jax {jax.__version__}\n")
        for name, steps, fields in CASES:
            sched = build(fields).lr_scheduler(steps)
            counts = jnp.arange(steps + 1, dtype=jnp.int32)  # int32 counts, as optax's
            values = [float(v) for v in jnp.broadcast_to(jnp.asarray(sched(counts), jnp.float32), counts.shape)]
            out.write(f"case {name} {json.dumps(dict(fields, num_train_steps=steps), sort_keys=True)}\n")
            out.write(" ".join(repr(v) for v in values) + "\n")
    print("wrote", os.path.normpath(path), file=sys.stderr)


if __name__ == "__main__":
    main()
