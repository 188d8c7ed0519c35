#!/usr/bin/env python3
"""Write tests/golden/random_golden.txt: reference values from jax.random (CPU).

Usage (from the repository root):
    python3 -m venv /tmp/oracle-venv
    /tmp/oracle-venv/bin/pip install -r tests/oracle/requirements.txt
    /tmp/oracle-venv/bin/python tests/oracle/gen_random_golden.py [OUTPUT]

File format (one record per line, '#' starts a comment line):
    <op> <field>=<value> ... : <value> <value> ...
Fields: mode=p|o (jax_threefry_partitionable True / False), key=K0,K1 (the two
uint32 key words, hex), shape=AxBxC ("scalar" for ()), dtype=f32|f64|u8|...
Floats are written as hex IEEE bit patterns (8 or 16 digits), unsigned bits
and keys as hex, signed integers in decimal.
"exhaustive" records hold a hash over every one of the 2^23 distinct float32
uniform mantissas pushed through a sampler (see exhaustive_hash below).
"""
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.extend as jex  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

OUT_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden",
                           "random_golden.txt")

lines = []


def emit(op, fields, values):
    head = " ".join([op] + [f"{k}={v}" for k, v in fields])
    lines.append(f"{head} : {' '.join(values)}")


def hexkey(k):
    k = np.asarray(k, dtype=np.uint32)
    return f"{int(k[0]):08x},{int(k[1]):08x}"


def shape_str(shape):
    return "x".join(str(d) for d in shape) if shape else "scalar"


def hex_f32(a):
    return [f"{int(v):08x}" for v in np.asarray(a, np.float32).reshape(-1).view(np.uint32)]


def hex_f64(a):
    return [f"{int(v):016x}" for v in np.asarray(a, np.float64).reshape(-1).view(np.uint64)]


def hex_u(a, width):
    digits = max(2, width // 4)
    return [f"{int(v):0{digits}x}" for v in np.asarray(a).reshape(-1)]


def dec(a):
    return [str(int(v)) for v in np.asarray(a).reshape(-1)]


def mode_name(partitionable):
    return "p" if partitionable else "o"


def f32hex_scalar(x):
    return f"{int(np.float32(x).view(np.uint32)):08x}"


# --------------------------------------------------------------------------
# Exhaustive hashes: a PRNG implementation whose "random bits" enumerate all
# 2^23 float32 uniform mantissas (bits = i << 9) drives the real samplers.

N_MANT = 1 << 23
M64 = (1 << 64) - 1


def _enum_bits(key, bit_width, shape):
    assert bit_width == 32
    n = int(np.prod(shape))
    return (lax.iota(np.uint32, n) << np.uint32(9)).reshape(shape)


ENUM_IMPL = jex.random.define_prng_impl(
    key_shape=(2,),
    seed=lambda s: jnp.zeros((2,), jnp.uint32),
    split=lambda k, shape: jnp.zeros((*shape, 2), jnp.uint32),
    random_bits=_enum_bits,
    fold_in=lambda k, d: k,
    name="mantissa_enumeration",
    tag="enm")


def splitmix64(z):
    z = (z + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(M64)
    z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(M64)
    z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & np.uint64(M64)
    return z ^ (z >> np.uint64(31))


def exhaustive_hash(values_u32):
    """sum_i splitmix64((i << 32) | value_bits[i]) mod 2^64."""
    v = np.asarray(values_u32, np.uint32).astype(np.uint64)
    i = np.arange(v.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = splitmix64((i << np.uint64(32)) | v)
    return int(h.sum(dtype=np.uint64)) & M64


def gen_exhaustive():
    k = jax.random.key(0, impl=ENUM_IMPL)
    shape = (N_MANT,)
    cases = [
        ("uniform_f32", [], jax.random.uniform(k, shape, jnp.float32)),
        ("uniform_f32", [("minval", f32hex_scalar(-2.5)), ("maxval", f32hex_scalar(4.0))],
         jax.random.uniform(k, shape, jnp.float32, -2.5, 4.0)),
        ("normal_f32", [], jax.random.normal(k, shape, jnp.float32)),
        ("gumbel_f32", [], jax.random.gumbel(k, shape, jnp.float32)),
        ("truncated_normal_f32", [("lower", f32hex_scalar(-3.0)), ("upper", f32hex_scalar(3.0))],
         jax.random.truncated_normal(k, -3.0, 3.0, shape, jnp.float32)),
        ("truncated_normal_f32", [("lower", f32hex_scalar(-2.0)), ("upper", f32hex_scalar(1.0))],
         jax.random.truncated_normal(k, -2.0, 1.0, shape, jnp.float32)),
    ]
    for name, extra, vals in cases:
        u = np.asarray(vals, np.float32).view(np.uint32)
        emit("exhaustive", [("name", name)] + extra + [("n", N_MANT)],
             [f"{exhaustive_hash(u):016x}"])


# --------------------------------------------------------------------------

SEEDS = [0, 1, 42, 2**32 + 5, 123456789012345, 2**63 - 1, -1]
BITS_SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4), (1000,)]


def gen_keys(x64):
    for s in SEEDS:
        emit("seed", [("x64", int(x64)), ("seed", s)], hex_u(jax.random.PRNGKey(s), 32))


def gen_counter_dependent(partitionable, full):
    m = mode_name(partitionable)
    k0, k1, k42 = (jax.random.PRNGKey(s) for s in (0, 1, 42))
    kf = jax.random.fold_in(k42, 3)

    for key in (k0, k42, kf):
        for n in (1, 2, 3, 5):
            emit("split", [("mode", m), ("key", hexkey(key)), ("n", n)],
                 hex_u(jax.random.split(key, n), 32))

    for key in (k0, k1, k42):
        for shape in (BITS_SHAPES if key is k0 else BITS_SHAPES[:-1]):
            emit("bits", [("mode", m), ("key", hexkey(key)), ("width", 32),
                          ("shape", shape_str(shape))],
                 hex_u(jax.random.bits(key, shape, jnp.uint32), 32))
    for width, dt in ((8, jnp.uint8), (16, jnp.uint16)):
        for shape in ((7,), (3, 5), (33,)):
            emit("bits", [("mode", m), ("key", hexkey(k42)), ("width", width),
                          ("shape", shape_str(shape))],
                 hex_u(jax.random.bits(k42, shape, dt), width))

    # Distributions: the full set in the default mode, a smaller set otherwise.

    def uni(key, shape, lo=None, hi=None):
        if lo is None:
            vals = jax.random.uniform(key, shape, jnp.float32)
            lo, hi = 0.0, 1.0
        else:
            vals = jax.random.uniform(key, shape, jnp.float32, lo, hi)
        emit("uniform", [("mode", m), ("key", hexkey(key)), ("dtype", "f32"),
                         ("shape", shape_str(shape)), ("minval", f32hex_scalar(lo)),
                         ("maxval", f32hex_scalar(hi))], hex_f32(vals))

    uni(k0, (3, 5))
    if full:
        uni(k1, (200,))
        uni(k42, (7,), -2.5, 4.0)
        uni(k0, (100,), 1e-3, 1e3)
        uni(kf, (2, 3, 4), -1.0, 0.0)

    for key, shape in ([(k0, (7,))] + ([(k42, (2, 3, 4)), (k1, (300,))] if full else [])):
        emit("normal", [("mode", m), ("key", hexkey(key)), ("dtype", "f32"),
                        ("shape", shape_str(shape))],
             hex_f32(jax.random.normal(key, shape, jnp.float32)))

    if full:
        for key in (k0, k42):
            emit("bernoulli", [("mode", m), ("key", hexkey(key)), ("dtype", "f32"),
                               ("shape", "100"), ("p", f32hex_scalar(0.3))],
                 dec(jax.random.bernoulli(key, 0.3, (100,))))

    randint_cases = [(k0, (3, 5), -5, 17)]
    if full:
        randint_cases += [(k42, (100,), -5, 17), (k1, (100,), 0, 50257),
                          (kf, (50,), -2**31, 2**31 - 1), (k0, (10,), 5, 5),
                          (k42, (10,), 9, 3), (k1, (64,), 0, 2**31 - 1)]
    for key, shape, lo, hi in randint_cases:
        emit("randint", [("mode", m), ("key", hexkey(key)), ("dtype", "i32"),
                         ("shape", shape_str(shape)), ("minval", lo), ("maxval", hi)],
             dec(jax.random.randint(key, shape, lo, hi, jnp.int32)))

    if full:
        for key, lo, hi in ((k0, -3.0, 3.0), (k42, -2.0, 1.0), (k1, -3.0, 3.0)):
            emit("truncated_normal", [("mode", m), ("key", hexkey(key)), ("dtype", "f32"),
                                      ("shape", "100"), ("lower", f32hex_scalar(lo)),
                                      ("upper", f32hex_scalar(hi))],
                 hex_f32(jax.random.truncated_normal(key, lo, hi, (100,), jnp.float32)))

        logits = 2.0 * jax.random.normal(jax.random.PRNGKey(7), (4, 10), jnp.float32)
        for key in (k0, k1, k42):
            for axis in (-1, 0):
                emit("categorical", [("mode", m), ("key", hexkey(key)), ("dtype", "f32"),
                                     ("shape", "4x10"), ("axis", axis),
                                     ("logits", ",".join(hex_f32(logits)))],
                     dec(jax.random.categorical(key, logits, axis=axis)))
        flat = jnp.zeros((3, 7), jnp.float32)
        emit("categorical", [("mode", m), ("key", hexkey(k42)), ("dtype", "f32"),
                             ("shape", "3x7"), ("axis", -1),
                             ("logits", ",".join(hex_f32(flat)))],
             dec(jax.random.categorical(k42, flat, axis=-1)))

    perm_cases = [(k0, 10), (k42, 100)]
    if full:
        perm_cases += [(k1, 10), (k0, 100), (kf, 2000)]
    else:
        perm_cases += [(kf, 2000)]
    for key, n in perm_cases:
        emit("permutation", [("mode", m), ("key", hexkey(key)), ("n", n)],
             dec(jax.random.permutation(key, n)))


def gen_x64():
    with jax.enable_x64(True):
        gen_keys(True)
        k0, k42 = jax.random.PRNGKey(0), jax.random.PRNGKey(42)
        for key in (k0, k42):
            for shape in ((7,), (3, 5)):
                emit("bits", [("mode", "p"), ("key", hexkey(key)), ("width", 64),
                              ("shape", shape_str(shape))],
                     hex_u(jax.random.bits(key, shape, jnp.uint64), 64))
        for key, shape, lo, hi in ((k0, (3, 5), 0.0, 1.0), (k42, (7,), -2.5, 4.0)):
            emit("uniform", [("mode", "p"), ("key", hexkey(key)), ("dtype", "f64"),
                             ("shape", shape_str(shape)),
                             ("minval", hex_f64(np.float64(lo))[0]),
                             ("maxval", hex_f64(np.float64(hi))[0])],
                 hex_f64(jax.random.uniform(key, shape, jnp.float64, lo, hi)))
        emit("bernoulli", [("mode", "p"), ("key", hexkey(k0)), ("dtype", "f64"),
                           ("shape", "100"), ("p", hex_f64(np.float64(0.3))[0])],
             dec(jax.random.bernoulli(k0, 0.3, (100,))))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else OUT_DEFAULT
    default_part = bool(jax.config.jax_threefry_partitionable)
    lines.append("# Golden values for haliax random (jax.random on CPU). Generated by")
    lines.append("# tests/oracle/gen_random_golden.py; do not edit by hand.")
    emit("meta", [("jax", jax.__version__), ("jaxlib", jaxlib.__version__),
                  ("numpy", np.__version__),
                  ("default_threefry_partitionable", int(default_part)),
                  ("default_x64", int(bool(jax.config.jax_enable_x64)))], ["ok"])
    gen_keys(False)
    for k in (jax.random.PRNGKey(0), jax.random.PRNGKey(42)):
        for d in (0, 1, 7, 2**31, 2**32 - 1):
            emit("fold_in", [("key", hexkey(k)), ("data", d)],
                 hex_u(jax.random.fold_in(k, np.uint32(d)), 32))
    for partitionable in (default_part, not default_part):
        jax.config.update("jax_threefry_partitionable", partitionable)
        try:
            gen_counter_dependent(partitionable, full=partitionable == default_part)
        finally:
            jax.config.update("jax_threefry_partitionable", default_part)
    gen_x64()
    gen_exhaustive()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} lines to {out}")


if __name__ == "__main__":
    main()
