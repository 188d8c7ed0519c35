#!/usr/bin/env python3
"""Golden Llama-family checkpoints, logits, losses and gradients from `transformers` + `torch` (CPU).

Run from anywhere; like gen_hf_gpt2_golden.py the script creates/updates its venv ($HF_VENV, default
/tmp/hf-venv) from tests/oracle/requirements-hf.txt and re-runs itself there:

    python3 tests/oracle/gen_hf_llama_golden.py

Writes under tests/golden/hf_llama/ (layout documented in README-hf.md, "Llama family"):
  <case>/            XxxForCausalLM.save_pretrained(dir, safe_serialization=True): config.json +
                     model.safetensors (generation_config.json is removed)
  <case>_golden.h5   tokens, logits, loss, grads/<hf name>, rope_inv_freq, rope_attention_scaling,
                     layer_sliding_window (+ attributes); gen_levanter_llama_grads.py later adds the
                     levanter_* entries to these files
  rope_tables.h5     inv_freq / attention_scaling / cos / sin of transformers' rotary embedding module
                     for several RoPE types

Every parameter is overwritten after init (RMSNorm weights 1 + 0.1*N(0,1), everything else
0.1*N(0,1), torch.Generator seeded 0, drawn in named_parameters() order), as in gen_hf_gpt2_golden.py.
The loss is the mean next-token cross-entropy of logits[:, :-1] against tokens[:, 1:]; grads are
d(loss)/d(parameter) from torch autograd (float32, eager attention, eval mode, no dropout).
"""

import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_hf_gpt2_golden import GOLDEN, ensure_venv, versions  # noqa: E402

OUT = os.path.join(GOLDEN, "hf_llama")
VOCAB = 64
BATCH, SEQ = 2, 16
TOKEN_SEED = 7

COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=64, rms_norm_eps=1e-5, hidden_act="silu",
              bos_token_id=0, eos_token_id=1, attention_dropout=0.0, initializer_range=0.02)

# name, transformers class, config class, extra config kwargs, description
CASES = [
    ("llama_mha", "LlamaForCausalLM", "LlamaConfig",
     dict(num_key_value_heads=4, rope_theta=10000.0, tie_word_embeddings=False),
     "Llama, MHA (4 q / 4 kv heads, head_dim 8), default RoPE theta 10000, untied lm_head"),
    ("llama_gqa_tied_linear", "LlamaForCausalLM", "LlamaConfig",
     dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=10000.0,
          rope_scaling={"rope_type": "linear", "factor": 2.0}),
     "Llama, GQA (4 q / 2 kv heads, head_dim 8), tied embeddings, linear RoPE scaling factor 2"),
    ("llama_mqa_llama3", "LlamaForCausalLM", "LlamaConfig",
     dict(num_key_value_heads=1, tie_word_embeddings=False, rope_theta=10000.0,
          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
     "Llama, MQA (4 q / 1 kv head, head_dim 8), llama3 RoPE (factor 8, low 1, high 4, original 64, "
     "theta 1e4): inv_freq 0 high-frequency (kept), 1 medium (smoothed), 2-3 low-frequency (/8)"),
    ("llama_yarn_headdim", "LlamaForCausalLM", "LlamaConfig",
     dict(num_key_value_heads=2, head_dim=16, tie_word_embeddings=False, rope_theta=10000.0,
          max_position_embeddings=256,  # = factor * original, as transformers' yarn validation expects
          rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
     "Llama, GQA (4 q / 2 kv heads), head_dim 16 (q_proj 32->64, o_proj 64->32), YaRN RoPE factor 4, "
     "original 64 (max_position_embeddings 256), beta_fast 32 / beta_slow 1 (defaults), truncate: ramp "
     "low 0 high 3 -> interpolation weights [0, 1/3, 2/3, 1, 1, 1, 1, 1], attention_factor 1 + 0.1 ln 4"),
    ("mistral_sw", "MistralForCausalLM", "MistralConfig",
     dict(num_key_value_heads=2, sliding_window=4, rope_theta=10000.0, tie_word_embeddings=False),
     "Mistral, GQA (4 q / 2 kv heads, head_dim 8), sliding_window 4 on every layer, untied"),
    ("qwen2_sw", "Qwen2ForCausalLM", "Qwen2Config",
     dict(num_key_value_heads=2, use_sliding_window=True, sliding_window=4, max_window_layers=1,
          rope_theta=10000.0, tie_word_embeddings=False),
     "Qwen2, GQA (4 q / 2 kv heads, head_dim 8), q/k/v biases, use_sliding_window, sliding_window 4, "
     "max_window_layers 1 -> layer_types [full_attention, sliding_attention], untied"),
    ("qwen3", "Qwen3ForCausalLM", "Qwen3Config",
     dict(num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, rope_theta=10000.0,
          use_sliding_window=False),
     "Qwen3, GQA (4 q / 2 kv heads), head_dim 16, q_norm/k_norm (RMSNorm over head_dim), tied "
     "embeddings, no sliding window"),
]

# name -> LlamaConfig kwargs of a standalone rotary-embedding table (positions 0..63)
ROPE_TABLES = [
    ("default_hd8", dict(head_dim=8, rope_theta=10000.0), 64),
    ("linear_f2_hd8", dict(head_dim=8, rope_theta=10000.0,
                           rope_scaling={"rope_type": "linear", "factor": 2.0}), 64),
    ("llama3_hd8", dict(head_dim=8, rope_theta=10000.0,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}), 64),
    ("llama3_hd64", dict(head_dim=64, rope_theta=500000.0,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
     131072),
    ("yarn_f4_orig16_hd16", dict(head_dim=16, rope_theta=10000.0,
                                 rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 16}), 64),
    ("yarn_f4_orig64_hd16", dict(head_dim=16, rope_theta=10000.0,
                                 rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 64}), 256),
    ("yarn_f4_orig2048_hd64", dict(head_dim=64, rope_theta=10000.0,
                                   rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 2048,
                                                 "beta_fast": 32.0, "beta_slow": 1.0}), 8192),
]
ROPE_POSITIONS = 64


def tokens_array():
    import numpy as np
    return np.random.default_rng(TOKEN_SEED).integers(0, VOCAB, size=(BATCH, SEQ)).astype(np.int32)


def is_norm_weight(name):
    return name.endswith("norm.weight")  # input_layernorm, post_attention_layernorm, norm, q_norm, k_norm


def make_model(model_cls, config_cls, extra, norm_base=1.0):
    import torch
    import transformers

    config = getattr(transformers, config_cls)(**{**COMMON, **extra})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).float().eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied lm_head.weight is listed once (as embed_tokens)
            noise = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(norm_base + noise if is_norm_weight(name) else noise)
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def applied_sliding_windows(model, tokens):
    """Per layer: the sliding window transformers actually applied (0 = plain causal), read off the eager
    attention probabilities: key k gets weight at query q iff q - window < k <= q."""
    import torch
    with torch.no_grad():
        out = model(torch.from_numpy(tokens).long(), output_attentions=True)
    windows = []
    q = torch.arange(SEQ)[:, None]
    k = torch.arange(SEQ)[None, :]
    for a in out.attentions:  # [batch, heads, q, k]
        nz = (a != 0).all(dim=0).all(dim=0)
        assert torch.equal(nz, (a != 0).any(dim=0).any(dim=0)), "mask differs between heads/batch"
        assert not nz[k > q].any(), "attends to the future"
        width = int((q - k)[nz].max()) + 1
        w = 0 if width == SEQ else width
        expect = (k <= q) & (k > q - (w if w else SEQ))
        assert torch.equal(nz, expect), "attention pattern is not a causal (sliding) window"
        windows.append(w)
    return windows


def describe(path):
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return [(k, list(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in sorted(f.keys())]


def rope_of(model):
    """inv_freq, attention_scaling and rope_parameters of the model's (global layers') rotary embedding; Gemma 3
    keeps one table per layer type."""
    rot, params = model.model.rotary_emb, model.config.rope_parameters
    if hasattr(rot, "inv_freq"):
        return rot.inv_freq, rot.attention_scaling, params
    return rot.full_attention_inv_freq, rot.full_attention_attention_scaling, params["full_attention"]


def write_case(name, model_cls, config_cls, extra, description, tokens, vers, norm_base=1.0,
               generator="tests/oracle/gen_hf_llama_golden.py", to_saved=None, extra_h5=None):
    """to_saved (optional): maps {named_parameters() name: tensor} to {model.safetensors name: tensor}, for models
    whose checkpoint layout differs from their parameters (Mixtral's fused experts); it is applied to the parameters
    (which must then equal the saved tensors exactly) and to their gradients, so grads/ is keyed as saved.
    extra_h5 (optional): called as extra_h5(h5file, model, tok, to_saved) after grads/ is written, to add more
    datasets; what it returns is the result's "extra"."""
    import h5py
    import numpy as np
    import torch
    import torch.nn.functional as F
    from safetensors import safe_open

    model = make_model(model_cls, config_cls, extra, norm_base)
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=True)
    gen_cfg = os.path.join(d, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)
    st_path = os.path.join(d, "model.safetensors")
    with safe_open(st_path, "pt") as f:
        saved = {k: f.get_tensor(k) for k in f.keys()}

    params = dict(model.named_parameters())
    as_saved = to_saved or (lambda named: named)
    saved_params = as_saved({k: p.detach() for k, p in params.items()})
    # the saved tensors are exactly the parameters (buffers such as rotary inv_freq are not persistent)
    assert set(saved) == set(saved_params), (sorted(saved), sorted(saved_params))
    for k, v in saved.items():
        assert torch.equal(v, saved_params[k]), k

    tok = torch.from_numpy(tokens).long()
    model.zero_grad(set_to_none=True)
    logits = model(tok).logits
    assert logits.dtype == torch.float32 and logits.shape == (BATCH, SEQ, VOCAB)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tok[:, 1:].reshape(-1))
    loss.backward()
    with torch.no_grad():
        hf_loss = model(tok, labels=tok).loss  # transformers' own shifted loss, as a cross-check
    assert abs(hf_loss.item() - loss.item()) < 1e-5, (hf_loss.item(), loss.item())

    windows = applied_sliding_windows(model, tokens)
    cfg = model.config
    attn_windows = [getattr(l.self_attn, "sliding_window", None) for l in model.model.layers]
    if config_cls == "MistralConfig":  # Mistral's attention reads config.sliding_window on every layer
        attn_windows = [cfg.sliding_window] * cfg.num_hidden_layers
    assert windows == [w or 0 for w in attn_windows], (windows, attn_windows)

    inv_freq, attn_scaling, rope_params = rope_of(model)
    inv_freq = inv_freq.detach().float().numpy()
    attn_scaling = float(attn_scaling)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert inv_freq.shape == (head_dim // 2,)

    h5_path = os.path.join(OUT, f"{name}_golden.h5")
    with open(os.path.join(d, "config.json")) as f:
        config_json = f.read()
    with h5py.File(h5_path, "w", libver=("v110", "latest")) as f:
        f.attrs["generator"] = generator
        for k, v in vers.items():
            f.attrs[k + "_version"] = v
        f.attrs["case"] = name
        f.attrs["model_class"] = model_cls
        f.attrs["description"] = description
        f.attrs["config_json"] = config_json
        f.attrs["rms_norm_eps"] = float(cfg.rms_norm_eps)
        f.attrs["head_dim"] = int(head_dim)
        f.attrs["tie_word_embeddings"] = int(bool(cfg.tie_word_embeddings))
        f.attrs["rope_parameters"] = json.dumps(cfg.rope_parameters, sort_keys=True)
        f.attrs["rope_type"] = rope_params["rope_type"]
        f.attrs["layer_types"] = json.dumps(
            list(getattr(cfg, "layer_types", None) or
                 ["sliding_attention" if w else "full_attention" for w in windows]))
        f.attrs["sliding_window"] = int(max(windows))
        f.attrs["loss_definition"] = ("mean over batch x positions 0..14 of cross_entropy(logits[b, t], "
                                      "tokens[b, t+1]); grads = d loss / d parameter (torch autograd)")
        f.create_dataset("tokens", data=tokens)
        f.create_dataset("logits", data=logits.detach().numpy().astype(np.float32))
        f.create_dataset("loss", data=np.float32(loss.item()))
        ds = f.create_dataset("layer_sliding_window", data=np.asarray(windows, np.int32))
        ds.attrs["meaning"] = ("per decoder layer: window w as applied by transformers (key k visible to "
                               "query q iff q - w < k <= q); 0 = plain causal attention")
        f.create_dataset("rope_inv_freq", data=inv_freq.astype(np.float32))
        f.create_dataset("rope_attention_scaling", data=np.float32(attn_scaling))
        g = f.create_group("grads")
        assert all(p.grad is not None for p in params.values()), [k for k, p in params.items() if p.grad is None]
        grads = as_saved({k: p.grad for k, p in params.items()})
        for k in sorted(saved):
            grad = grads[k]
            assert grad is not None and tuple(grad.shape) == tuple(saved[k].shape), k
            g.create_dataset(k, data=grad.detach().numpy().astype(np.float32))
        extra_result = extra_h5(f, model, tok, as_saved) if extra_h5 else None

    return dict(h5=h5_path, dir=d, loss=loss.item(), windows=windows, inv_freq=inv_freq,
                attn_scaling=attn_scaling, tensors=describe(st_path), extra=extra_result)


def write_rope_tables(vers):
    import h5py
    import numpy as np
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    path = os.path.join(OUT, "rope_tables.h5")
    summary = {}
    with h5py.File(path, "w", libver=("v110", "latest")) as f:
        f.attrs["generator"] = "tests/oracle/gen_hf_llama_golden.py"
        for k, v in vers.items():
            f.attrs[k + "_version"] = v
        f.attrs["description"] = (
            "transformers LlamaRotaryEmbedding(config) for several rope_parameters: inv_freq [head_dim/2], "
            "attention_scaling (scalar) and the module's forward(x, position_ids=0..63) outputs cos/sin "
            "[64, head_dim] (= cat(freqs, freqs) -> cos/sin times attention_scaling)")
        for name, kw, max_pos in ROPE_TABLES:
            config = LlamaConfig(vocab_size=VOCAB, hidden_size=kw["head_dim"] * 4, num_attention_heads=4,
                                 num_key_value_heads=4, max_position_embeddings=max_pos, **kw)
            rot = LlamaRotaryEmbedding(config)
            pos = torch.arange(ROPE_POSITIONS)[None, :]
            x = torch.zeros(1, ROPE_POSITIONS, kw["head_dim"], dtype=torch.float32)
            cos, sin = rot(x, pos)
            g = f.create_group(name)
            inv = rot.inv_freq.detach().float().numpy()
            g.create_dataset("inv_freq", data=inv.astype(np.float32))
            g.create_dataset("attention_scaling", data=np.float32(rot.attention_scaling))
            g.create_dataset("cos", data=cos[0].numpy().astype(np.float32))
            g.create_dataset("sin", data=sin[0].numpy().astype(np.float32))
            rp = dict(config.rope_parameters)
            g.attrs["rope_type"] = rp["rope_type"]
            g.attrs["rope_parameters"] = json.dumps(rp, sort_keys=True)
            g.attrs["head_dim"] = kw["head_dim"]
            g.attrs["rope_theta"] = float(rp["rope_theta"])
            g.attrs["max_position_embeddings"] = max_pos
            for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
                        "beta_fast", "beta_slow"):
                if key in rp:
                    g.attrs[key] = int(rp[key]) if key == "original_max_position_embeddings" else float(rp[key])
            if rp["rope_type"] == "yarn":
                base = torch.tensor(rp["rope_theta"]) ** (torch.arange(0, kw["head_dim"], 2).float() / kw["head_dim"])
                extrap, interp = 1.0 / base, 1.0 / (rp["factor"] * base)
                # the weight of the interpolated (1/factor) frequency, inv = interp*w + extrap*(1-w)
                w = ((torch.from_numpy(inv) - extrap) / (interp - extrap)).numpy() + 0.0  # no -0.0
                g.create_dataset("yarn_interpolation_weight", data=w.astype(np.float32))
                g["yarn_interpolation_weight"].attrs["meaning"] = (
                    "derived: (inv_freq - 1/base^(2i/d)) / (1/(factor base^(2i/d)) - 1/base^(2i/d)), i.e. "
                    "transformers' clamp((i - low)/(high - low), 0, 1) ramp")
            summary[name] = (inv, float(rot.attention_scaling),
                             None if "yarn_interpolation_weight" not in g else g["yarn_interpolation_weight"][()])
    return path, summary


def write_cases(script, cases, norm_base, **case_kw):
    """The main of the scripts that add Llama-family variants to hf_llama/ (gen_hf_gemma_golden.py,
    gen_hf_olmo2_golden.py, gen_hf_mixtral_golden.py): each case written with write_case (case_kw: its optional
    to_saved / extra_h5), the tensors listed."""
    ensure_venv(script)
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(OUT, exist_ok=True)
    vers = versions()
    tokens = tokens_array()
    print("versions:", json.dumps(vers))
    generator = "tests/oracle/" + os.path.basename(script)
    for name, model_cls, config_cls, extra, description in cases:
        r = write_case(name, model_cls, config_cls, extra, description, tokens, vers, norm_base=norm_base,
                       generator=generator, **case_kw)
        print(f"== {name}: loss {r['loss']:.6f}, sliding windows per layer {r['windows']}")
        if r["extra"] is not None:
            print(f"   {r['extra']}")
        for tname, shape, dtype in r["tensors"]:
            print(f"   {tname:50s} {dtype} {shape}")


def main():
    ensure_venv(__file__)
    import numpy as np
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(OUT, exist_ok=True)
    vers = versions()
    tokens = tokens_array()
    print("versions:", json.dumps(vers))
    print("tokens:", tokens.tolist())
    for name, model_cls, config_cls, extra, description in CASES:
        r = write_case(name, model_cls, config_cls, extra, description, tokens, vers)
        print(f"== {name}: loss {r['loss']:.6f}, sliding windows per layer {r['windows']}, "
              f"attention_scaling {r['attn_scaling']:.6f}, inv_freq {np.array2string(r['inv_freq'], precision=6)}")
        files = sorted(os.listdir(r["dir"]))
        print("   " + ", ".join(f"{n} ({os.path.getsize(os.path.join(r['dir'], n))} B)" for n in files)
              + f"; {os.path.basename(r['h5'])} ({os.path.getsize(r['h5'])} B)")
        for tname, shape, dtype in r["tensors"]:
            print(f"   {tname:45s} {dtype} {shape}")
    path, summary = write_rope_tables(vers)
    print(f"{path}: {os.path.getsize(path)} B")
    for name, (inv, sc, w) in summary.items():
        print(f"   {name:24s} attention_scaling {sc:.6f} inv_freq {np.array2string(inv, precision=5, max_line_width=200)}")
        if w is not None:
            print(f"   {'':24s} yarn interpolation weight {np.array2string(w, precision=4, max_line_width=200)}")


if __name__ == "__main__":
    main()
