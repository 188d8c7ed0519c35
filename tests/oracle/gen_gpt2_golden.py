#!/usr/bin/env python3
"""Golden data for a tiny GPT-2 from the real upstream Levanter (JAX, CPU backend).

Writes tests/golden/gpt2_golden.h5. Run from the repository root with the venv described in
tests/oracle/README.md ("Levanter golden data"):

    /tmp/lev-venv/bin/python tests/oracle/gen_gpt2_golden.py

Upstream code paths used (levanter 1.2.dev1644, haliax 1.4.dev453, jax 0.7.2; see
requirements-levanter.txt):

* model:   levanter.models.gpt2.Gpt2LMHeadModel.init(Vocab, config, key=jax.random.PRNGKey(0)),
           then every LayerNorm weight := 1 + 0.1*N(0,1), every bias := 0.05*N(0,1) (numpy
           default_rng(1234), drawn in pytree-leaf order; the drawn values are what is stored).
* example: levanter.models.lm_model.LmExample.causal(tokens_1d, eos_id=100), hax.vmap'ed over the
           "batch" axis (causal() only takes 1-D tokens; upstream's data pipeline also builds one
           example per sequence). With eos_id it sets attn_mask = AttentionMask.causal()
           .with_segment_ids(segment_ids), segment_ids = cumsum(roll(tokens, 1) == eos, with
           position 0 forced to segment 0), i.e. the token *after* an EOS starts a new segment.
           loss_mask = 1 everywhere except the last position (int32). pos_ids are NOT reset at
           segment starts (position embeddings use 0..seq_len-1).
* logits:  model(example.tokens, example.attn_mask)  (LmHeadModel.__call__: activations, then
           hax.dot with the tied token-embedding matrix over "embed").
* loss:    levanter.models.lm_model.compute_next_token_loss(model, example) (reduction=hax.mean
           over all axes, masked by loss_mask -> mean over the 2*15 predicted tokens).
           loss_zloss: same with logsumexp_weight=1e-4 (z-loss term 1e-4 * logsumexp^2 per token).
           The attention backend is upstream's default on CPU: AttentionBackend.JAX_FLASH.
* grads:   eqx.filter_value_and_grad(compute_next_token_loss)(model, example) (what
           Trainer._compute_gradients_microbatched does without microbatching).
* adam:    optimizer = levanter.optim.AdamConfig(learning_rate=1e-3, weight_decay=0.1, beta1=0.9,
           beta2=0.95, epsilon=1e-8, max_grad_norm=1.0, warmup=0.2, min_lr_ratio=0.1,
           lr_schedule="cosine").build(num_train_steps=5)
           = optax.inject_hyperparams(chain(clip_by_global_norm(1.0), scale_by_adam(0.9, 0.95, 1e-8),
             add_decayed_weights(0.1, mask=build_weight_decay_mask()), scale(-lr)))(lr=lr_scheduler(5)).
           state = levanter.trainer_state.TrainerState.init(optimizer, model, key=PRNGKey(1)),
           then 5x: loss, grads = eqx.filter_value_and_grad(compute_next_token_loss)(state.model, ex);
           state, _ = state.take_step(grads, loss=loss, key=...) (-> take_train_step:
           optimizer.update(grads, opt_state, params=model) + haliax.quantization.apply_updates).
           This is exactly Trainer._train_step minus jit/sharding/hooks. adam/learning_rates[i] is
           opt_state.hyperparams["learning_rate"] after update i, i.e. lr_scheduler(5)(i), the value
           used by update i. The default weight-decay mask (no decay for paths containing
           "LayerNorm"/"Embedding", nor for "...bias") is recorded per parameter as attribute
           `weight_decay` (1/0) on params/* datasets.
"""

import dataclasses
import importlib.metadata
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import equinox as eqx
import h5py
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np

from levanter.layers.attention import AttentionBackend, AttentionMask
from levanter.models.gpt2 import Gpt2Config, Gpt2LMHeadModel
from levanter.models.lm_model import LmExample, compute_next_token_loss
from levanter.optim import AdamConfig
from levanter.trainer_state import TrainerState
from levanter.utils.activation import ActivationFunctionEnum

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "golden", "gpt2_golden.h5")

VOCAB_SIZE = 101
EOS_ID = 100
BATCH = 2
NUM_ADAM_STEPS = 5


def named_leaves(tree):
    """[(path list, NamedArray)] for every NamedArray leaf, in jax pytree order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=hax.is_named_array)
    out = []
    for path, leaf in flat:
        if not hax.is_named_array(leaf):
            continue
        names = []
        for p in path:
            if isinstance(p, jax.tree_util.GetAttrKey):
                names.append(p.name)
            elif isinstance(p, jax.tree_util.DictKey):
                names.append(str(p.key))
            elif isinstance(p, jax.tree_util.SequenceKey):
                names.append(str(p.idx))
            else:
                raise ValueError(f"unexpected path element {p!r}")
        out.append((names, leaf))
    return out


# levanter's _state_dict_key_map: transformer -> (flattened), blocks -> "h", embeddings -> (flattened),
# token_embeddings -> "wte", position_embeddings -> "wpe"; Stacked's "stacked" -> layer index.
_HF_RENAME = {"transformer": None, "embeddings": None, "blocks": "h", "stacked": "{layer}",
              "token_embeddings": "wte", "position_embeddings": "wpe"}


def hf_name(path):
    parts = []
    for p in path:
        r = _HF_RENAME.get(p, p)
        if r is not None:
            parts.append(r)
    return ".".join(parts)


def perturb(model, rng):
    def f(path, leaf):
        if not hax.is_named_array(leaf):
            return leaf
        names = [getattr(p, "name", str(p)) for p in path]
        shape = leaf.array.shape
        if names[-1] == "bias":
            new = 0.05 * rng.standard_normal(shape)
        elif "ln_1" in names or "ln_2" in names or "ln_f" in names:
            assert names[-1] == "weight"
            new = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            return leaf
        return hax.named(jnp.asarray(new, dtype=leaf.array.dtype), leaf.axes)

    return jax.tree_util.tree_map_with_path(f, model, is_leaf=hax.is_named_array)


def write_tree(group, tree, attrs_from=None):
    for path, leaf in named_leaves(tree):
        name = "/".join(path)
        ds = group.create_dataset(name, data=np.asarray(leaf.array, dtype=np.float32))
        ds.attrs["axes"] = [a.name for a in leaf.axes]
        if attrs_from is not None:
            for k, v in attrs_from.get(name, {}).items():
                ds.attrs[k] = v


def main():
    config = Gpt2Config(
        seq_len=16,
        hidden_dim=32,
        num_layers=2,
        num_heads=4,
        mlp_scale=4,
        activation_function=ActivationFunctionEnum.gelu_new,
        embed_pdrop=0.0,
        resid_pdrop=0.0,
        attn_pdrop=0.0,
        use_bias=True,
        scale_attn_by_inverse_layer_idx=False,
        gradient_checkpointing=False,
    )
    Vocab = hax.Axis("vocab", VOCAB_SIZE)
    Batch = hax.Axis("batch", BATCH)
    Pos = config.Pos

    model = Gpt2LMHeadModel.init(Vocab, config, key=jax.random.PRNGKey(0))
    model = perturb(model, np.random.default_rng(1234))

    # tokens: random in [0, 100) plus EOS (=100) inside the sequences
    trng = np.random.default_rng(42)
    tokens_np = trng.integers(0, EOS_ID, size=(BATCH, config.seq_len)).astype(np.int32)
    tokens_np[0, 4] = EOS_ID
    tokens_np[0, 10] = EOS_ID
    tokens_np[1, 7] = EOS_ID
    tokens = hax.named(jnp.asarray(tokens_np), (Batch, Pos))

    example = hax.vmap(lambda t: LmExample.causal(t, eos_id=EOS_ID), Batch)(tokens)
    assert isinstance(example.attn_mask, AttentionMask) and example.attn_mask.segment_ids is not None
    seg_q, seg_k = example.attn_mask.segment_ids
    segment_ids = np.asarray(seg_q.array)
    # the same batch without segment ids, to prove masking changes the result
    example_noseg = hax.vmap(lambda t: LmExample.causal(t), Batch)(tokens)

    @eqx.filter_jit
    def logits_fn(m, ex):
        return m(ex.tokens, ex.attn_mask)

    @eqx.filter_jit
    def loss_fn(m, ex, zw):
        return compute_next_token_loss(m, ex, logsumexp_weight=zw).scalar()

    @eqx.filter_jit
    def loss_and_grad(m, ex):
        return eqx.filter_value_and_grad(lambda mm: compute_next_token_loss(mm, ex).scalar())(m)

    logits = logits_fn(model, example)
    logits = logits.rearrange((Batch, Pos, Vocab))
    loss, grads = loss_and_grad(model, example)
    loss_zloss = loss_fn(model, example, 1e-4)
    loss_noseg = loss_fn(model, example_noseg, None)
    print("loss", float(loss), "loss_zloss", float(loss_zloss), "loss without segment ids", float(loss_noseg))
    assert abs(float(loss) - float(loss_noseg)) > 1e-4, "segment masking had no effect"
    logits_noseg = logits_fn(model, example_noseg).rearrange((Batch, Pos, Vocab))
    print("max |logits - logits without segment ids|", float(jnp.max(jnp.abs(logits.array - logits_noseg.array))))

    # cross-check: upstream's VANILLA attention backend gives the same numbers (up to rounding)
    vconfig = dataclasses.replace(config, attn_backend=AttentionBackend.VANILLA)
    vmodel = perturb(Gpt2LMHeadModel.init(Vocab, vconfig, key=jax.random.PRNGKey(0)), np.random.default_rng(1234))
    vlogits = logits_fn(vmodel, example).rearrange((Batch, Pos, Vocab))
    print("max |logits(JAX_FLASH) - logits(VANILLA)|", float(jnp.max(jnp.abs(logits.array - vlogits.array))))

    # ---- AdamW through upstream's TrainerState.take_step
    opt_config = AdamConfig(
        learning_rate=1e-3,
        weight_decay=0.1,
        beta1=0.9,
        beta2=0.95,
        epsilon=1e-8,
        max_grad_norm=1.0,
        warmup=0.2,
        min_lr_ratio=0.1,
        lr_schedule="cosine",
    )
    optimizer = opt_config.build(num_train_steps=NUM_ADAM_STEPS)
    state = TrainerState.init(optimizer, model, key=jax.random.PRNGKey(1))

    @eqx.filter_jit
    def train_step(state, ex):
        l, g = eqx.filter_value_and_grad(lambda mm: compute_next_token_loss(mm, ex).scalar())(state.model)
        new_state, _ = state.take_step(g, loss=l, key=state.training_key)
        return l, new_state

    adam_losses, adam_lrs = [], []
    for i in range(NUM_ADAM_STEPS):
        l, state = train_step(state, example)
        adam_losses.append(float(l))
        adam_lrs.append(float(state.opt_state.hyperparams["learning_rate"]))
    sched = opt_config.lr_scheduler(NUM_ADAM_STEPS)
    assert np.allclose(adam_lrs, [float(sched(i)) for i in range(NUM_ADAM_STEPS)])
    print("adam losses", adam_losses)
    print("adam lrs", adam_lrs)

    # weight-decay mask as built by upstream (default mask)
    mask = opt_config.build_weight_decay_mask()(model)
    model_paths = {"/".join(p) for p, _ in named_leaves(model)}
    flat_mask = {}
    for mpath, mval in jax.tree_util.tree_flatten_with_path(mask)[0]:
        key = "/".join(getattr(p, "name", str(p)) for p in mpath)
        if key in model_paths:  # skips non-parameter bool fields such as Gpt2Attention.inference
            flat_mask[key] = bool(mval)
    assert set(flat_mask) == model_paths, (sorted(flat_mask), sorted(model_paths))
    print("weight decay:", {k: int(v) for k, v in flat_mask.items()})

    # HF names: check against upstream's own state-dict conversion
    sd = hax.state_dict.to_torch_compatible_state_dict(model)
    attrs = {}
    for path, leaf in named_leaves(model):
        name = "/".join(path)
        hf = hf_name(path)
        probe = hf.replace("{layer}", "0")
        assert probe in sd, (probe, sorted(sd.keys()))
        attrs[name] = {"hf_name": hf, "weight_decay": int(flat_mask[name])}

    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with h5py.File(OUT, "w", libver=("v110", "latest")) as f:
        f.attrs["generator"] = "tests/oracle/gen_gpt2_golden.py"
        for pkg in ["levanter", "haliax", "jax", "jaxlib", "equinox", "optax", "numpy"]:
            f.attrs[f"{pkg}_version"] = importlib.metadata.version(pkg)
        for k in ["seq_len", "hidden_dim", "num_layers", "num_heads", "mlp_scale", "initializer_range",
                  "embed_pdrop", "resid_pdrop", "attn_pdrop", "layer_norm_epsilon", "use_bias",
                  "scale_attn_by_inverse_layer_idx", "upcast_attn", "gradient_checkpointing"]:
            v = getattr(config, k)
            f.attrs[k] = int(v) if isinstance(v, bool) else v
        f.attrs["activation_function"] = str(getattr(config.activation_function, "value", config.activation_function))
        f.attrs["vocab_size"] = VOCAB_SIZE
        f.attrs["vocab_axis"] = "vocab"
        f.attrs["eos_id"] = EOS_ID
        f.attrs["dtype"] = "float32"
        f.attrs["init_key"] = "jax.random.PRNGKey(0)"
        f.attrs["attn_backend"] = "JAX_FLASH (upstream default on CPU)"
        f.attrs["adam_config"] = json.dumps(dict(
            learning_rate=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.95, epsilon=1e-8, max_grad_norm=1.0,
            warmup=0.2, min_lr_ratio=0.1, lr_schedule="cosine", num_train_steps=NUM_ADAM_STEPS))

        write_tree(f.create_group("params"), model, attrs)
        write_tree(f.create_group("grads"), grads)

        b = f.create_group("batch")
        d = b.create_dataset("tokens", data=tokens_np)
        d.attrs["axes"] = ["batch", "position"]
        d = b.create_dataset("segment_ids", data=segment_ids.astype(np.int32))
        d.attrs["axes"] = ["batch", "position"]
        d = b.create_dataset("loss_mask", data=np.asarray(example.loss_mask.rearrange((Batch, Pos)).array, np.int32))
        d.attrs["axes"] = ["batch", "position"]

        d = f.create_dataset("logits", data=np.asarray(logits.array, np.float32))
        d.attrs["axes"] = ["batch", "position", "vocab"]
        f.create_dataset("loss", data=np.float32(loss))
        f.create_dataset("loss_zloss", data=np.float32(loss_zloss))
        f["loss_zloss"].attrs["logsumexp_weight"] = 1e-4
        f.create_dataset("loss_no_segment_ids", data=np.float32(loss_noseg))
        f.attrs["loss"] = float(loss)

        a = f.create_group("adam")
        a.create_dataset("losses", data=np.asarray(adam_losses, np.float32))
        a.create_dataset("learning_rates", data=np.asarray(adam_lrs, np.float32))
        write_tree(a.create_group("final_params"), state.model)

    print("wrote", OUT, os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    sys.exit(main())
