#!/usr/bin/env python3
"""Golden Gemma, Gemma 2 and Gemma 3 checkpoints, logits, losses and gradients from `transformers` + `torch` (CPU).

The Gemma types are the Llama family's model here (levanter/models/llama_config.hpp), so their goldens sit beside
the Llama family's in tests/golden/hf_llama/ and tests/test_llama.cpp reads them with the same code. This script
writes them with gen_hf_llama_golden.py's `write_case` (same venv, same tokens, same file layout), with one
difference: every parameter, norm weights included, is 0.1*N(0,1), because a Gemma norm scales by (1 + weight).

    python3 tests/oracle/gen_hf_gemma_golden.py       # /tmp/hf-venv, requirements-hf.txt

The cases exercise what Gemma adds to Llama: the (1 + weight) norms, the sqrt(hidden) embedding scale, gelu_pytorch
_tanh, MQA with an explicit head_dim, Gemma 2's four norms per layer, attention and final logit soft-capping (caps
small enough that they change the result), query_pre_attn_scalar, local (sliding-window) layers, and Gemma 3's
QK norm, its every-p-th-layer-global pattern and the local layers' own RoPE base.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_hf_llama_golden as L  # noqa: E402

ACT = "gelu_pytorch_tanh"
# transformers' Gemma configs default pad_token_id to 0, which gives nn.Embedding a padding_idx: torch then leaves
# that row's input-lookup gradient at zero. Neither upstream Levanter nor we treat a token so; None turns it off.
NO_PAD = dict(pad_token_id=None)

# name, transformers class, config class, extra config kwargs, description
CASES = [
    ("gemma_mqa", "GemmaForCausalLM", "GemmaConfig",
     dict(NO_PAD, num_key_value_heads=1, head_dim=16, hidden_act=ACT, tie_word_embeddings=True, rope_theta=10000.0),
     "Gemma, MQA (4 q / 1 kv head), head_dim 16 (4*16 != 32), gelu_pytorch_tanh, tied, (1 + w) norms, "
     "embeddings * sqrt(32)"),
    ("gemma_gqa", "GemmaForCausalLM", "GemmaConfig",
     dict(NO_PAD, num_key_value_heads=2, head_dim=8, hidden_act=ACT, tie_word_embeddings=True, rope_theta=10000.0),
     "Gemma, GQA (4 q / 2 kv heads), head_dim 8 = hidden / heads (the case upstream Levanter can load: its Gemma "
     "attention ignores head_dim), gelu_pytorch_tanh, tied"),
    ("gemma2_softcap", "Gemma2ForCausalLM", "Gemma2Config",
     dict(NO_PAD, num_key_value_heads=2, head_dim=8, hidden_activation=ACT, tie_word_embeddings=True, rope_theta=10000.0,
          query_pre_attn_scalar=12, attn_logit_softcapping=0.5, final_logit_softcapping=1.0, sliding_window=4),
     "Gemma 2, GQA (4 q / 2 kv heads, head_dim 8), four norms per layer, query_pre_attn_scalar 12, attention "
     "soft cap 0.5, final soft cap 1.0, layer_types [sliding_attention (window 4), full_attention]"),
    ("gemma3_local", "Gemma3ForCausalLM", "Gemma3TextConfig",
     dict(NO_PAD, num_hidden_layers=3, num_key_value_heads=2, head_dim=8, hidden_activation=ACT, tie_word_embeddings=True,
          query_pre_attn_scalar=8, sliding_window=4, sliding_window_pattern=3,
          rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
                           "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}),
     "Gemma 3 (text), GQA (4 q / 2 kv heads), head_dim 8 = query_pre_attn_scalar, QK norm, 3 layers with "
     "sliding_window_pattern 3: "
     "[local (window 4, RoPE theta 100), local, global (linear RoPE factor 2, theta 1e4)], no soft-capping"),
]


def main():
    L.write_cases(__file__, CASES, norm_base=0.0)


if __name__ == "__main__":
    main()
