#!/usr/bin/env python3
"""Golden Mixtral (sparse mixture-of-experts) checkpoints, logits, losses, gradients and MoE auxiliary losses from
`transformers` + `torch` (CPU).

Mixtral is a Llama-family decoder whose MLP is a sparse MoE block: a router `gate` [experts, hidden] whose softmax
picks the top-k experts per token (the k probabilities renormalised to sum to 1), each expert a SwiGLU MLP. Its
goldens sit beside the Llama family's in tests/golden/hf_llama/ and are written with gen_hf_llama_golden.py's
`write_case` (same venv, tokens, file layout and weight draw: norm weights 1 + 0.1*N(0,1), everything else
0.1*N(0,1), drawn in named_parameters() order), with two additions:

  * transformers 5 keeps the experts fused in memory (`model.layers.N.mlp.experts.gate_up_proj` [E, 2I, H],
    gate rows first, and `...mlp.experts.down_proj` [E, H, I]; router `...mlp.gate.weight`), but save_pretrained
    writes the original Mixtral checkpoint layout (`model.layers.N.block_sparse_moe.gate.weight` [E, H],
    `...block_sparse_moe.experts.e.w1.weight` [I, H] (gate), `.w2.weight` [H, I] (down), `.w3.weight` [I, H]
    (up)). `to_saved` splits parameters and gradients accordingly, so grads/ is keyed by the names as saved.
  * upstream Levanter's MoE auxiliary losses (levanter/models/mixtral.py, MixtralSparseMoeBlock), per layer over
    all T = batch*seq tokens, from the router logits:  probs = softmax(logits); top-k of probs;
    f_e = counts_e / (T*K) * E / K (no gradient);  p_e = mean_t probs[t, e];  lbl = sum_e f_e p_e;
    rzl = mean_t logsumexp(logits[t])^2;  loss_with_aux = CE + 0.01 sum_layers lbl + 0.001 sum_layers rzl
    and its gradients (grads_with_aux/<saved name>). `loss` and grads/ stay the plain cross-entropy ones.

    python3 tests/oracle/gen_hf_mixtral_golden.py       # /tmp/hf-venv, requirements-hf.txt
"""

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_hf_llama_golden as L  # noqa: E402

LBL_COEF = 0.01   # upstream Levanter MixtralConfig defaults (lbl_coef, rzl_coef)
RZL_COEF = 0.001

# Mixtral's defaults (bos 1, eos 2, rope_theta 1e6) replaced; the expert MLPs run through transformers' plain
# per-expert loop ("eager"; the default would be grouped_mm where torch offers it, checked against eager below).
COMMON = dict(pad_token_id=None, bos_token_id=0, eos_token_id=1, rope_theta=10000.0, sliding_window=None,
              tie_word_embeddings=False, router_jitter_noise=0.0, experts_implementation="eager")

# name, transformers class, config class, extra config kwargs, description
CASES = [
    ("mixtral_top2", "MixtralForCausalLM", "MixtralConfig",
     dict(COMMON, num_local_experts=4, num_experts_per_tok=2, num_key_value_heads=2),
     "Mixtral, GQA (4 q / 2 kv heads, head_dim 8), sparse MoE MLP: 4 experts (SwiGLU, intermediate 40), top-2 "
     "routing (softmax, top-k, renormalised), untied, no sliding window"),
    ("mixtral_top1", "MixtralForCausalLM", "MixtralConfig",
     dict(COMMON, num_local_experts=4, num_experts_per_tok=1, num_key_value_heads=4),
     "Mixtral, MHA (4 q / 4 kv heads, head_dim 8), sparse MoE MLP: 4 experts, top-1 routing (renormalised weight "
     "= 1), untied, no sliding window"),
]

MOE_RE = re.compile(r"(model\.layers\.\d+\.)mlp\.(gate\.weight|experts\.gate_up_proj|experts\.down_proj)")


def to_saved(named):
    """{in-memory parameter name: tensor} -> {model.safetensors name: tensor} (views, no copies)."""
    out = {}
    for k, v in named.items():
        m = MOE_RE.fullmatch(k)
        if m is None:
            assert ".mlp." not in k, k
            out[k] = v
            continue
        pre, what = m.groups()
        moe = pre + "block_sparse_moe."
        if what == "gate.weight":
            out[moe + "gate.weight"] = v
        elif what == "experts.gate_up_proj":  # [E, 2I, H]: rows 0..I-1 gate (w1), I..2I-1 up (w3)
            inter = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{moe}experts.{e}.w1.weight"] = v[e, :inter]
                out[f"{moe}experts.{e}.w3.weight"] = v[e, inter:]
        else:  # experts.down_proj [E, H, I]
            for e in range(v.shape[0]):
                out[f"{moe}experts.{e}.w2.weight"] = v[e]
    return out


def moe_aux(f, model, tok, as_saved):
    """Writes the router data, upstream Levanter's auxiliary losses, loss_with_aux and grads_with_aux/."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    cfg = model.config
    n_exp, top_k, n_layers = cfg.num_local_experts, cfg.num_experts_per_tok, cfg.num_hidden_layers
    routers = [layer.mlp.gate for layer in model.model.layers]
    captured = [None] * n_layers
    hooks = [r.register_forward_hook(lambda mod, inp, out, i=i: captured.__setitem__(i, out))
             for i, r in enumerate(routers)]
    model.zero_grad(set_to_none=True)
    try:
        out = model(tok, output_router_logits=True)
    finally:
        for h in hooks:
            h.remove()
    vocab = cfg.vocab_size
    logits = out.logits
    assert torch.equal(logits.detach(), torch.from_numpy(f["logits"][()])), "logits differ between forwards"
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), tok[:, 1:].reshape(-1))
    assert len(out.router_logits) == n_layers

    n_tok = tok.numel()
    lbl, rzl, counts, topk, weights = [], [], [], [], []
    for i, rl in enumerate(out.router_logits):
        hf_logits, hf_weights, hf_idx = captured[i]
        assert rl is hf_logits or torch.equal(rl, hf_logits)
        assert rl.shape == (n_tok, n_exp) and rl.dtype == torch.float32, (rl.shape, rl.dtype)
        probs = torch.softmax(rl, dim=-1)
        # top-k with ties broken towards the lower index (stable sort of -probs)
        idx = torch.sort(-probs.detach(), dim=-1, stable=True).indices[:, :top_k]
        assert torch.equal(idx, hf_idx), f"layer {i}: top-k differs from transformers'"
        top = probs.detach().gather(1, idx)
        assert torch.allclose(top / top.sum(-1, keepdim=True), hf_weights, rtol=0, atol=1e-6)
        cnt = torch.bincount(idx.reshape(-1), minlength=n_exp)
        f_e = cnt.float() / (n_tok * top_k) * n_exp / top_k
        lbl.append((f_e * probs.mean(dim=0)).sum())
        rzl.append((torch.logsumexp(rl, dim=-1) ** 2).mean())
        counts.append(cnt)
        topk.append(hf_idx)
        weights.append(hf_weights.detach())
    lbl_sum, rzl_sum = torch.stack(lbl).sum(), torch.stack(rzl).sum()
    total = ce + LBL_COEF * lbl_sum + RZL_COEF * rzl_sum
    total.backward()

    # transformers' own (different) load-balancing formula, for reference
    hf_aux = float(out.aux_loss.detach())
    # the grouped_mm experts implementation, where torch offers it, gives the same logits
    impl_check = "grouped_mm not available"
    try:
        model.set_experts_implementation("grouped_mm")
        if model.config._experts_implementation == "grouped_mm":
            with torch.no_grad():
                alt = model(tok).logits
            diff = float((alt - logits.detach()).abs().max())
            assert diff < 1e-5, diff
            impl_check = f"grouped_mm max |logit diff| vs eager {diff:.2e}"
    except (ValueError, ImportError, RuntimeError, NotImplementedError) as e:
        impl_check = f"grouped_mm not checked: {type(e).__name__}: {e}"
    finally:
        model.set_experts_implementation("eager")
    assert model.config._experts_implementation == "eager"

    f.attrs["lbl_coef"] = LBL_COEF
    f.attrs["rzl_coef"] = RZL_COEF
    f.attrs["num_local_experts"] = int(n_exp)
    f.attrs["num_experts_per_tok"] = int(top_k)
    f.attrs["hf_router_aux_loss_coef"] = float(cfg.router_aux_loss_coef)
    f.attrs["hf_aux_loss"] = hf_aux
    f.attrs["moe_definition"] = (
        "upstream Levanter MixtralSparseMoeBlock, per layer over all T = batch*seq tokens (row t = b*seq + s): "
        "probs = softmax(router logits); idx = top-k of probs (ties: lower index); counts_e = #(t,k) with idx = e; "
        "f_e = counts_e/(T*K) * E/K (no gradient); p_e = mean_t probs[t,e]; moe_lbl = sum_e f_e p_e; "
        "moe_rzl = mean_t logsumexp(logits[t])^2; loss_with_aux = loss + lbl_coef*sum(moe_lbl) + "
        "rzl_coef*sum(moe_rzl); grads_with_aux = d loss_with_aux / d parameter. hf_aux_loss is transformers' "
        "load_balancing_loss_func (E * sum_e mean_layers,t onehot-count_e * mean_layers,t probs_e), not used here")
    f.attrs["experts_implementation_check"] = impl_check
    ds = f.create_dataset("moe_lbl", data=torch.stack(lbl).detach().numpy().astype(np.float32))
    ds.attrs["meaning"] = "per layer: sum_e f_e p_e (no coefficient)"
    ds = f.create_dataset("moe_rzl", data=torch.stack(rzl).detach().numpy().astype(np.float32))
    ds.attrs["meaning"] = "per layer: mean over tokens of logsumexp(router logits)^2 (no coefficient)"
    ds = f.create_dataset("moe_router_logits",
                          data=torch.stack([rl.detach() for rl in out.router_logits]).numpy().astype(np.float32))
    ds.attrs["meaning"] = "[layer, token, expert]: router logits gate(x), token t = b*seq + s (b batch, s position)"
    ds = f.create_dataset("moe_counts", data=torch.stack(counts).numpy().astype(np.int32))
    ds.attrs["meaning"] = "[layer, expert]: number of (token, slot) assignments; each row sums to T*K"
    ds = f.create_dataset("moe_topk", data=torch.stack(topk).numpy().astype(np.int32))
    ds.attrs["meaning"] = "[layer, token, slot]: experts chosen by transformers, by decreasing probability"
    ds = f.create_dataset("moe_weights", data=torch.stack(weights).numpy().astype(np.float32))
    ds.attrs["meaning"] = "[layer, token, slot]: top-k softmax probabilities renormalised to sum 1 per token"
    f.create_dataset("loss_with_aux", data=np.float32(total.item()))
    params = dict(model.named_parameters())
    assert all(p.grad is not None for p in params.values())
    grads = as_saved({k: p.grad for k, p in params.items()})
    g = f.create_group("grads_with_aux")
    for k in sorted(grads):
        assert tuple(grads[k].shape) == tuple(f["grads"][k].shape), k
        g.create_dataset(k, data=grads[k].detach().numpy().astype(np.float32))
    return dict(ce=round(ce.item(), 6), loss_with_aux=round(total.item(), 6),
                lbl=[round(x.item(), 6) for x in lbl], rzl=[round(x.item(), 6) for x in rzl],
                counts=[c.tolist() for c in counts], hf_aux_loss=round(hf_aux, 6), impl_check=impl_check)


def main():
    L.write_cases(__file__, CASES, norm_base=1.0, to_saved=to_saved, extra_h5=moe_aux)


if __name__ == "__main__":
    main()
