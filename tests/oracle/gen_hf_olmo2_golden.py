#!/usr/bin/env python3
"""Golden OLMo 2 checkpoints, logits, losses and gradients from `transformers` + `torch` (CPU).

OLMo 2 is the Llama family's model here (levanter/models/llama_config.hpp, `type: olmo2`): post-norm sublayers
(`x + post_attention_layernorm(attn(x))`, `x + post_feedforward_layernorm(mlp(x))`, no input norm) and RMSNorms of
the whole query and key projections (over num_heads x head_dim and num_kv_heads x head_dim, before RoPE). Its goldens
sit beside the Llama family's in tests/golden/hf_llama/ and tests/test_llama.cpp reads them with the same code; this
script writes them with gen_hf_llama_golden.py's `write_case` (same venv, tokens, file layout and weight draw: norm
weights 1 + 0.1*N(0,1), everything else 0.1*N(0,1)).

    python3 tests/oracle/gen_hf_olmo2_golden.py       # /tmp/hf-venv, requirements-hf.txt
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_hf_llama_golden as L  # noqa: E402

# transformers' Olmo2Config defaults pad_token_id to 1, which gives nn.Embedding a padding_idx (torch then zeroes
# that row's input-lookup gradient); neither upstream Levanter nor we do that. eos 50279 is outside this vocabulary.
COMMON = dict(pad_token_id=None, bos_token_id=0, eos_token_id=1)

# name, transformers class, config class, extra config kwargs, description
CASES = [
    ("olmo2_gqa", "Olmo2ForCausalLM", "Olmo2Config",
     dict(COMMON, num_key_value_heads=2, rope_theta=10000.0, tie_word_embeddings=False),
     "OLMo 2, GQA (4 q / 2 kv heads, head_dim 8), q_norm over 32 and k_norm over 16 features, post-norm "
     "sublayers, untied"),
    ("olmo2_tied_llama3", "Olmo2ForCausalLM", "Olmo2Config",
     dict(COMMON, num_key_value_heads=4, tie_word_embeddings=True, rope_theta=10000.0,
          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 64}),
     "OLMo 2, MHA (4 q / 4 kv heads), tied embeddings, llama3 RoPE"),
]


def main():
    L.write_cases(__file__, CASES, norm_base=1.0)


if __name__ == "__main__":
    main()
