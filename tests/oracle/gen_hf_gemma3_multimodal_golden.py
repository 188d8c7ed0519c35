#!/usr/bin/env python3
"""A golden multimodal Gemma 3 (Gemma3ForConditionalGeneration, model_type gemma3) from `transformers` + `torch`.

Its language model is what a Levanter user trains from such a checkpoint: the importer reads `text_config` and the
language model's tensors and leaves the vision tower and projector alone. This writes

  tests/golden/hf_llama/gemma3_multimodal/          save_pretrained: config.json (text_config written as its
                                                    difference from Gemma3TextConfig's defaults, as the released
                                                    checkpoints are) + model.safetensors (a tiny SigLIP tower)
  tests/golden/hf_llama/gemma3_multimodal_golden.h5 tokens [2,16] (text only, no image tokens), logits of the
                                                    whole Gemma3ForConditionalGeneration on them
  tests/golden/hf_llama/gemma3_multimodal_config_transformers4.json
                                                    the same model's config.json as transformers 4.50 wrote the
                                                    released checkpoints: text_config holds only what differs from
                                                    Gemma3TextConfig's defaults (the test pairs it with the tensors
                                                    renamed to 4.50's language_model.model.* layout)

with the venv of gen_hf_llama_golden.py (/tmp/hf-venv, requirements-hf.txt):

    python3 tests/oracle/gen_hf_gemma3_multimodal_golden.py

The text model is kept at Gemma3TextConfig's defaults where a tiny model allows (rms_norm_eps, hidden_activation,
rope_theta 1e6 and the local layers' 1e4, sliding_window_pattern 6, tie_word_embeddings,
bos/eos ids), so that the importer's defaults are what the transformers-4 form tests. Parameters are 0.1*N(0,1), norm weights included (a Gemma norm
scales by 1 + weight), torch.Generator seeded 0, in named_parameters() order. The logits are checked against
Gemma3ForCausalLM loaded with the same language-model weights.
"""

import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_hf_llama_golden as L  # noqa: E402

NAME = "gemma3_multimodal"
TEXT = dict(vocab_size=L.VOCAB, hidden_size=32, intermediate_size=40, num_hidden_layers=7, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=4, pad_token_id=None,
            max_position_embeddings=64)
VISION = dict(hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2, image_size=28,
              patch_size=14, num_channels=3)


def main():
    L.ensure_venv(__file__)
    import h5py
    import numpy as np
    import torch
    import transformers
    from safetensors import safe_open

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    text_cfg = transformers.Gemma3TextConfig(**TEXT)
    vision_cfg = transformers.SiglipVisionConfig(**VISION)
    cfg = transformers.Gemma3Config(text_config=text_cfg, vision_config=vision_cfg, mm_tokens_per_image=1,
                                    image_token_index=1000, boi_token_index=1001,
                                    eoi_token_index=1002)  # outside the text vocabulary
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(cfg).float().eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32))

    d = os.path.join(L.OUT, NAME)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    with open(os.path.join(d, "config.json")) as f:
        saved_cfg = json.load(f)
    # transformers 5 writes text_config whole; the released checkpoints (transformers 4.50) wrote its difference
    # from Gemma3TextConfig's defaults, with the RoPE as rope_theta / rope_local_base_freq (+ rope_scaling) and
    # the layer pattern as sliding_window_pattern. That form is written beside, for the importer's defaults.
    v4_text = dict(model_type="gemma3_text", hidden_size=32, intermediate_size=40, num_hidden_layers=7,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
                   sliding_window=4, vocab_size=L.VOCAB, pad_token_id=None, max_position_embeddings=64)
    defaults = transformers.Gemma3TextConfig().to_dict()
    for k, v in v4_text.items():
        assert k == "model_type" or defaults.get(k) != v, k  # only what differs from the defaults
    assert saved_cfg["text_config"]["bos_token_id"] == defaults["bos_token_id"]
    assert saved_cfg["text_config"]["rope_parameters"] == defaults["rope_parameters"]
    assert saved_cfg["text_config"]["layer_types"] == [
        "sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(7)]
    v4 = {k: v for k, v in saved_cfg.items() if k not in ("text_config", "dtype")}
    v4["text_config"] = v4_text
    v4["torch_dtype"] = "float32"
    v4["transformers_version"] = "4.50.0"
    with open(os.path.join(L.OUT, f"{NAME}_config_transformers4.json"), "w") as f:
        json.dump(v4, f, indent=2, sort_keys=True)
        f.write("\n")
    left_to_defaults = sorted(set(defaults) - set(v4_text))

    tokens = L.tokens_array()
    assert tokens.max() < L.VOCAB  # no image or image-boundary tokens
    tok = torch.from_numpy(tokens).long()
    with torch.no_grad():
        logits = model(input_ids=tok).logits
    assert logits.shape == (L.BATCH, L.SEQ, L.VOCAB)

    # the same weights as a text-only Gemma3ForCausalLM give the same logits
    text_only = transformers.Gemma3ForCausalLM(cfg.text_config).float().eval()
    lm = {k[len("model.language_model."):]: v for k, v in model.state_dict().items()
          if k.startswith("model.language_model.")}
    text_only.model.load_state_dict(lm, strict=True)
    text_only.tie_weights()
    with torch.no_grad():
        ref = text_only(tok).logits
    assert torch.allclose(ref, logits, atol=1e-6), float((ref - logits).abs().max())

    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        names = sorted(f.keys())
    # transformers 5.23 saves in the released checkpoints' layout (language_model.model.*, vision_tower.*,
    # multi_modal_projector.*); 4.52-4.57 wrote model.language_model.* (the test renames the tensors to that too)
    assert any(n.startswith("vision_tower.") for n in names), names
    assert any(n.startswith("language_model.model.layers.0.") for n in names), names

    vers = L.versions()
    with h5py.File(os.path.join(L.OUT, f"{NAME}_golden.h5"), "w", libver=("v110", "latest")) as f:
        f.attrs["generator"] = "tests/oracle/gen_hf_gemma3_multimodal_golden.py"
        for k, v in vers.items():
            f.attrs[k] = v
        f.attrs["description"] = ("Gemma3ForConditionalGeneration (tiny SigLIP tower, 7 text layers: pattern 6 -> "
                                  "layer 5 global), text-only tokens; logits of the whole model")
        f.attrs["transformers4_text_config_left_to_defaults"] = json.dumps(left_to_defaults)
        f.create_dataset("tokens", data=tokens.astype(np.int32))
        f.create_dataset("logits", data=logits.numpy().astype(np.float32))
    print("versions:", json.dumps(vers))
    print("transformers 4 form leaves to the defaults:", left_to_defaults)
    print("tensors:", len(names), "of which language model:", sum(n.startswith("language_model.") for n in names))


if __name__ == "__main__":
    main()
