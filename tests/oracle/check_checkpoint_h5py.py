#!/usr/bin/env python3
"""Check the structure of a Levanter-C++ training checkpoint directory with h5py.

    python3 tests/oracle/check_checkpoint_h5py.py CKPT_DIR   # venv as in gen_hf_gpt2_golden.py
    python3 tests/oracle/check_checkpoint_h5py.py --self-test

Expected layout:
  metadata.json       {"step": N, "timestamp": ..., "is_temporary": bool, ...}
  model.h5            one dataset per parameter, groups follow the dotted path; each dataset has
                      attribute `axes` (1-D strings, one per dimension)
  opt_state.h5        groups mu/... and nu/... mirroring model.h5 (paths and shapes), plus scalars;
                      mu/nu may sit below other groups (e.g. an optimizer-chain index)
  training_state.h5   scalar dataset `step` (== metadata step) and dataset `training_key`
Prints every dataset (shape, dtype, axes); exits 1 on any problem. Extra datasets are allowed.
"""

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_hf_gpt2_golden import ensure_venv  # noqa: E402


def datasets(group):
    """{path relative to group: dataset} for every dataset below group."""
    import h5py
    out = {}
    group.visititems(lambda name, obj: out.__setitem__(name, obj) if isinstance(obj, h5py.Dataset) else None)
    return out


def axes_of(ds):
    if "axes" not in ds.attrs:
        return None
    return [a.decode() if isinstance(a, bytes) else str(a) for a in ds.attrs["axes"]]


def print_file(label, dsets):
    print(f"{label}: {len(dsets)} datasets")
    for name, ds in sorted(dsets.items()):
        axes = axes_of(ds)
        print(f"  {name:55s} {str(ds.dtype):8s} {list(ds.shape)}" + (f" axes={axes}" if axes is not None else ""))


def check(ckpt):
    import h5py
    import numpy as np

    errors = []
    try:
        with open(os.path.join(ckpt, "metadata.json")) as f:
            meta = json.load(f)
        print("metadata.json:", meta)
        step = meta.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            errors.append(f"metadata.json step is {step!r}, not an int")
        for key in ("timestamp", "is_temporary"):
            if key not in meta:
                print(f"note: metadata.json lacks {key!r}")
    except (OSError, ValueError) as e:
        errors.append(f"metadata.json: {e}")
        meta, step = {}, None

    model = {}
    try:
        with h5py.File(os.path.join(ckpt, "model.h5"), "r") as f:
            dsets = datasets(f)
            print_file("model.h5", dsets)
            if not dsets:
                errors.append("model.h5 holds no datasets")
            for name, ds in dsets.items():
                model[name] = ds.shape
                axes = axes_of(ds)
                if axes is None:
                    errors.append(f"model.h5 {name}: no axes attribute")
                elif np.ndim(ds.attrs["axes"]) != 1 or len(axes) != ds.ndim:
                    errors.append(f"model.h5 {name}: axes {axes} do not match rank {ds.ndim}")
    except OSError as e:
        errors.append(f"model.h5: {e}")

    try:
        with h5py.File(os.path.join(ckpt, "opt_state.h5"), "r") as f:
            dsets = datasets(f)
            print_file("opt_state.h5", dsets)
            groups = []
            f.visititems(lambda n, o: groups.append(n) if isinstance(o, h5py.Group) and n.split("/")[-1] in ("mu", "nu") else None)
            for moment in ("mu", "nu"):
                found = [g for g in groups if g.split("/")[-1] == moment]
                if not found:
                    errors.append(f"opt_state.h5 has no {moment} group")
                for g in found:
                    mirror = {n: d.shape for n, d in datasets(f[g]).items()}
                    for name, shape in model.items():
                        if name not in mirror:
                            errors.append(f"opt_state.h5 {g}/{name} missing")
                        elif mirror[name] != shape:
                            errors.append(f"opt_state.h5 {g}/{name} shape {mirror[name]} != model {shape}")
                    extra = sorted(set(mirror) - set(model))
                    if extra:
                        print(f"note: {g} has datasets not in model.h5: {extra}")
    except OSError as e:
        errors.append(f"opt_state.h5: {e}")

    try:
        with h5py.File(os.path.join(ckpt, "training_state.h5"), "r") as f:
            dsets = datasets(f)
            print_file("training_state.h5", dsets)
            if "training_key" not in dsets:
                errors.append("training_state.h5 has no training_key")
            if "step" not in dsets:
                errors.append("training_state.h5 has no step")
            elif dsets["step"].shape != ():
                errors.append(f"training_state.h5 step has shape {dsets['step'].shape}, not scalar")
            else:
                ts_step = dsets["step"][()]
                print("training_state step:", ts_step)
                if step is not None and int(ts_step) != step:
                    errors.append(f"training_state step {ts_step} != metadata step {step}")
    except OSError as e:
        errors.append(f"training_state.h5: {e}")

    for e in errors:
        print("FAIL:", e)
    print("OK" if not errors else f"FAILED ({len(errors)} problems)")
    return not errors


def write_fake(ckpt, step=7, meta_step=7, drop_axes=False, nu_shape_off=False):
    """A tiny checkpoint in the expected format (2 stacked layers, hidden 4)."""
    import h5py
    import numpy as np
    params = {"transformer/blocks/stacked/attn/c_attn/weight": ["layers", "embed", "qkv", "heads", "head_size"],
              "transformer/blocks/stacked/ln_1/weight": ["layers", "embed"],
              "transformer/ln_f/bias": ["embed"],
              "embeddings/token_embeddings/weight": ["vocab", "embed"]}
    sizes = {"layers": 2, "embed": 4, "qkv": 3, "heads": 2, "head_size": 2, "vocab": 5}
    os.makedirs(ckpt)
    with open(os.path.join(ckpt, "metadata.json"), "w") as f:
        json.dump({"step": meta_step, "timestamp": "2025-01-01T00:00:00", "is_temporary": False}, f)
    with h5py.File(os.path.join(ckpt, "model.h5"), "w") as m, h5py.File(os.path.join(ckpt, "opt_state.h5"), "w") as o:
        for i, (path, axes) in enumerate(params.items()):
            shape = tuple(sizes[a] for a in axes)
            ds = m.create_dataset(path, data=np.zeros(shape, np.float32))
            if not (drop_axes and i == 0):
                ds.attrs["axes"] = axes
            o.create_dataset("mu/" + path, data=np.zeros(shape, np.float32))
            nu_shape = shape[::-1] if (nu_shape_off and i == 0) else shape
            o.create_dataset("nu/" + path, data=np.zeros(nu_shape, np.float32))
        o["count"] = np.int32(step)
    with h5py.File(os.path.join(ckpt, "training_state.h5"), "w") as t:
        t["step"] = np.int64(step)
        t["training_key"] = np.array([0, 42], np.uint32)


def self_test():
    cases = {"ok": ({}, True), "step_mismatch": ({"meta_step": 8}, False),
             "no_axes": ({"drop_axes": True}, False), "nu_shape": ({"nu_shape_off": True}, False)}
    verdicts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case, (kw, _) in cases.items():
            print(f"=== {case}")
            write_fake(os.path.join(tmp, case), **kw)
            verdicts[case] = check(os.path.join(tmp, case))
    print("self-test verdicts:", verdicts)
    return all(verdicts[c] == want for c, (_, want) in cases.items())


def main():
    ensure_venv(__file__)
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    ok = self_test() if sys.argv[1] == "--self-test" else check(sys.argv[1])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
