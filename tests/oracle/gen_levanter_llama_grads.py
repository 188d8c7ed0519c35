#!/usr/bin/env python3
"""Upstream Levanter (JAX, CPU) logits, losses and gradients for the tests/golden/hf_llama/ cases.

Run gen_hf_llama_golden.py first (it writes the checkpoints and the torch side of each
<case>_golden.h5), then, with the venv of tests/oracle/requirements-levanter.txt (see README.md,
"Levanter golden data"; this script also needs `transformers`, which requirements-upstream-train.txt pins
to 4.57.6):

    /tmp/lev-venv/bin/python tests/oracle/gen_levanter_llama_grads.py

For each case it
  * reads <case>/config.json (written by transformers 5.x: RoPE settings live in "rope_parameters", which
    transformers 4.57 does not know -- it would silently fall back to rope_theta 10000 and no scaling), moves
    rope_parameters back to the 4.x keys rope_theta / rope_scaling, builds the transformers 4.57 config and
    converts it with upstream's XxxConfig.from_hf_config; the fields that from_hf_config drops or cannot
    read are put back with dataclasses.replace and listed in the h5 attribute `levanter_config_fixups`;
  * builds XxxLMHeadModel.init(Vocab(64), config, key=PRNGKey(0)) and loads model.safetensors into it with
    haliax.state_dict.from_torch_compatible_state_dict (checked by a round trip through
    to_torch_compatible_state_dict, which must give back every tensor bit for bit);
  * example = hax.vmap(LmExample.causal, "batch")(tokens) (no eos_id: one segment, loss_mask = 1 except at
    the last position), logits = model(example.tokens, example.attn_mask), and
    loss, grads = eqx.filter_value_and_grad(compute_next_token_loss(model, example).scalar()) -- the mean
    next-token cross-entropy over the 2 x 15 predicted positions, as in the torch files;
  * writes levanter_logits [2,16,64], levanter_loss, levanter_grads/<hf name> (to_torch_compatible_state_dict
    of the gradient tree: HF names and HF shapes), levanter_rope_inv_freq / levanter_rope_attention_scaling
    (read back from upstream's rotary module), and the attributes levanter_matches_torch (1/0),
    levanter_max_abs_grad_diff, levanter_max_rel_grad_diff, levanter_note, ... into <case>_golden.h5.

For the Mixtral cases (mixtral_top2, mixtral_top1; gen_hf_mixtral_golden.py) it loads the checkpoint into upstream's
MixtralLMHeadModel (MixtralConfig.from_hf_config, then lbl_coef 0.01 / rzl_coef 0.001 set explicitly, no sliding
window), runs it inside a 1-device Mesh (replica, data, model) with hax.axis_mapping as upstream's
tests/test_mixtral.py does (its MoE block uses shard_map), and writes levanter_loss_with_aux and
levanter_grads_with_aux/<hf name> (compute_next_token_loss, which adds the aux losses; compare loss_with_aux /
grads_with_aux), the cross-entropy-only levanter_loss / levanter_grads / levanter_logits (coefficients None),
per-layer levanter_moe_lbl / levanter_moe_rzl / levanter_moe_expert_loads, and the attributes
levanter_mixtral_matches_torch (1.0 / 0.0), levanter_mixtral_grad_diffs (per tensor group), and, on a mismatch,
levanter_mixtral_difference. See README-hf.md, "Upstream Levanter on the Mixtral cases".

Also writes levanter_init.h5: LlamaLMHeadModel.init(Vocab(64), LlamaConfig(seq_len=64, hidden_dim=32,
intermediate_dim=40, num_layers=2, num_heads=4, num_kv_heads=2), key=PRNGKey(0)) in the `params/` layout of
gpt2_golden.h5 (gen_gpt2_golden.py).
"""

import dataclasses
import importlib.metadata
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import equinox as eqx  # noqa: E402
import h5py  # noqa: E402
import haliax as hax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import transformers  # noqa: E402
from haliax.partitioning import ResourceAxis  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from levanter.layers.rotary import DefaultRotaryEmbeddingsConfig  # noqa: E402
from levanter.models.gemma import (  # noqa: E402
    Gemma2Config,
    Gemma2LMHeadModel,
    Gemma3Config,
    Gemma3LMHeadModel,
    GemmaConfig,
    GemmaLMHeadModel,
)
from levanter.models.llama import LlamaConfig, LlamaLMHeadModel  # noqa: E402
from levanter.models.lm_model import LmExample, compute_next_token_loss  # noqa: E402
from levanter.models.mistral import MistralConfig, MistralLMHeadModel  # noqa: E402
from levanter.models.mixtral import MixtralConfig, MixtralLMHeadModel  # noqa: E402
from levanter.models.olmo import Olmo2Config, Olmo2LMHeadModel  # noqa: E402
from levanter.models.qwen import Qwen3Config, Qwen3LMHeadModel, QwenConfig, QwenLMHeadModel  # noqa: E402
from levanter.optim import AdamConfig  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_gpt2_golden import named_leaves, write_tree  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "golden", "hf_llama")

VOCAB = 64
# relative tolerance (max |diff| / max |torch| per tensor) under which levanter "matches" torch
MATCH_RTOL = 1e-4

# case -> (upstream config class, upstream model class, expected levanter_matches_torch)
CASES = {
    "llama_mha": (LlamaConfig, LlamaLMHeadModel, True),
    "llama_gqa_tied_linear": (LlamaConfig, LlamaLMHeadModel, True),
    "llama_mqa_llama3": (LlamaConfig, LlamaLMHeadModel, True),
    "llama_yarn_headdim": (LlamaConfig, LlamaLMHeadModel, False),
    "mistral_sw": (MistralConfig, MistralLMHeadModel, False),
    "qwen2_sw": (QwenConfig, QwenLMHeadModel, False),
    "qwen3": (Qwen3Config, Qwen3LMHeadModel, True),
    # Not here: gemma_mqa (upstream's Gemma attention ignores head_dim, taking hidden_dim / num_heads, so it cannot
    # load a checkpoint whose head_dim differs; gemma_gqa is the Gemma 1 case it can) and olmo2_tied_llama3
    # (transformers 4.57's Olmo2Config refuses llama3 rope_scaling, so upstream cannot read that config).
    "gemma_gqa": (GemmaConfig, GemmaLMHeadModel, True),
    "gemma2_softcap": (Gemma2Config, Gemma2LMHeadModel, False),
    "gemma3_local": (Gemma3Config, Gemma3LMHeadModel, False),
    "olmo2_gqa": (Olmo2Config, Olmo2LMHeadModel, True),
}

NOTES = {
    "llama_yarn_headdim": (
        "upstream YarnRotaryEmbeddings differs from transformers' yarn: (1) it finds the ramp bounds with "
        "half the head dim (find_dim uses head_dim/2 where transformers uses head_dim), (2) it divides the "
        "positions by factor on top of the interpolated inv_freq (so every frequency is scaled by 1/factor "
        "once more), (3) its cos/sin scale is sqrt(0.1*mscale*ln(factor)+1) where transformers' "
        "attention_factor is 0.1*ln(factor)+1. Also LlamaConfig.from_hf_config drops head_dim (fixed up "
        "here). levanter_rope_inv_freq / levanter_rope_attention_scaling hold upstream's effective values."),
    "mistral_sw": (
        "upstream MistralConfig keeps sliding_window but MistralLMHeadModel never applies it: with "
        "LmExample.causal(tokens) attention is plain causal on every layer, transformers windows every layer "
        "(window 4). levanter_* here are upstream's plain-causal results. Building the example with "
        "LmExample.causal(tokens, sliding_window=4) (AttentionMask sliding window, k > q - 4, all layers) "
        "reproduces transformers; see the levanter_sw_mask_* attributes."),
    "qwen2_sw": (
        "upstream QwenDecoderLayer has no sliding-window attention: with use_sliding_window and a "
        "sliding_window set it means to raise NotImplementedError('Sliding window attention is not "
        "implemented in Qwen yet.') when seq_len > sliding_window, but its guard compares "
        "x.resolve_axis('position') (an Axis) with an int, so it raises TypeError (see "
        "levanter_sliding_window_error) for any sequence length; it has no per-layer (max_window_layers / "
        "layer_types) logic either. levanter_* here are computed with "
        "use_sliding_window=False, i.e. plain causal attention on both layers, while transformers windows "
        "layer 1 only (layer_types [full_attention, sliding_attention]); a global AttentionMask sliding "
        "window (LmExample.causal(tokens, sliding_window=4)) windows both layers and does not match either, "
        "see levanter_sw_mask_* attributes. QwenConfig.from_hf_config also reads hf_config.no_bias, which "
        "transformers' Qwen2Config does not have (fixed up here: use_bias=False = no MLP/norm biases; q/k/v "
        "biases are always on in upstream's Qwen attention)."),
    "gemma2_softcap": (
        "upstream's Gemma 2 keeps query_pre_attn_scalar, final_logit_softcapping and sliding_window in its config "
        "but does not use them: its attention scales by 1/sqrt(head_dim) (here 1/sqrt(8), transformers "
        "1/sqrt(12)), its logits are not soft-capped (transformers caps them at 1.0 here), and every layer attends "
        "in full (transformers windows layer 0 to 4 keys). Only the attention soft cap (0.5) is applied by both."),
    "gemma3_local": (
        "upstream's Gemma 3 treats every layer as global (its code says so): no sliding window and the global "
        "RoPE on every layer, where transformers windows layers 0 and 1 (4 keys) and gives them the local RoPE "
        "base (100); upstream also scales attention by 1/sqrt(head_dim), which equals 1/sqrt(query_pre_attn_scalar) "
        "here (8)."),
}


def legacy_hf_config(case_dir):
    """config.json (transformers 5.x) -> transformers 4.57 config object with rope_theta / rope_scaling."""
    with open(os.path.join(case_dir, "config.json")) as f:
        cj = json.load(f)
    legacy = dict(cj)
    rp = dict(legacy.pop("rope_parameters"))
    if "full_attention" in rp:  # Gemma 3: one RoPE per layer type
        legacy["rope_local_base_freq"] = rp["sliding_attention"]["rope_theta"]
        rp = dict(rp["full_attention"])
    legacy["rope_theta"] = rp.pop("rope_theta")
    legacy["rope_scaling"] = None if rp.get("rope_type", "default") == "default" else rp
    cfg_cls = transformers.CONFIG_MAPPING[legacy["model_type"]]
    hf = cfg_cls.from_dict(legacy)
    naive = cfg_cls.from_dict(cj)  # what upstream would get from the file as it is
    return cj, hf, naive


def levanter_config(config_cls, cj, hf, naive):
    fixups = []
    if config_cls is Gemma3Config:
        # upstream declares Gemma3Config.from_hf_config without @classmethod; call it with an explicit class
        fixups.append("Gemma3Config.from_hf_config lacks @classmethod upstream; called as from_hf_config(cls, hf)")
        cfg = config_cls.from_hf_config(config_cls, hf)
        return finish_config(config_cls, cfg, cj, hf, naive, fixups)
    try:
        cfg = config_cls.from_hf_config(hf)
    except AttributeError as e:
        assert config_cls is QwenConfig and "no_bias" in str(e), e
        fixups.append(f"from_hf_config raised AttributeError({e}); set hf_config.no_bias=True first")
        hf.no_bias = True
        cfg = config_cls.from_hf_config(hf)
    return finish_config(config_cls, cfg, cj, hf, naive, fixups)


def finish_config(config_cls, cfg, cj, hf, naive, fixups):
    rope_from_file = None
    try:
        rope_from_file = (config_cls.from_hf_config(config_cls, naive) if config_cls is Gemma3Config
                          else config_cls.from_hf_config(naive)).rope
    except Exception as e:  # noqa: BLE001 -- only informative
        rope_from_file = f"error: {type(e).__name__}: {e}"
    repl = dict(seq_len=16, gradient_checkpointing=False)
    head_dim = cj.get("head_dim") or cj["hidden_size"] // cj["num_attention_heads"]
    if head_size_of(cfg) != head_dim:
        fixups.append(f"head_dim {head_size_of(cfg)} -> {head_dim} (from_hf_config dropped head_dim)")
        repl["head_dim"] = head_dim
    if config_cls is QwenConfig and cfg.use_sliding_window:
        fixups.append("use_sliding_window True -> False (upstream's Qwen layer cannot run with it, see "
                      "levanter_sliding_window_error)")
        repl["use_sliding_window"] = False
    cfg = dataclasses.replace(cfg, **repl)
    fixups.append("seq_len %d -> 16 (Pos axis = the 16 token positions), gradient_checkpointing -> False"
                  % cj["max_position_embeddings"])
    return cfg, fixups, rope_from_file


def head_size_of(cfg):
    """The head size upstream uses: LlamaConfig's actual_head_size, the Gemma configs' head_dim."""
    return (getattr(cfg, "actual_head_size", None) or getattr(cfg, "head_dim", None)
            or cfg.hidden_dim // cfg.num_heads)


def upstream_rope(model, head_dim, n_pos=16):
    """Effective inv_freq and cos/sin scale of upstream's rotary module: apply it to q = [1]*half + [0]*half,
    whose output is [T cos(f p)] + [T sin(f p)] for the angles f p of each position p."""
    attn = model.transformer.layers.stacked.self_attn
    rot = attn.rot_embs
    HeadSize = hax.Axis("head_size", head_dim)
    Pos = hax.Axis("position", n_pos)
    half = head_dim // 2
    q = hax.named(jnp.concatenate([jnp.ones((n_pos, half)), jnp.zeros((n_pos, half))], axis=1).astype(jnp.float32),
                  (Pos, HeadSize))
    out = np.asarray(rot(q, hax.arange(Pos)).array, np.float64)
    cos, sin = out[:, :half], out[:, half:]
    scale = np.hypot(cos, sin)
    assert np.allclose(scale, scale[0, 0], rtol=1e-6)
    inv = np.arctan2(sin[1], cos[1])  # angle at position 1 (all frequencies are < pi)
    return inv.astype(np.float32), float(scale[0, 0])


def grads_to_hf(grads):
    sd = hax.state_dict.to_torch_compatible_state_dict(grads)
    return {k: np.asarray(v, np.float32) for k, v in sd.items()}


def compare(a, b):
    """max |a-b| over all tensors, and max over tensors of max|a-b| / max|b|."""
    max_abs, max_rel, worst = 0.0, 0.0, ""
    for k in b:
        d = float(np.max(np.abs(a[k] - b[k])))
        r = d / max(float(np.max(np.abs(b[k]))), 1e-30)
        max_abs = max(max_abs, d)
        if r > max_rel:
            max_rel, worst = r, k
    return max_abs, max_rel, worst


def run_case(name, config_cls, model_cls, expect_match):
    case_dir = os.path.join(OUT, name)
    h5_path = os.path.join(OUT, f"{name}_golden.h5")
    cj, hf, naive = legacy_hf_config(case_dir)
    cfg, fixups, rope_from_file = levanter_config(config_cls, cj, hf, naive)

    state = load_file(os.path.join(case_dir, "model.safetensors"))
    Vocab = hax.Axis("vocab", VOCAB)
    template = model_cls.init(Vocab, cfg, key=jax.random.PRNGKey(0))
    model = hax.state_dict.from_torch_compatible_state_dict(template, state)
    back = hax.state_dict.to_torch_compatible_state_dict(model)
    assert set(back) == set(state), (sorted(set(back) ^ set(state)))
    for k, v in state.items():
        assert np.array_equal(np.asarray(back[k]), v), k

    with h5py.File(h5_path, "r") as f:
        tokens_np = f["tokens"][()]
        torch_logits = f["logits"][()]
        torch_loss = float(f["loss"][()])
        torch_grads = {k: f["grads"][k][()] for k in f["grads"]}
    Batch = hax.Axis("batch", tokens_np.shape[0])
    Pos = cfg.Pos
    tokens = hax.named(jnp.asarray(tokens_np), (Batch, Pos))

    @eqx.filter_jit
    def run(m, ex):
        logits = m(ex.tokens, ex.attn_mask).rearrange((Batch, Pos, Vocab))
        loss, grads = eqx.filter_value_and_grad(lambda mm: compute_next_token_loss(mm, ex).scalar())(m)
        return logits, loss, grads

    example = hax.vmap(lambda t: LmExample.causal(t), Batch)(tokens)
    logits, loss, grads = run(model, example)
    lev_grads = grads_to_hf(grads)
    assert set(lev_grads) == set(torch_grads), sorted(set(lev_grads) ^ set(torch_grads))
    for k in torch_grads:
        assert lev_grads[k].shape == torch_grads[k].shape, (k, lev_grads[k].shape, torch_grads[k].shape)
    logits = np.asarray(logits.array, np.float32)
    loss = float(loss)

    max_abs, max_rel, worst = compare(lev_grads, torch_grads)
    logit_abs = float(np.max(np.abs(logits - torch_logits)))
    loss_abs = abs(loss - torch_loss)
    matches = bool(max_rel < MATCH_RTOL and logit_abs < 1e-4 * max(1.0, float(np.max(np.abs(torch_logits))))
                   and loss_abs < 1e-5)
    assert matches == expect_match, (name, matches, max_abs, max_rel, logit_abs, loss_abs)

    extra = {}
    if name in ("mistral_sw", "qwen2_sw"):
        sw = int(cj["sliding_window"])
        ex_sw = hax.vmap(lambda t: LmExample.causal(t, sliding_window=sw), Batch)(tokens)
        lg, ls, gr = run(model, ex_sw)
        a, r, _ = compare(grads_to_hf(gr), torch_grads)
        extra = dict(levanter_sw_mask_loss=float(ls), levanter_sw_mask_max_abs_grad_diff=a,
                     levanter_sw_mask_max_rel_grad_diff=r,
                     levanter_sw_mask_max_abs_logit_diff=float(np.max(np.abs(np.asarray(
                         lg.array, np.float32) - torch_logits))),
                     levanter_sw_mask_example=f"LmExample.causal(tokens, sliding_window={sw})")
        if name == "qwen2_sw":
            extra["levanter_sliding_window_error"] = qwen_sliding_error(cfg, Vocab, state, tokens, Batch)

    head_dim = head_size_of(cfg)
    rope_inv, rope_scale = upstream_rope(model, head_dim)

    # rewrite the file from scratch (torch part copied, levanter part replaced): HDF5 never reclaims the space of
    # deleted objects, and a fresh file keeps reruns byte-identical
    tmp_path = h5_path + ".tmp"
    with h5py.File(h5_path, "r") as src, h5py.File(tmp_path, "w", libver=("v110", "latest")) as f:
        for k, v in src.attrs.items():
            if not k.startswith("levanter_"):
                f.attrs[k] = v
        for k in sorted(src.keys()):
            if not k.startswith("levanter_"):
                src.copy(src[k], f, name=k)
        f.create_dataset("levanter_logits", data=logits)
        f.create_dataset("levanter_loss", data=np.float32(loss))
        g = f.create_group("levanter_grads")
        for k in sorted(lev_grads):
            g.create_dataset(k, data=lev_grads[k])
        f.create_dataset("levanter_rope_inv_freq", data=rope_inv)
        f.create_dataset("levanter_rope_attention_scaling", data=np.float32(rope_scale))
        f.attrs["levanter_generator"] = "tests/oracle/gen_levanter_llama_grads.py"
        for pkg in ["levanter", "haliax", "jax", "jaxlib", "equinox", "transformers", "numpy"]:
            f.attrs[f"levanter_{pkg}_version"] = importlib.metadata.version(pkg)
        f.attrs["levanter_model_class"] = model_cls.__name__
        f.attrs["levanter_config"] = repr(cfg)
        f.attrs["levanter_config_fixups"] = json.dumps(fixups)
        f.attrs["levanter_rope_from_unmodified_config_json"] = repr(rope_from_file)
        f.attrs["levanter_example"] = "hax.vmap(LmExample.causal, batch)(tokens); attn backend: upstream default"
        f.attrs["levanter_matches_torch"] = int(matches)
        f.attrs["levanter_match_rule"] = (f"max over tensors of max|lev-torch|/max|torch| < {MATCH_RTOL}, "
                                          "max|logits diff| < 1e-4*max(1,max|logits|), |loss diff| < 1e-5")
        f.attrs["levanter_max_abs_grad_diff"] = max_abs
        f.attrs["levanter_max_rel_grad_diff"] = max_rel
        f.attrs["levanter_worst_grad"] = worst
        f.attrs["levanter_max_abs_logit_diff"] = logit_abs
        f.attrs["levanter_abs_loss_diff"] = loss_abs
        f.attrs["levanter_note"] = NOTES.get(name, "upstream matches transformers for this configuration")
        for k, v in extra.items():
            f.attrs[k] = v
        torch_inv = f["rope_inv_freq"][()]
        torch_scale = float(f["rope_attention_scaling"][()])
    os.replace(tmp_path, h5_path)

    return dict(name=name, loss=loss, torch_loss=torch_loss, max_abs=max_abs, max_rel=max_rel, worst=worst,
                logit_abs=logit_abs, matches=matches, fixups=fixups, extra=extra, rope_inv=rope_inv,
                rope_scale=rope_scale, torch_inv=torch_inv, torch_scale=torch_scale,
                rope_from_file=rope_from_file)


def qwen_sliding_error(cfg, Vocab, state, tokens, Batch):
    cfg_sw = dataclasses.replace(cfg, use_sliding_window=True)
    m = hax.state_dict.from_torch_compatible_state_dict(QwenLMHeadModel.init(Vocab, cfg_sw, key=jax.random.PRNGKey(0)),
                                                       state)
    ex = hax.vmap(lambda t: LmExample.causal(t), Batch)(tokens)
    try:
        m(ex.tokens, ex.attn_mask)
    except (NotImplementedError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    raise AssertionError("upstream Qwen now implements sliding windows; revisit qwen2_sw")


# --------------------------------------------------------------------------------------------------------------
# Mixtral (gen_hf_mixtral_golden.py's cases): upstream MixtralLMHeadModel, loss and gradients with the MoE aux losses

MIXTRAL_CASES = ["mixtral_top2", "mixtral_top1"]
# the coefficients of the golden's loss_with_aux (upstream's MixtralConfig defaults; not config.json's
# router_aux_loss_coef 0.001, which MixtralConfig.from_hf_config copies into lbl_coef)
MIXTRAL_LBL_COEF = 0.01
MIXTRAL_RZL_COEF = 0.001
MIXTRAL_GRAD_RTOL = 1e-4  # per tensor: max|lev - torch| <= 1e-4 * max(1e-3, max|torch|)
MIXTRAL_LOSS_RTOL = 1e-5  # |lev - torch| <= 1e-5 * |torch|
# the axis mapping of upstream's tests/test_mixtral.py (test_mixtral_moe_block)
MIXTRAL_AXIS_MAPPING = {"batch": ResourceAxis.DATA, "token": ResourceAxis.DATA, "token_repeat": ResourceAxis.DATA}


def mixtral_mesh():
    """1-device mesh (replica, data, model) = (1, 1, 1), as in upstream's tests/test_mixtral.py. Upstream's
    MixtralSparseMoeBlock wraps routing / permutation in shard_map(mesh=hax.partitioning._get_mesh()); under this
    mesh every PartitionSpec is trivial. (With jax 0.7.2 it also runs with no mesh at all: _get_mesh() then gives an
    empty AbstractMesh inside jit, which shard_map accepts.)"""
    return Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1),
                (ResourceAxis.REPLICA, ResourceAxis.DATA, ResourceAxis.MODEL))


def mixtral_config(cj, hf, naive):
    assert cj["model_type"] == "mixtral", cj["model_type"]
    assert cj.get("head_dim") in (None, cj["hidden_size"] // cj["num_attention_heads"]), cj.get("head_dim")
    assert cj.get("sliding_window") is None and not cj.get("tie_word_embeddings")
    cfg = MixtralConfig.from_hf_config(hf)
    fixups = []
    try:
        rope_from_file = MixtralConfig.from_hf_config(naive).rope
    except Exception as e:  # noqa: BLE001 -- only informative
        rope_from_file = f"error: {type(e).__name__}: {e}"
    fixups.append(f"lbl_coef {cfg.lbl_coef!r} -> {MIXTRAL_LBL_COEF} (from_hf_config copies router_aux_loss_coef "
                  "into lbl_coef; the golden uses upstream's default 0.01)")
    fixups.append(f"rzl_coef {cfg.rzl_coef!r} -> {MIXTRAL_RZL_COEF} (set explicitly; from_hf_config leaves the "
                  "default)")
    fixups.append(f"sliding_window {cfg.sliding_window!r} -> None (from_hf_config does not read sliding_window and "
                  "leaves MistralConfig's default 4096; the model never applies it anyway)")
    fixups.append("seq_len %d -> 16 (Pos axis = the 16 token positions), gradient_checkpointing %r -> False"
                  % (cj["max_position_embeddings"], cfg.gradient_checkpointing))
    cfg = dataclasses.replace(cfg, seq_len=16, gradient_checkpointing=False, sliding_window=None,
                              lbl_coef=MIXTRAL_LBL_COEF, rzl_coef=MIXTRAL_RZL_COEF)
    assert cfg.rope == DefaultRotaryEmbeddingsConfig(theta=cj["rope_parameters"]["rope_theta"], factor=1.0), cfg.rope
    assert cfg.HeadSize.size == cj["hidden_size"] // cj["num_attention_heads"]
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok) == (cj["num_local_experts"], cj["num_experts_per_tok"])
    return cfg, fixups, rope_from_file


def load_mixtral(cfg, state, Vocab):
    template = MixtralLMHeadModel.init(Vocab, cfg, key=jax.random.PRNGKey(0))
    model = hax.state_dict.from_torch_compatible_state_dict(template, state)
    back = hax.state_dict.to_torch_compatible_state_dict(model)
    assert set(back) == set(state), (sorted(set(back) ^ set(state)))
    for k, v in state.items():
        assert np.array_equal(np.asarray(back[k]), v), k
    return model


def mixtral_group(name):
    """Tensor group of an HF Mixtral name, for the per-group report."""
    if ".block_sparse_moe.experts." in name:
        return "experts." + name.split(".")[-2]  # experts.w1 / w2 / w3
    if ".block_sparse_moe.gate." in name:
        return "router_gate"
    if ".self_attn." in name:
        return "attention"
    if name.endswith("norm.weight"):
        return "norms"
    return name.replace(".weight", "")  # lm_head / model.embed_tokens


def mixtral_compare(lev, torch_, rtol):
    """Per tensor max|lev-torch| against rtol * max(1e-3, max|torch|); per group max abs and max relative diff."""
    groups, bad = {}, []
    for k in sorted(torch_):
        d = float(np.max(np.abs(lev[k] - torch_[k])))
        ref = float(np.max(np.abs(torch_[k])))
        r = d / max(1e-3, ref)
        g = groups.setdefault(mixtral_group(k), dict(max_abs=0.0, max_rel=0.0, worst=""))
        g["max_abs"] = max(g["max_abs"], d)
        if r >= g["max_rel"]:
            g["max_rel"], g["worst"] = r, k
        if d > rtol * max(1e-3, ref):
            bad.append((r, k, d, ref))
    return groups, sorted(bad, reverse=True)


def run_mixtral_case(name):
    t_start = time.time()
    case_dir = os.path.join(OUT, name)
    h5_path = os.path.join(OUT, f"{name}_golden.h5")
    cj, hf, naive = legacy_hf_config(case_dir)
    cfg, fixups, rope_from_file = mixtral_config(cj, hf, naive)
    cfg_ce = dataclasses.replace(cfg, lbl_coef=None, rzl_coef=None)  # cross-entropy only
    cfg_unit = dataclasses.replace(cfg, lbl_coef=1.0, rzl_coef=1.0)  # per-layer aux terms without coefficients

    state = load_file(os.path.join(case_dir, "model.safetensors"))
    with h5py.File(h5_path, "r") as f:
        tokens_np = f["tokens"][()]
        torch_logits = f["logits"][()]
        torch_loss = float(f["loss"][()])
        torch_grads = {k: f["grads"][k][()] for k in f["grads"]}
        torch_loss_aux = float(f["loss_with_aux"][()])
        torch_grads_aux = {k: f["grads_with_aux"][k][()] for k in f["grads_with_aux"]}
        torch_lbl = f["moe_lbl"][()]
        torch_rzl = f["moe_rzl"][()]
        torch_counts = f["moe_counts"][()]
        assert float(f.attrs["lbl_coef"]) == MIXTRAL_LBL_COEF and float(f.attrs["rzl_coef"]) == MIXTRAL_RZL_COEF
    assert set(torch_grads_aux) == set(state) == set(torch_grads)

    Vocab = hax.Axis("vocab", VOCAB)
    Batch = hax.Axis("batch", tokens_np.shape[0])
    Pos = cfg.Pos
    n_tokens = tokens_np.shape[0] * tokens_np.shape[1]

    @eqx.filter_jit
    def loss_and_grads(m, ex):
        return eqx.filter_value_and_grad(lambda mm: compute_next_token_loss(mm, ex).scalar())(m)

    @eqx.filter_jit
    def logits_of(m, ex):
        return m(ex.tokens, ex.attn_mask).rearrange((Batch, Pos, Vocab))

    @eqx.filter_jit
    def layer_stats(m, ex):
        # what MixtralTransformer.__call__ gets back from its layer scan, before summing over layers
        x = m.embeddings.embed(ex.tokens)
        _, extras = m.transformer.layers.scan(x, mask=ex.attn_mask, key=None)
        return extras["load_balancing_loss"], extras["router_z_loss"], extras["expert_loads"]

    with mixtral_mesh(), hax.axis_mapping(MIXTRAL_AXIS_MAPPING):
        tokens = hax.named(jnp.asarray(tokens_np), (Batch, Pos))
        example = hax.vmap(lambda t: LmExample.causal(t), Batch)(tokens)
        model = load_mixtral(cfg, state, Vocab)
        loss_aux, grads_aux = loss_and_grads(model, example)
        model_ce = load_mixtral(cfg_ce, state, Vocab)
        loss_ce, grads_ce = loss_and_grads(model_ce, example)
        logits = logits_of(model_ce, example)
        lbl, rzl, loads = layer_stats(load_mixtral(cfg_unit, state, Vocab), example)

    lev_grads_aux = grads_to_hf(grads_aux)
    lev_grads = grads_to_hf(grads_ce)
    for lg in (lev_grads_aux, lev_grads):
        assert set(lg) == set(torch_grads_aux), sorted(set(lg) ^ set(torch_grads_aux))
        for k in lg:
            assert lg[k].shape == torch_grads_aux[k].shape, (k, lg[k].shape, torch_grads_aux[k].shape)
    loss_aux, loss_ce = float(loss_aux), float(loss_ce)
    logits = np.asarray(logits.array, np.float32)
    lev_lbl = np.asarray(lbl.array, np.float32)
    lev_rzl = np.asarray(rzl.array, np.float32)
    lev_loads = np.asarray(loads.rearrange(("layers", "experts")).array, np.float32)
    loads_counts = lev_loads * (n_tokens * cfg.num_experts_per_tok)
    assert np.allclose(loads_counts, torch_counts, atol=1e-3), (loads_counts, torch_counts)  # same routing

    groups, bad = mixtral_compare(lev_grads_aux, torch_grads_aux, MIXTRAL_GRAD_RTOL)
    loss_aux_abs = abs(loss_aux - torch_loss_aux)
    matches_aux = not bad and loss_aux_abs <= MIXTRAL_LOSS_RTOL * abs(torch_loss_aux)
    difference = None
    if not matches_aux:
        parts = [f"loss_with_aux torch {torch_loss_aux:.7g} levanter {loss_aux:.7g} (|diff| {loss_aux_abs:.3g})"]
        parts += [f"{k}: max|diff| {d:.3g}, max|torch| {ref:.3g} (ratio {r:.3g})" for r, k, d, ref in bad[:8]]
        if len(bad) > 8:
            parts.append(f"... {len(bad) - 8} more tensors over the tolerance")
        difference = "; ".join(parts)

    ce_groups, ce_bad = mixtral_compare(lev_grads, torch_grads, MIXTRAL_GRAD_RTOL)
    # relative to max(1e-3, max|torch|) as in the match rule: with top-1 routing the router's cross-entropy gradient
    # is rounding noise (~1e-9) in both, and max|diff| / max|torch| alone would report it as a relative error ~1
    ce_max_abs = max(g["max_abs"] for g in ce_groups.values())
    ce_max_rel, ce_worst = max((g["max_rel"], g["worst"]) for g in ce_groups.values())
    logit_abs = float(np.max(np.abs(logits - torch_logits)))
    loss_ce_abs = abs(loss_ce - torch_loss)
    matches_ce = bool(not ce_bad and logit_abs < 1e-4 * max(1.0, float(np.max(np.abs(torch_logits))))
                      and loss_ce_abs <= MIXTRAL_LOSS_RTOL * abs(torch_loss))
    lbl_abs = float(np.max(np.abs(lev_lbl - torch_lbl)))
    rzl_abs = float(np.max(np.abs(lev_rzl - torch_rzl)))

    tmp_path = h5_path + ".tmp"
    with h5py.File(h5_path, "r") as src, h5py.File(tmp_path, "w", libver=("v110", "latest")) as f:
        for k, v in src.attrs.items():
            if not k.startswith("levanter_"):
                f.attrs[k] = v
        for k in sorted(src.keys()):
            if not k.startswith("levanter_"):
                src.copy(src[k], f, name=k)
        f.create_dataset("levanter_loss_with_aux", data=np.float32(loss_aux))
        g = f.create_group("levanter_grads_with_aux")
        for k in sorted(lev_grads_aux):
            g.create_dataset(k, data=lev_grads_aux[k])
        f.create_dataset("levanter_loss", data=np.float32(loss_ce))
        g = f.create_group("levanter_grads")
        for k in sorted(lev_grads):
            g.create_dataset(k, data=lev_grads[k])
        f.create_dataset("levanter_logits", data=logits)
        ds = f.create_dataset("levanter_moe_lbl", data=lev_lbl)
        ds.attrs["meaning"] = "per layer: upstream's load_balancing_loss (before summing over layers) with lbl_coef 1"
        ds = f.create_dataset("levanter_moe_rzl", data=lev_rzl)
        ds.attrs["meaning"] = "per layer: upstream's router_z_loss (before summing over layers) with rzl_coef 1"
        ds = f.create_dataset("levanter_moe_expert_loads", data=lev_loads)
        ds.attrs["meaning"] = "[layer, expert]: upstream's expert_loads = group_sizes / sum(group_sizes)"
        f.attrs["levanter_generator"] = "tests/oracle/gen_levanter_llama_grads.py"
        for pkg in ["levanter", "haliax", "jax", "jaxlib", "equinox", "transformers", "numpy"]:
            f.attrs[f"levanter_{pkg}_version"] = importlib.metadata.version(pkg)
        f.attrs["levanter_model_class"] = MixtralLMHeadModel.__name__
        f.attrs["levanter_config"] = repr(cfg)
        f.attrs["levanter_config_fixups"] = json.dumps(fixups)
        f.attrs["levanter_rope_from_unmodified_config_json"] = repr(rope_from_file)
        f.attrs["levanter_mesh"] = ("jax.sharding.Mesh(devices.reshape(1, 1, 1), (replica, data, model)) on 1 CPU "
                                    "device, hax.axis_mapping(" + json.dumps(
                                        {k: str(v) for k, v in MIXTRAL_AXIS_MAPPING.items()}) + ")")
        f.attrs["levanter_example"] = ("hax.vmap(LmExample.causal, batch)(tokens); attn backend: upstream default; "
                                       "loss = compute_next_token_loss(model, example).scalar() (mean next-token "
                                       "cross-entropy over the 2 x 15 predicted positions + the aux losses that "
                                       "model.activations returns); grads by eqx.filter_value_and_grad")
        f.attrs["levanter_lbl_coef"] = MIXTRAL_LBL_COEF
        f.attrs["levanter_rzl_coef"] = MIXTRAL_RZL_COEF
        f.attrs["levanter_mixtral_matches_torch"] = 1.0 if matches_aux else 0.0
        f.attrs["levanter_mixtral_match_rule"] = (
            f"every levanter_grads_with_aux tensor: max|lev-torch| <= {MIXTRAL_GRAD_RTOL} * max(1e-3, max|torch|) "
            f"against grads_with_aux; |levanter_loss_with_aux - loss_with_aux| <= {MIXTRAL_LOSS_RTOL} * "
            "|loss_with_aux|")
        if difference is not None:
            f.attrs["levanter_mixtral_difference"] = difference
        f.attrs["levanter_mixtral_grad_diffs"] = json.dumps(groups, sort_keys=True)
        f.attrs["levanter_abs_loss_with_aux_diff"] = loss_aux_abs
        f.attrs["levanter_matches_torch"] = int(matches_ce)
        f.attrs["levanter_match_rule"] = (
            f"CE only (lbl_coef = rzl_coef = None): every levanter_grads tensor max|lev-torch| <= {MIXTRAL_GRAD_RTOL} "
            "* max(1e-3, max|torch|) against grads/, max|logits diff| < 1e-4*max(1,max|logits|), |loss diff| <= "
            f"{MIXTRAL_LOSS_RTOL}*|loss|")
        f.attrs["levanter_max_abs_grad_diff"] = ce_max_abs
        f.attrs["levanter_max_rel_grad_diff"] = ce_max_rel  # max over tensors of max|diff| / max(1e-3, max|torch|)
        f.attrs["levanter_worst_grad"] = ce_worst
        f.attrs["levanter_max_abs_logit_diff"] = logit_abs
        f.attrs["levanter_abs_loss_diff"] = loss_ce_abs
        f.attrs["levanter_max_abs_moe_lbl_diff"] = lbl_abs
        f.attrs["levanter_max_abs_moe_rzl_diff"] = rzl_abs
        f.attrs["levanter_note"] = (
            "upstream computes the golden's function: same routing (softmax, top-k, renormalised), same aux losses "
            "per layer over all batch*seq tokens, summed over layers" if matches_aux and matches_ce else
            "upstream differs from the torch golden, see levanter_mixtral_difference")
    os.replace(tmp_path, h5_path)

    return dict(name=name, loss_aux=loss_aux, torch_loss_aux=torch_loss_aux, loss_ce=loss_ce, torch_loss=torch_loss,
                groups=groups, ce_groups=ce_groups, matches_aux=matches_aux, matches_ce=matches_ce,
                difference=difference, logit_abs=logit_abs, lbl=lev_lbl, rzl=lev_rzl, lbl_abs=lbl_abs,
                rzl_abs=rzl_abs, fixups=fixups, rope_from_file=rope_from_file, seconds=time.time() - t_start)


def print_mixtral(r):
    print(f"== {r['name']} ({r['seconds']:.1f} s): loss_with_aux levanter {r['loss_aux']:.7f} torch "
          f"{r['torch_loss_aux']:.7f}; CE loss levanter {r['loss_ce']:.7f} torch {r['torch_loss']:.7f}; "
          f"logits max abs diff {r['logit_abs']:.3e}")
    print(f"   levanter_mixtral_matches_torch (with aux): {r['matches_aux']}; CE only: {r['matches_ce']}")
    print(f"   moe_lbl {r['lbl']} (max abs diff {r['lbl_abs']:.2e}), moe_rzl {r['rzl']} (max abs diff "
          f"{r['rzl_abs']:.2e})")
    for label, groups in (("with aux", r["groups"]), ("CE only", r["ce_groups"])):
        for gname, g in sorted(groups.items()):
            print(f"   grads {label:8s} {gname:22s} max abs {g['max_abs']:.3e} max rel {g['max_rel']:.3e} "
                  f"({g['worst']})")
    if r["difference"]:
        print(f"   difference: {r['difference']}")
    print(f"   fixups: {r['fixups']}")
    print(f"   rope from the unmodified config.json: {r['rope_from_file']}")


def write_init():
    config = LlamaConfig(seq_len=64, hidden_dim=32, intermediate_dim=40, num_layers=2, num_heads=4, num_kv_heads=2)
    Vocab = hax.Axis("vocab", VOCAB)
    model = LlamaLMHeadModel.init(Vocab, config, key=jax.random.PRNGKey(0))

    mask = AdamConfig().build_weight_decay_mask()(model)
    model_paths = {"/".join(p) for p, _ in named_leaves(model)}
    flat_mask = {}
    for mpath, mval in jax.tree_util.tree_flatten_with_path(mask)[0]:
        key = "/".join(getattr(p, "name", str(p)) for p in mpath)
        if key in model_paths:
            flat_mask[key] = bool(mval)
    assert set(flat_mask) == model_paths, (sorted(flat_mask), sorted(model_paths))

    sd = hax.state_dict.to_torch_compatible_state_dict(model)
    rename = {"transformer": "model", "embeddings": None, "token_embeddings": "model.embed_tokens", "stacked": "{layer}"}
    attrs = {}
    for path, leaf in named_leaves(model):
        name = "/".join(path)
        hf = ".".join(r for r in (rename.get(p, p) for p in path) if r is not None)
        assert hf.replace("{layer}", "0") in sd, (hf, sorted(sd))
        attrs[name] = {"hf_name": hf, "weight_decay": int(flat_mask[name])}

    path = os.path.join(OUT, "levanter_init.h5")
    with h5py.File(path, "w", libver=("v110", "latest")) as f:
        f.attrs["generator"] = "tests/oracle/gen_levanter_llama_grads.py"
        for pkg in ["levanter", "haliax", "jax", "jaxlib", "equinox", "numpy"]:
            f.attrs[f"{pkg}_version"] = importlib.metadata.version(pkg)
        for k in ["seq_len", "hidden_dim", "intermediate_dim", "num_layers", "num_heads", "num_kv_heads",
                  "initializer_range", "layer_norm_epsilon", "tie_word_embeddings", "use_bias",
                  "use_layer_norm_weight", "scan_layers"]:
            v = getattr(config, k)
            f.attrs[k] = int(v) if isinstance(v, bool) else v
        f.attrs["activation_function"] = str(getattr(config.activation_function, "value", config.activation_function))
        f.attrs["rope"] = repr(config.rope)
        f.attrs["vocab_size"] = VOCAB
        f.attrs["vocab_axis"] = "vocab"
        f.attrs["dtype"] = "float32"
        f.attrs["init_key"] = "jax.random.PRNGKey(0)"
        f.attrs["init_call"] = ("LlamaLMHeadModel.init(Vocab(64), LlamaConfig(seq_len=64, hidden_dim=32, "
                                "intermediate_dim=40, num_layers=2, num_heads=4, num_kv_heads=2), key=PRNGKey(0))")
        f.attrs["weight_decay_mask"] = "levanter.optim.AdamConfig().build_weight_decay_mask() (default mask)"
        write_tree(f.create_group("params"), model, attrs)
    return path, model


def main():
    # With case names, only those cases are (re)written and levanter_init.h5 is left alone.
    names = sys.argv[1:] or list(CASES) + MIXTRAL_CASES
    unknown = [n for n in names if n not in CASES and n not in MIXTRAL_CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; known: {list(CASES) + MIXTRAL_CASES}")
    results = [run_case(name, *CASES[name]) for name in names if name in CASES]
    mixtral_results = [run_mixtral_case(name) for name in names if name in MIXTRAL_CASES]
    for r in mixtral_results:
        print_mixtral(r)
    for r in results:
        print(f"== {r['name']}: levanter loss {r['loss']:.7f} torch {r['torch_loss']:.7f}; grads max abs diff "
              f"{r['max_abs']:.3e}, max rel {r['max_rel']:.3e} ({r['worst']}); logits max abs diff "
              f"{r['logit_abs']:.3e}; matches torch: {r['matches']}")
        print(f"   fixups: {r['fixups']}")
        print(f"   rope (levanter) inv_freq {np.array2string(r['rope_inv'], precision=6, max_line_width=200)} "
              f"scale {r['rope_scale']:.6f}")
        print(f"   rope (torch)    inv_freq {np.array2string(r['torch_inv'], precision=6, max_line_width=200)} "
              f"scale {r['torch_scale']:.6f}")
        print(f"   rope from the unmodified config.json: {r['rope_from_file']}")
        for k, v in r["extra"].items():
            print(f"   {k}: {v}")
    if sys.argv[1:]:
        return 0
    path, model = write_init()
    print(f"{path}: {os.path.getsize(path)} B")
    for p, leaf in named_leaves(model):
        print(f"   {'/'.join(p):55s} {[a.name for a in leaf.axes]} {list(leaf.array.shape)}")


if __name__ == "__main__":
    sys.exit(main())
