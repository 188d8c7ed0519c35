"""Writes tests/golden/adam_golden.txt: upstream Levanter's AdamW (AdamConfig.build, optax) on a small Haliax model.

The model mirrors `toy` in tests/test_optim.cpp: an Embedding, a Stacked pair of blocks (a Linear `attn` with bias and
a LayerNorm `ln`), and a Linear `head` with bias, so the default weight-decay mask, class paths and the per-layer
update_rms_clipping of Stacked parameters are all exercised. Parameters, gradients and losses are seeded numpy
values written into the file; the C++ test loads them by path and compares the parameters after every step and the
learning rate of every step.

    python3 -m venv /tmp/optim-venv
    /tmp/optim-venv/bin/pip install jax==0.10.2 jaxlib==0.10.2 optax==0.2.8 levanter==1.2.dev1644
    /tmp/optim-venv/bin/python tests/oracle/gen_adam_golden.py      # from the repository root
"""

import json
import os
import sys
import zlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import equinox as eqx  # noqa: E402
import haliax as hax  # noqa: E402
import haliax.nn as hnn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import levanter  # noqa: E402
from levanter.optim.clip_update_norm import ClipUpdateNormConfig  # noqa: E402
from levanter.optim.config import AdamConfig  # noqa: E402
from levanter.optim.skipstep import SkipStepConfig  # noqa: E402
from levanter.utils.jax_utils import leaf_key_paths  # noqa: E402

Vocab = hax.Axis("vocab", 5)
Embed = hax.Axis("embed", 4)
Hidden = hax.Axis("hidden", 3)
Out = hax.Axis("out", 3)
Layers = hax.Axis("layers", 2)
STEPS = 8
NUM_TRAIN_STEPS = 8


class Block(eqx.Module):
    attn: hnn.Linear
    ln: hnn.LayerNorm

    @staticmethod
    def init(*, key):
        return Block(hnn.Linear.init(Embed, Hidden, key=key, use_bias=True, out_first=False), hnn.LayerNorm.init(Embed))


class Toy(eqx.Module):
    embeddings: hnn.Embedding
    blocks: hnn.Stacked
    head: hnn.Linear


def make_model():
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    model = Toy(
        hnn.Embedding.init(Vocab, Embed, key=k1),
        hnn.Stacked.init(Layers, Block)(key=jax.random.split(k2, Layers.size)),
        hnn.Linear.init(Embed, Out, key=k3, use_bias=True, out_first=False),
    )
    rng = np.random.RandomState(1234)
    leaves, treedef = jax.tree_util.tree_flatten(model)
    leaves = [jnp.asarray(rng.normal(size=x.shape).astype(np.float32)) for x in leaves]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def names_of(model):
    return jax.tree_util.tree_leaves(leaf_key_paths(model, is_leaf=lambda x: isinstance(x, hax.NamedArray)))


CASES = {
    "plain": dict(learning_rate=1e-2, weight_decay=0.0, max_grad_norm=None, warmup=0.25),
    "nesterov": dict(learning_rate=1e-2, weight_decay=0.0, max_grad_norm=None, nesterov=True, warmup=0.0),
    "clip": dict(learning_rate=1e-2, weight_decay=0.0, max_grad_norm=0.05, warmup=0.25),
    "default": dict(learning_rate=3e-2),
    "wd_regex": dict(learning_rate=3e-2, weight_decay=0.5, weight_decay_modules=r".*attn.*|head\.weight"),
    "wd_list_default": dict(
        learning_rate=3e-2, weight_decay=0.5, weight_decay_modules=["ln"], default_weight_decay_mask=True
    ),
    "wd_nomask": dict(learning_rate=3e-2, weight_decay=0.5, default_weight_decay_mask=False),
    "adamc": dict(learning_rate=3e-2, weight_decay=0.5, adamc_weight_decay=True, warmup=0.5, min_lr_ratio=0.0),
    "rms_clip": dict(learning_rate=3e-2, update_rms_clipping=0.5, beta2=0.999),
    "clip_update_norm": dict(
        learning_rate=3e-2, weight_decay=0.0, clip_update_norm=dict(rolling_interval_length=4, sigma_factor=0.5)
    ),
    "skip": dict(learning_rate=3e-2, skip_bad_steps=4),
    "skip_config": dict(learning_rate=3e-2, skip_bad_steps=dict(rolling_interval_length=6, sigma_factor=2.0)),
}


def build_config(fields):
    kw = dict(fields)
    if isinstance(kw.get("clip_update_norm"), dict):
        kw["clip_update_norm"] = ClipUpdateNormConfig(**kw["clip_update_norm"])
    if isinstance(kw.get("skip_bad_steps"), dict):
        kw["skip_bad_steps"] = SkipStepConfig(**kw["skip_bad_steps"])
    return AdamConfig(**kw)


def fmt(a):
    return " ".join("%.9g" % x for x in np.asarray(a, dtype=np.float32).reshape(-1))  # exact for float32


def run_case(out, name, fields):
    cfg = build_config(fields)
    model = make_model()
    names = names_of(model)
    opt = cfg.build(NUM_TRAIN_STEPS)
    state = opt.init(model)
    rng = np.random.RandomState(zlib.crc32(name.encode()))
    out.write(f"case {name} {json.dumps(fields, sort_keys=True)}\n")
    out.write(f"num_train_steps {NUM_TRAIN_STEPS}\n")
    for n, leaf in zip(names, jax.tree_util.tree_leaves(model)):
        out.write(f"init {n} {fmt(leaf)}\n")
    uses_loss = bool(cfg.skip_bad_steps)
    update = jax.jit(lambda g, s, p, loss: opt.update(g, s, p, loss=loss) if uses_loss else opt.update(g, s, p))
    for step in range(STEPS):
        leaves, treedef = jax.tree_util.tree_flatten(model)
        scale = 1.0
        loss = 2.0 + 0.1 * rng.normal()
        if name.startswith("skip") and step == 5:
            scale = 50.0  # a gradient spike
        if name.startswith("skip") and step == 6:
            loss = 40.0  # a loss spike
        grads = [jnp.asarray((scale * rng.normal(size=x.shape)).astype(np.float32)) for x in leaves]
        gtree = jax.tree_util.tree_unflatten(treedef, grads)
        out.write(f"step {step} loss {float(np.float32(loss))!r}\n")
        for n, g in zip(names, grads):
            out.write(f"grad {n} {fmt(g)}\n")
        updates, state = update(gtree, state, model, jnp.float32(loss))
        new_model = optax.apply_updates(model, updates)
        # skip_bad_steps multiplies the update by 0: parameters unchanged at a non-zero learning rate
        skipped = uses_loss and float(state.hyperparams["learning_rate"]) != 0.0 and all(
            np.array_equal(np.asarray(x), np.asarray(y))
            for x, y in zip(jax.tree_util.tree_leaves(model), jax.tree_util.tree_leaves(new_model))
        )
        model = new_model
        lr = state.hyperparams["learning_rate"]
        out.write(f"lr {float(lr)!r} skipped {int(skipped)}\n")
        for n, leaf in zip(names, jax.tree_util.tree_leaves(model)):
            out.write(f"param {n} {fmt(leaf)}\n")
    out.write("end\n")


def main():
    path = os.path.join(os.path.dirname(__file__), "..", "golden", "adam_golden.txt")
    with open(path, "w") as out:
        out.write(
            f"# upstream levanter {levanter.__version__ if hasattr(levanter, '__version__') else '?'} AdamConfig.build, "
            f"optax {optax.__version__}, jax {jax.__version__}, haliax {getattr(hax, '__version__', '?')}; "
            "written by tests/oracle/gen_adam_golden.py\n"
        )
        for name, fields in CASES.items():
            run_case(out, name, fields)
    print("wrote", os.path.normpath(path), file=sys.stderr)


if __name__ == "__main__":
    main()
