#!/usr/bin/env python3
"""Write tests/golden/grad_golden.txt: the loss and gradients of a small composite model computed by
upstream Haliax on JAX (float64, CPU), which tests/test_grad_golden.cpp reproduces with haliax C++.

Usage (from the repository root):
    python3 -m venv /tmp/oracle-venv
    /tmp/oracle-venv/bin/pip install -r tests/oracle/requirements.txt
    /tmp/oracle-venv/bin/python tests/oracle/gen_grad_golden.py [OUTPUT]

Inputs are deterministic formulas (no PRNG) so both sides build them identically:
    value(i, seed) = 0.8 * sin(0.7 * i + seed)      for the i-th element in row-major order
File format: one line per array, '<name> <n> : <v0> <v1> ...' with values as Python float repr.
"""
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import haliax as hax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

OUT_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden", "grad_golden.txt")

Batch = hax.Axis("batch", 3)
Pos = hax.Axis("position", 2)
Embed = hax.Axis("embed", 4)
Mlp = hax.Axis("mlp", 5)
Vocab = hax.Axis("vocab", 6)


def det(seed, *axes):
    n = int(np.prod([a.size for a in axes]))
    v = 0.8 * np.sin(0.7 * np.arange(n, dtype=np.float64) + seed)
    return hax.named(jnp.asarray(v.reshape([a.size for a in axes])), axes)


params = {
    "ln_w": det(1.0, Embed) + 1.0,
    "ln_b": det(2.0, Embed),
    "w1": det(3.0, Embed, Mlp),
    "b1": det(4.0, Mlp),
    "w2": det(5.0, Mlp, Vocab),
}
x = det(6.0, Batch, Pos, Embed)
targets = hax.named(jnp.asarray(np.arange(Batch.size * Pos.size).reshape(Batch.size, Pos.size) % Vocab.size,
                                dtype=jnp.int32), (Batch, Pos))


def loss_fn(p):
    h = hax.nn.standardize(x, Embed, epsilon=1e-5) * p["ln_w"] + p["ln_b"]
    h = hax.dot(h, p["w1"], axis=Embed) + p["b1"]
    h = hax.nn.gelu(h, approximate=True)
    logits = hax.dot(h, p["w2"], axis=Mlp)
    logp = hax.nn.log_softmax(logits, axis=Vocab)
    nll = -hax.sum(logp * hax.nn.one_hot(targets, Vocab, dtype=jnp.float64), axis=Vocab)
    reg = hax.mean(hax.square(hax.tanh(h))) * 0.1
    big = hax.max(logits, axis=Vocab)
    return hax.mean(nll).scalar() + reg.scalar() + 0.01 * hax.sum(hax.exp(big - 1.0)).scalar()


loss, grads = jax.value_and_grad(loss_fn)(params)

from importlib.metadata import version  # noqa: E402

lines = [f"# upstream haliax {version('haliax')} on jax {jax.__version__}, float64, CPU"]


def emit(name, arr):
    flat = np.asarray(arr, dtype=np.float64).reshape(-1)
    lines.append(f"{name} {flat.size} : " + " ".join(repr(float(v)) for v in flat))


emit("loss", loss)
for k in ["ln_w", "ln_b", "w1", "b1", "w2"]:
    emit("grad." + k, grads[k].array)

out = sys.argv[1] if len(sys.argv) > 1 else OUT_DEFAULT
with open(out, "w") as f:
    f.write("\n".join(lines) + "\n")
print(f"wrote {out}: loss {float(loss)!r}")
