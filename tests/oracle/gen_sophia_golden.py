"""Writes tests/golden/sophia_golden.txt: upstream Levanter's Sophia-H (levanter.optim.SophiaHConfig) on the toy
model of tests/oracle/gen_adam_golden.py, driven by a loss with a known closed-form gradient, so that the C++ test
can take gradients (and the Hessian-vector products Sophia-H asks for) at any point without an autodiff of the toy.

The loss, over every parameter element i of the flattened tree (leaves in tree order):

    d_i = p_i - c_i,   S = sum_i w_i p_i
    L(p) = sum_i (a_i / 2 d_i^2 + b_i / 4 d_i^4) + S^2 / 2
    dL/dp_i = a_i d_i + b_i d_i^3 + w_i S

The Hessian is a diagonal plus the rank-one w w^T: the Hutchinson estimate v * (H v) mixes every element. Upstream
computes H v by jax.jvp of jax.grad (exact up to rounding); the C++ side by a central difference of the gradient
(levanter/optim/hessian.hpp), so the test compares with a stated tolerance.

Each case builds its optimizer through upstream's config class (`SophiaHConfig(**fields).build(NUM_TRAIN_STEPS)`),
initialises it on the seeded toy parameters and runs STEPS updates: `updates, state = opt.update(grads, state,
params, obj_fn=loss)`, `params = optax.apply_updates(params, updates)`, grads = jax.grad(loss)(params).

Format (the AdamW reader's, plus the loss's coefficients):

    case <name> <json of the config fields set>
    num_train_steps <n>
    coef <a|b|c|w> <leaf path> <floats>
    init <leaf path> <floats>
    step <k> loss <float>
    grad <leaf path> <floats>            jax.grad at the parameters before the update
    lr <learning rate> skipped 0
    param <leaf path> <floats>           after the update
    end

    /tmp/lev-venv/bin/python tests/oracle/gen_sophia_golden.py      # from the repository root (seconds)
"""

import importlib.metadata
import json
import os
import sys
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import haliax as hax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import levanter.optim as lo  # noqa: E402

warnings.filterwarnings("ignore", category=DeprecationWarning)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_adam_golden import make_model, names_of  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 12
NUM_TRAIN_STEPS = 12
MESH = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))

# (name, fields): the defaults but for the learning rate and the re-estimation interval (12 steps see four
# re-estimates; with gamma 0.01 nearly every element is clipped, so the Hessian barely shows); then two cases where it
# decides the update: no clipping (with an epsilon that bounds the update: with the default 1e-12 an unclipped step
# divides by it wherever h <= 0, the first steps included) and clipping at 0.5, with gamma 1, fast averages, weight
# decay, other seeds and warmup.
CASES = [
    ("sophia_plain", {"learning_rate": 0.01, "warmup": 0, "update_interval": 3}),
    ("sophia_noclip", {"learning_rate": 0.003, "warmup": 0.25, "update_interval": 2, "weight_decay": 0.2,
                       "clip_threshold": None, "gamma": 1.0, "epsilon": 0.05, "rng_seed": 7, "beta1": 0.9,
                       "beta2": 0.5}),
    ("sophia_clip", {"learning_rate": 0.02, "warmup": 0, "update_interval": 1, "weight_decay": 0.1,
                     "clip_threshold": 0.5, "gamma": 1.0, "epsilon": 0.01, "rng_seed": 3, "beta2": 0.8}),
]


def fmt(a):
    return " ".join("%.9g" % x for x in np.asarray(a, dtype=np.float32).reshape(-1))


def coefficients(model):
    rng = np.random.RandomState(4321)
    out = []
    for leaf in jax.tree_util.tree_leaves(model):
        shape = leaf.shape
        a = rng.uniform(0.5, 2.0, size=shape).astype(np.float32)
        b = rng.uniform(0.0, 1.0, size=shape).astype(np.float32)
        c = (0.5 * rng.normal(size=shape)).astype(np.float32)
        w = (0.3 * rng.normal(size=shape)).astype(np.float32)
        out.append((a, b, c, w))
    return out


def make_loss(treedef, coefs):
    def loss(model):
        leaves = jax.tree_util.tree_leaves(model)
        s = sum(jnp.sum(jnp.asarray(w) * p) for p, (_, _, _, w) in zip(leaves, coefs))
        total = 0.5 * s * s
        for p, (a, b, c, _) in zip(leaves, coefs):
            d = p - jnp.asarray(c)
            total = total + jnp.sum(jnp.asarray(a) / 2 * d * d + jnp.asarray(b) / 4 * d ** 4)
        return total
    return loss


def run_case(lines, name, fields):
    cfg = lo.SophiaHConfig(**fields)
    model = hax.shard(make_model())
    names = names_of(model)
    treedef = jax.tree_util.tree_structure(model)
    coefs = coefficients(model)
    loss = make_loss(treedef, coefs)
    opt = cfg.build(NUM_TRAIN_STEPS)
    state = opt.init(model)
    lines += [f"case {name} {json.dumps(fields, sort_keys=True)}\n", f"num_train_steps {NUM_TRAIN_STEPS}\n"]
    for n, (a, b, c, w) in zip(names, coefs):
        for tag, arr in (("a", a), ("b", b), ("c", c), ("w", w)):
            lines.append(f"coef {tag} {n} {fmt(arr)}\n")
    for n, leaf in zip(names, jax.tree_util.tree_leaves(model)):
        lines.append(f"init {n} {fmt(leaf)}\n")
    value_and_grad = jax.jit(jax.value_and_grad(loss))
    for k in range(STEPS):
        value, grads = value_and_grad(model)
        lines.append(f"step {k} loss {float(value)!r}\n")
        for n, g in zip(names, jax.tree_util.tree_leaves(grads)):
            lines.append(f"grad {n} {fmt(g)}\n")
        updates, state = opt.update(grads, state, model, obj_fn=loss)
        model = optax.apply_updates(model, updates)
        lines.append(f"lr {float(state.hyperparams['learning_rate'])!r} skipped 0\n")
        for n, leaf in zip(names, jax.tree_util.tree_leaves(model)):
            vals = np.asarray(leaf)
            if not np.all(np.isfinite(vals)):
                raise FloatingPointError(f"non-finite parameters in {n} after step {k}")
            lines.append(f"param {n} {fmt(vals)}\n")
    lines.append("end\n")


def main():
    versions = " ".join(f"{p} {importlib.metadata.version(p)}" for p in ("levanter", "haliax", "jax", "optax"))
    lines = [f"# upstream {versions}; SophiaHConfig on the toy of gen_adam_golden.py with the loss of "
             "tests/oracle/gen_sophia_golden.py (written by it)\n"]
    for name, fields in CASES:
        with MESH, hax.axis_mapping({}):
            run_case(lines, name, fields)
    path = os.path.join(ROOT, "tests", "golden", "sophia_golden.txt")
    with open(path, "w") as out:
        out.writelines(lines)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
