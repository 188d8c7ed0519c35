#!/usr/bin/env python3
"""Upstream Levanter's mixed-precision policy `p=f32,c=bfloat16` on the tiny GPT-2 of gpt2_golden.h5.

Writes tests/golden/gpt2_bf16_golden.h5. Run from the repository root with the venv of README.md ("Levanter golden
data"), after gen_gpt2_golden.py (whose parameters and batch this script reads, so both describe the same model):

    /tmp/lev-venv/bin/python tests/oracle/gen_gpt2_bf16_golden.py

What upstream does with the policy (levanter 1.2.dev1644, see requirements-levanter.txt): the trainer's loss
wrapper calls `mp.cast_to_compute(model)` (jmp policy "p=f32,c=bfloat16": every float parameter cast to bfloat16)
and runs the loss on the cast model, so activations and matrix products are bfloat16 while the parameters and
their gradients stay float32. We reproduce exactly that:

* model:  Gpt2LMHeadModel.init(...) with the parameters of gpt2_golden.h5 put in, the token embeddings times 800
          and the position embeddings times 1000 (so that logits are of order 1 to 10, where bfloat16 rounding shows;
          gpt2_golden.h5's are about 0.01). Stored under `params/`.
* logits: mp.cast_to_compute(model)(tokens, attn_mask) (bfloat16), stored as float32.
* loss:   compute_next_token_loss(mp.cast_to_compute(model), example) (what Trainer's loss wrapper runs).
* grads:  eqx.filter_value_and_grad of that, with respect to the float32 model (float32 gradients).

Stored: `logits` [batch, position, vocab], `loss`, `grads/<path>` (as gpt2_golden.h5), plus the same quantities
in float32 from this run (`logits_f32`, `loss_f32`) so a reader can see how far the policy moves them.
"""

import importlib.metadata
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import equinox as eqx
import h5py
import haliax as hax
import jax
import jax.numpy as jnp
import jmp
import numpy as np

from levanter.models.gpt2 import Gpt2Config, Gpt2LMHeadModel
from levanter.models.lm_model import LmExample, compute_next_token_loss
from levanter.utils.activation import ActivationFunctionEnum

from gen_gpt2_golden import named_leaves  # beside this script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "tests", "golden", "gpt2_golden.h5")
OUT = os.path.join(ROOT, "tests", "golden", "gpt2_bf16_golden.h5")
POLICY = "p=f32,c=bfloat16"
SCALE = {"embeddings/token_embeddings/weight": 800.0, "embeddings/position_embeddings/weight": 1000.0}


def main():
    with h5py.File(SRC, "r") as f:
        attrs = dict(f.attrs)
        params = {}
        f["params"].visititems(lambda n, o: params.__setitem__(n, np.asarray(o)) if isinstance(o, h5py.Dataset) else None)
        tokens_np = np.asarray(f["batch/tokens"])

    config = Gpt2Config(
        seq_len=int(attrs["seq_len"]), hidden_dim=int(attrs["hidden_dim"]), num_layers=int(attrs["num_layers"]),
        num_heads=int(attrs["num_heads"]), mlp_scale=int(attrs["mlp_scale"]),
        activation_function=ActivationFunctionEnum.gelu_new, embed_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0,
        use_bias=True, scale_attn_by_inverse_layer_idx=False, gradient_checkpointing=False)
    Vocab = hax.Axis("vocab", int(attrs["vocab_size"]))
    Batch = hax.Axis("batch", tokens_np.shape[0])
    Pos = config.Pos
    eos = int(attrs["eos_id"])

    model = Gpt2LMHeadModel.init(Vocab, config, key=jax.random.PRNGKey(0))

    def put(path, leaf):
        if not hax.is_named_array(leaf):
            return leaf
        name = "/".join(getattr(p, "name", str(getattr(p, "idx", p))) for p in path)
        value = params[name]
        assert value.shape == leaf.array.shape, (name, value.shape, leaf.array.shape)
        return hax.named(jnp.asarray(value, dtype=jnp.float32), leaf.axes)

    # gpt2_golden.h5's logits are about 0.01 (embeddings of standard deviation 6e-4 and 3e-4), too small for
    # bfloat16 rounding to show: the embeddings are scaled up so that logits are of order 1 to 10.
    for name, factor in SCALE.items():
        params[name] = (params[name] * factor).astype(np.float32)
    model = jax.tree_util.tree_map_with_path(put, model, is_leaf=hax.is_named_array)
    tokens = hax.named(jnp.asarray(tokens_np), (Batch, Pos))
    example = hax.vmap(lambda t: LmExample.causal(t, eos_id=eos), Batch)(tokens)
    mp = jmp.get_policy(POLICY)

    @eqx.filter_jit
    def logits_fn(m, ex, cast):
        if cast:
            m = mp.cast_to_compute(m)
        return m(ex.tokens, ex.attn_mask).rearrange((Batch, Pos, Vocab))

    @eqx.filter_jit
    def loss_and_grad(m, ex):
        return eqx.filter_value_and_grad(lambda mm: compute_next_token_loss(mp.cast_to_compute(mm), ex).scalar())(m)

    logits_f32 = logits_fn(model, example, False)
    loss_f32 = float(eqx.filter_jit(lambda m, ex: compute_next_token_loss(m, ex).scalar())(model, example))
    logits = logits_fn(model, example, True)
    assert logits.array.dtype == jnp.bfloat16, logits.array.dtype
    loss, grads = loss_and_grad(model, example)
    print("loss bf16", float(loss), "f32", loss_f32)
    print("max |logits bf16 - f32|", float(jnp.max(jnp.abs(logits.array.astype(jnp.float32) - logits_f32.array))))

    with h5py.File(OUT, "w", libver=("v110", "latest")) as f:
        f.attrs["generator"] = "tests/oracle/gen_gpt2_bf16_golden.py"
        f.attrs["policy"] = POLICY
        f.attrs["model"] = "tests/golden/gpt2_golden.h5 (params, batch)"
        for pkg in ["levanter", "haliax", "jax", "jaxlib", "jmp", "equinox", "numpy"]:
            f.attrs[f"{pkg}_version"] = importlib.metadata.version(pkg)
        d = f.create_dataset("logits", data=np.asarray(logits.array, np.float32))
        d.attrs["axes"] = ["batch", "position", "vocab"]
        f.create_dataset("loss", data=np.float32(loss))
        f.create_dataset("logits_f32", data=np.asarray(logits_f32.array, np.float32))
        f.create_dataset("loss_f32", data=np.float32(loss_f32))
        p = f.create_group("params")
        for name, value in params.items():
            p.create_dataset(name, data=value)
        g = f.create_group("grads")
        for path, leaf in named_leaves(grads):
            assert leaf.array.dtype == jnp.float32, (path, leaf.array.dtype)
            ds = g.create_dataset("/".join(path), data=np.asarray(leaf.array, np.float32))
            ds.attrs["axes"] = [a.name for a in leaf.axes]
    print("wrote", OUT, os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    sys.exit(main())
