#!/usr/bin/env python3
"""Golden attention with learned sinks from upstream Levanter (JAX, CPU): `levanter.layers.attention.
dot_product_attention(..., attn_sink=sinks)`, the function upstream's AttentionWithSink calls.

With the venv of tests/oracle/requirements-levanter.txt (README.md, "Levanter golden data"):

    /tmp/lev-venv/bin/python tests/oracle/gen_attention_sink_golden.py

Writes tests/golden/attention_sink_golden.h5: for each case a group <case>/ holding q {batch, position, kv_head,
q_heads_per_group, head_size}, k and v {batch, key_position, kv_head, head_size}, sinks {kv_head,
q_heads_per_group}, the output (q's axes), a cotangent w and the gradients of sum(output * w) with respect to q, k,
v and the sinks (grad_q, grad_k, grad_v, grad_sinks), float32, with the attributes scale, soft_cap (0: none) and
sliding_window (0: none). The mask is upstream's AttentionMask.causal(sliding_window=...); the backend VANILLA
(upstream's other CPU backend, JAX_FLASH, is checked to agree).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "golden", "attention_sink_golden.h5")

B, P, KV, G, D = 2, 6, 2, 2, 4
# name, scale (None: 1/sqrt(D)), soft cap, sliding window, sink amplitude
CASES = [
    ("causal", None, None, None, 1.0),
    ("window_softcap", 0.4, 1.5, 3, 2.0),
]


def main():
    import h5py
    import haliax as hax
    import jax
    import jax.numpy as jnp
    import numpy as np
    import levanter
    from levanter.layers.attention import AttentionBackend, AttentionMask, dot_product_attention

    Batch, Pos, KPos = hax.Axis("batch", B), hax.Axis("position", P), hax.Axis("key_position", P)
    KVH, QG, HD = hax.Axis("kv_head", KV), hax.Axis("q_heads_per_group", G), hax.Axis("head_size", D)
    rng = np.random.default_rng(5)

    with h5py.File(OUT, "w", libver=("v110", "latest")) as f:
        f.attrs["generator"] = "tests/oracle/gen_attention_sink_golden.py"
        f.attrs["levanter"] = levanter.__version__ if hasattr(levanter, "__version__") else "unknown"
        f.attrs["jax"] = jax.__version__
        for name, scale, cap, window, amp in CASES:
            q = rng.normal(size=(B, P, KV, G, D)).astype(np.float32)
            k = rng.normal(size=(B, P, KV, D)).astype(np.float32)
            v = rng.normal(size=(B, P, KV, D)).astype(np.float32)
            sinks = (amp * rng.normal(size=(KV, G))).astype(np.float32)
            w = rng.uniform(-1, 1, size=(B, P, KV, G, D)).astype(np.float32)
            mask = AttentionMask.causal(sliding_window=window)

            def attend(q, k, v, sinks, backend):
                out = dot_product_attention(
                    Pos, KPos, HD,
                    hax.named(q, (Batch, Pos, KVH, QG, HD)),
                    hax.named(k, (Batch, KPos, KVH, HD)),
                    hax.named(v, (Batch, KPos, KVH, HD)),
                    mask, attn_backend=backend, scaling_factor=scale, logits_soft_cap=cap,
                    attn_sink=hax.named(sinks, (KVH, QG)))
                return out.rearrange((Batch, Pos, KVH, QG, HD)).array

            def loss(q, k, v, sinks):
                return jnp.sum(attend(q, k, v, sinks, AttentionBackend.VANILLA) * w)

            out = np.asarray(attend(q, k, v, sinks, AttentionBackend.VANILLA))
            flash = np.asarray(attend(q, k, v, sinks, AttentionBackend.JAX_FLASH))
            assert np.allclose(out, flash, atol=1e-5), float(np.abs(out - flash).max())
            no_sink = np.asarray(attend(q, k, v, np.full_like(sinks, -1e4), AttentionBackend.VANILLA))
            assert np.abs(out - no_sink).max() > 1e-2  # the sinks matter in this case
            grads = jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, sinks)
            g = f.create_group(name)
            g.attrs["scale"] = float(scale) if scale is not None else 1.0 / np.sqrt(D)
            g.attrs["soft_cap"] = float(cap or 0)
            g.attrs["sliding_window"] = int(window or 0)
            for key, val in [("q", q), ("k", k), ("v", v), ("sinks", sinks), ("out", out), ("w", w),
                             ("grad_q", grads[0]), ("grad_k", grads[1]), ("grad_v", grads[2]),
                             ("grad_sinks", grads[3])]:
                g.create_dataset(key, data=np.asarray(val, dtype=np.float32))
            print(f"{name}: |out| max {np.abs(out).max():.4f}, |grad_sinks| {np.abs(np.asarray(grads[3])).max():.4f}")


if __name__ == "__main__":
    main()
