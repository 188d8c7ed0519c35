"""Writes tests/golden/optimizers_golden.txt (Lion, ADOPT, RMSProp-momentum, Cautious, MARS, Adam-mini) and
tests/golden/optimizers_matrix_golden.txt (Muon, Scion, SOAP, PSGD Kron): upstream Levanter's non-AdamW optimizers on
the toy model of tests/oracle/gen_adam_golden.py (an Embedding, a Stacked pair of blocks with a Linear `attn` with bias
and a LayerNorm `ln`, and a Linear `head` with bias; every Linear has out_first=False). Two files keep each under
300 KB (a case is about 21 KB); docs/optimizer.md states the formulas the C++ rules implement.

Every case builds its optimizer through upstream's own config class (`levanter.optim.<X>Config(**fields).build(
NUM_TRAIN_STEPS)`), initialises it on the seeded toy parameters and runs 8 updates with seeded gradients, exactly as
the AdamW generator does: `updates, state = opt.update(grads, state, params)`, `params = optax.apply_updates(params,
updates)` (parameters, gradients and losses drawn as in gen_adam_golden.py: RandomState(1234) for the parameters,
RandomState(crc32(case name)) for one loss and then the gradient leaves of every step).

The text format is the one of tests/golden/adam_golden.txt, so the C++ reader can be shared:

    case <name> <json of the config fields set; every other field keeps upstream's default>
    num_train_steps <n>
    init <leaf path> <floats>                  one line per leaf
    step <k> loss <float>                      then, for that step:
    grad <leaf path> <floats>                  the gradient fed to update()
    lr <learning_rate used at this step> skipped 0
    param <leaf path> <floats>                 the parameters after the update
    end

Extra lines the AdamW reader ignores (it skips unknown tags): `#` comments (the versions, every optimizer that
could not be built or run on the toy and why, and per case the steps on which the max_grad_norm clipping fired), and
`hparam <name> <value>` after the `lr` line for a case with a second injected hyperparameter (MuonConfig's adam_lr).
Floats are float32 written with 9 significant digits ("%.9g", an exact round trip); the loss is the float32 value
written with Python's repr.

    python3 -m venv /tmp/lev-venv
    /tmp/lev-venv/bin/pip install --pre -r tests/oracle/requirements-levanter.txt
    /tmp/lev-venv/bin/python tests/oracle/gen_optimizers_golden.py      # from the repository root (~1.5 min)
    /tmp/lev-venv/bin/python tests/oracle/gen_optimizers_golden.py kron_plain   # only these cases, into $TMPDIR

The output is deterministic (two runs are byte-identical).
"""

import importlib.metadata
import json
import os
import sys
import tempfile
import traceback
import warnings
import zlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import haliax as hax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import levanter.optim as lo  # noqa: E402

warnings.filterwarnings("ignore", category=DeprecationWarning)

# levanter 1.2.dev1644's rmsprop.py, mars.py and scion.py call `jax.tree_map`, which jax removed in 0.6.0 (the
# requirements pin jax 0.7.2, the version of upstream's uv.lock), so those optimizers raise AttributeError there.
# jax.tree_map was an alias of jax.tree_util.tree_map; restoring the alias runs upstream's code unchanged.
JAX_TREE_MAP_SHIM = not hasattr(jax, "tree_map")
if JAX_TREE_MAP_SHIM:
    jax.tree_map = jax.tree_util.tree_map

# SOAP and Kron infer parameter shardings (hax.partitioning.infer_resource_partitions) and look up the mesh, as under
# the Trainer; run every case inside a one-device ("data", "model") mesh and an axis mapping that shards nothing
# (numerically a no-op on one device).
# Kron's update cannot be traced in this upstream version: under jit haliax resolves the mesh to an AbstractMesh and
# kron.py's _init_Q_exprs asks it for `.devices` (ValueError: AbstractMesh does not implement devices), with or
# without a mesh. Its cases run the same update eagerly (op by op), where the concrete mesh is found.
EAGER = {"KronConfig"}
MESH = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))

STEPS = 8
ONLY = set(sys.argv[1:])  # optional case names: write only those, into the temp directory (for debugging)
NUM_TRAIN_STEPS = 8
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))



# The toy, its seeded parameters and its leaf names are gen_adam_golden.py's (same directory).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_adam_golden import make_model, names_of  # noqa: E402


# (case name, config class name, fields). `*_wd_clip` cases: weight decay on (default mask) and a max_grad_norm that
# fires on some of the 8 steps but not all (the steps are listed in a comment line of each case; the value was picked
# from the gradient norms of that case's seeded gradients). Plain cases keep upstream's defaults apart from the
# learning rate(s) and warmup=0 (the default max_grad_norm=1.0 clips on every step there: the seeded gradients have
# norms of about 5..9).
CASES = [
    ("lion_plain", "LionConfig", dict(learning_rate=1e-2, warmup=0.0)),
    ("lion_wd_clip", "LionConfig", dict(learning_rate=1e-2, warmup=0.25, weight_decay=0.5, max_grad_norm=9.0)),
    ("adopt_plain", "AdoptConfig", dict(learning_rate=1e-2, warmup=0.0)),
    ("adopt_wd_clip", "AdoptConfig", dict(learning_rate=1e-2, warmup=0.25, weight_decay=0.5, max_grad_norm=9.0)),
    ("rmsprop_plain", "RMSPropMomentumConfig", dict(learning_rate=1e-2, warmup=0.0)),
    (
        "rmsprop_wd_clip",
        "RMSPropMomentumConfig",
        dict(learning_rate=1e-2, warmup=0.25, weight_decay=0.5, max_grad_norm=8.5),
    ),
    ("cautious_plain", "CautiousConfig", dict(learning_rate=1e-2, warmup=0.0)),
    ("cautious_wd_clip", "CautiousConfig", dict(learning_rate=1e-2, warmup=0.25, weight_decay=0.5, max_grad_norm=9.0)),
    ("mars_plain", "MarsConfig", dict(learning_rate=1e-2, warmup=0.0)),
    ("mars_wd_clip", "MarsConfig", dict(learning_rate=1e-2, warmup=0.25, weight_decay=0.5, max_grad_norm=14.5)),
    ("mini_plain", "MiniConfig", dict(learning_rate=1e-2, warmup=0.0)),
    ("mini_wd_clip", "MiniConfig", dict(learning_rate=1e-2, warmup=0.25, weight_decay=0.5, max_grad_norm=5.0)),
    ("muon_plain", "MuonConfig", dict(learning_rate=2e-2, adam_lr=1e-2, warmup=0.0, use_kimi_scaling=False)),
    ("muon_kimi", "MuonConfig", dict(learning_rate=2e-2, adam_lr=1e-2, warmup=0.0, use_kimi_scaling=True)),
    (
        "muon_kimi_wd_clip",
        "MuonConfig",
        dict(
            learning_rate=2e-2,
            adam_lr=1e-2,
            warmup=0.25,
            use_kimi_scaling=True,
            weight_decay=0.5,
            adam_weight_decay=0.25,
            max_grad_norm=6.5,
        ),
    ),
    ("scion_plain", "ScionConfig", dict(learning_rate=2e-2, warmup=0.0)),
    ("scion_wd_clip", "ScionConfig", dict(learning_rate=2e-2, warmup=0.25, weight_decay=0.5, max_grad_norm=6.5)),
    ("soap_plain", "SoapConfig", dict(learning_rate=1e-2, warmup=0.0)),
    (
        "soap_wd_clip",
        "SoapConfig",
        dict(
            learning_rate=1e-2,
            warmup=0.25,
            weight_decay=0.5,
            max_grad_norm=9.0,
            precondition_frequency=3,
            merge_small_dims=False,
            partition_grads_into_blocks=False,
        ),
    ),
    ("kron_plain", "KronConfig", dict(learning_rate=1e-2, warmup=0.0)),
    # blocks of 2 (every matrix dimension cut, the last block of an odd one padded), without and with merging
    ("kron_blocks", "KronConfig", dict(learning_rate=1e-2, warmup=0.0, merge_small_dims=False, block_size=2)),
    (
        "kron_merge_blocks",
        "KronConfig",
        dict(learning_rate=1e-2, warmup=0.0, target_merged_dim_size=4, block_size=3, memory_save_mode="one_diag"),
    ),
    (
        "kron_wd_clip",
        "KronConfig",
        dict(
            learning_rate=1e-2,
            warmup=0.25,
            weight_decay=0.5,
            max_grad_norm=9.0,
            merge_small_dims=False,
            partition_grads_into_blocks=False,
        ),
    ),
]


def fmt(a):
    return " ".join("%.9g" % x for x in np.asarray(a, dtype=np.float32).reshape(-1))  # exact for float32


def seeded_steps(name, model):
    """The (loss, gradient leaves) of every step: numpy RandomState(crc32(name)), one loss then one normal per leaf."""
    rng = np.random.RandomState(zlib.crc32(name.encode()))
    leaves = jax.tree_util.tree_leaves(model)
    out = []
    for _ in range(STEPS):
        loss = 2.0 + 0.1 * rng.normal()
        grads = [rng.normal(size=x.shape).astype(np.float32) for x in leaves]
        out.append((loss, grads))
    return out


def clip_group(cfg_name, names):
    """Indices of the leaves whose global norm max_grad_norm compares against (the adamw/signum group if any)."""
    if cfg_name == "MiniConfig":  # adamw group: Linear biases and the LayerNorm; embeddings -> mini "embedding"
        return [i for i, n in enumerate(names) if n.endswith("bias") or ".ln." in n]
    if cfg_name in ("MuonConfig", "ScionConfig"):  # every leaf but the Linear weights
        return [i for i, n in enumerate(names) if not (n.endswith("attn.weight") or n == "head.weight")]
    return list(range(len(names)))


def clip_steps(cfg_name, fields, names, steps):
    """The steps on which the max_grad_norm clipping fires (MARS: on c = g + gamma*b1/(1-b1)*(g - g_prev))."""
    default = getattr(lo, cfg_name).__dataclass_fields__["max_grad_norm"].default
    max_norm = fields.get("max_grad_norm", default)
    if not max_norm:
        return None, []
    idx = clip_group(cfg_name, names)
    fired, norms, prev = [], [], None
    for k, (_, grads) in enumerate(steps):
        g = [grads[i].astype(np.float64) for i in idx]
        if cfg_name == "MarsConfig":
            coef = 0.025 * 0.95 / (1 - 0.95)
            p = prev if prev is not None else [np.zeros_like(x) for x in g]
            prev, g = g, [x + coef * (x - y) for x, y in zip(g, p)]
        n = float(np.sqrt(sum((x * x).sum() for x in g)))
        norms.append(n)
        if not n < max_norm:
            fired.append(k)
    return norms, fired


def run_case(out, name, cfg_name, fields):
    cfg = getattr(lo, cfg_name)(**fields)
    model = hax.shard(make_model())  # NamedSharding on the mesh, as the Trainer places parameters
    names = names_of(model)
    steps = seeded_steps(name, model)
    opt = cfg.build(NUM_TRAIN_STEPS)
    state = opt.init(model)
    update = lambda g, s, p: opt.update(g, s, p)  # noqa: E731
    if cfg_name not in EAGER:
        update = jax.jit(update)
    treedef = jax.tree_util.tree_structure(model)
    lines = [f"case {name} {json.dumps(fields, sort_keys=True)}\n", f"num_train_steps {NUM_TRAIN_STEPS}\n"]
    norms, fired = clip_steps(cfg_name, fields, names, steps)
    if norms is not None:
        lines.insert(1, f"# {name}: {cfg_name}; max_grad_norm clipping fires on steps {fired} "
                        f"(clipped-group gradient norms {' '.join('%.3f' % n for n in norms)})\n")
    else:
        lines.insert(1, f"# {name}: {cfg_name}\n")
    for n, leaf in zip(names, jax.tree_util.tree_leaves(model)):
        lines.append(f"init {n} {fmt(leaf)}\n")
    for k, (loss, grads) in enumerate(steps):
        gtree = hax.shard(jax.tree_util.tree_unflatten(treedef, [jnp.asarray(g) for g in grads]))
        lines.append(f"step {k} loss {float(np.float32(loss))!r}\n")
        for n, g in zip(names, grads):
            lines.append(f"grad {n} {fmt(g)}\n")
        updates, state = update(gtree, state, model)
        model = optax.apply_updates(model, updates)
        hp = state.hyperparams
        lines.append(f"lr {float(hp['learning_rate'])!r} skipped 0\n")
        for extra in sorted(k2 for k2 in hp if k2 != "learning_rate"):
            lines.append(f"hparam {extra} {float(hp[extra])!r}\n")
        for n, leaf in zip(names, jax.tree_util.tree_leaves(model)):
            vals = np.asarray(leaf)
            if not np.all(np.isfinite(vals)):
                raise FloatingPointError(f"non-finite parameters in {n} after step {k}")
            lines.append(f"param {n} {fmt(leaf)}\n")
    lines.append("end\n")
    out.writelines(lines)  # only complete cases are written


# Two files, each under 300 KB (one case is about 21 KB): the elementwise optimizers, and those that treat a leaf as a
# matrix or precondition it (Newton-Schulz, eigenbases, Kronecker factors). Same format; the AdamW reader reads both.
FILES = {
    "optimizers_golden.txt": ("LionConfig", "AdoptConfig", "RMSPropMomentumConfig", "CautiousConfig", "MarsConfig",
                              "MiniConfig"),
    "optimizers_matrix_golden.txt": ("MuonConfig", "ScionConfig", "SoapConfig", "KronConfig"),
}

NOTES = {
    "optimizers_matrix_golden.txt": [
        "# muon_plain (use_kimi_scaling=False) cannot run on this toy: MuonConfig.create_mask asserts "
        "`param._out_first or use_kimi_scaling` and the toy's Linears are out_first=False\n",
        "# soap: the step-0 update is zero (scale_by_soap's first call only fills GG and takes Q = eigh(GG + eps*I) "
        "with the columns flipped to descending order); every later step depends on which eigenvectors LAPACK's "
        "syevd returns for repeated eigenvalues. GG of a 1-D leaf after one step is rank one, so for every 1-D leaf "
        "(and, in soap_plain, for every leaf: merge_small_dims flattens the toy's matrices to 1-D and "
        "partition_grads_into_blocks zero-pads each to 256) the basis of the null space is LAPACK's choice. "
        "soap_wd_clip (merge_small_dims and partition_grads_into_blocks off) leaves the 2-D leaves "
        "(embeddings.weight, blocks.stacked.attn.weight, head.weight) independent of that choice: rotating the "
        "degenerate eigenvectors and flipping signs leaves them bit-identical, while the 1-D leaves move by up to "
        "1e-2, and soap_plain's leaves by up to 2.2\n",
        "# kron: KronConfig's update cannot be jitted in this upstream version (haliax resolves the mesh to an "
        "AbstractMesh under jit and kron.py's _init_Q_exprs reads its .devices: ValueError), so the kron cases ran "
        "eagerly. Its preconditioner update draws jax.random normals (state key PRNGKey(0), split every step; "
        "threefry, jax_threefry_partitionable=True) for every leaf, padding included\n",
    ],
}


def main():
    versions = " ".join(
        f"{p} {importlib.metadata.version(p)}" for p in ("levanter", "haliax", "jax", "jaxlib", "optax", "equinox")
    )
    for fname, cfgs in FILES.items():
        cases = [c for c in CASES if c[1] in cfgs and (not ONLY or c[0] in ONLY)]
        if not cases:
            continue
        body, skipped, written = [], [], []

        class Buf:
            def writelines(self, ls):
                body.extend(ls)

        for name, cfg_name, fields in cases:
            try:
                with MESH, hax.axis_mapping({}):
                    run_case(Buf(), name, cfg_name, fields)
                written.append(name)
            except Exception as e:  # noqa: BLE001 - recorded in the header
                tb = traceback.extract_tb(e.__traceback__)[-1]
                where = f"{os.path.basename(tb.filename)}:{tb.lineno} `{tb.line}`"
                msg = f"{type(e).__name__}: {str(e).strip() or '(no message)'} at {where}"
                skipped.append(f"# skipped {name} ({cfg_name} {json.dumps(fields, sort_keys=True)}): {msg}\n")
                print(f"skipped {name}: {msg}", file=sys.stderr)
        path = os.path.join(tempfile.gettempdir() if ONLY else os.path.join(ROOT, "tests", "golden"), fname)
        with open(path, "w") as out:
            out.write(f"# upstream {versions}; {', '.join(cfgs)} on the toy of gen_adam_golden.py; "
                      "written by tests/oracle/gen_optimizers_golden.py\n")
            if JAX_TREE_MAP_SHIM:
                out.write("# jax.tree_map (removed in jax 0.6) restored as jax.tree_util.tree_map for upstream's "
                          "rmsprop, mars and scion; every case ran on one CPU device inside a 1x1 ('data', 'model') "
                          "mesh with an empty axis mapping\n")
            out.writelines(NOTES.get(fname, []))
            out.writelines(skipped)
            out.writelines(body)
        print(f"wrote {path}: {len(written)} cases ({', '.join(written)})", file=sys.stderr)


if __name__ == "__main__":
    main()
