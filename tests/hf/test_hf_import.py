"""Llama- and Qwen3-layout decoders built in transformers (random weights) import into DecLLM
(``python -m t5like.tools.import_hf``) and give the same logits; the switches they need
(no V norm, untied output, standard logit scale, their RoPE base and norm epsilon) are set."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from t5like.training.restore import restore_model
from t5like import cli
from t5like.tools import import_hf

LAYOUTS = {
    "llama_untied": ("LlamaConfig", "LlamaForCausalLM",
                     dict(tie_word_embeddings=False, rope_theta=5000.0, rms_norm_eps=1e-5)),
    "llama_tied": ("LlamaConfig", "LlamaForCausalLM",
                   dict(tie_word_embeddings=True, rms_norm_eps=1e-6)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(tie_word_embeddings=False, rope_theta=1_000_000.0, rms_norm_eps=1e-6)),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_decoder_imports_with_equal_logits(layout, tmp_path):
  config_cls, model_cls, extra = LAYOUTS[layout]
  rope_theta = extra.pop("rope_theta", 10000.0)
  config = getattr(transformers, config_cls)(
      vocab_size=512, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
      rope_parameters={"rope_type": "default", "rope_theta": rope_theta}, **extra)
  torch.manual_seed(0)
  hf = getattr(transformers, model_cls)(config).eval()
  with torch.no_grad():  # Norm scales away from 1: a dropped or misplaced norm shows.
    for name, p in hf.named_parameters():
      if "norm" in name:
        p.mul_(torch.empty_like(p).uniform_(0.5, 1.5))
  hf.save_pretrained(tmp_path / "hf")
  step_dir = import_hf.import_dir(str(tmp_path / "hf"), str(tmp_path / "workdir"))
  model, cfg, _ = restore_model(step_dir, overrides=["model.dtype=float32"])
  m = cfg.model
  assert m.family == "decllm" and not m.scale_logits
  assert m.tie_embeddings == extra["tie_word_embeddings"]
  assert (m.qkv_norm, m.v_norm) == ((True, False) if layout == "qwen3" else (False, True))
  assert m.rope_max_wavelength == rope_theta and m.norm_eps == extra["rms_norm_eps"]
  assert (m.num_kv_heads, m.head_dim) == (2, 16)
  tokens = np.random.RandomState(0).randint(0, 512, (2, 40))
  want = np.asarray(model({"decoder_input_tokens": jnp.asarray(tokens, jnp.int32)}))
  with torch.no_grad():
    got = hf(torch.tensor(tokens)).logits.float().numpy()
  assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_unsupported_layouts_are_refused(tmp_path):
  (tmp_path / "config.json").write_text(
      '{"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4}, '
      '"num_attention_heads": 4, "hidden_size": 32}')
  assert cli.guard(import_hf.main, ["--hf_dir", str(tmp_path), "--workdir",
                                    str(tmp_path / "w")]) == 2
  with pytest.raises(import_hf.HFImportError, match="attention_bias"):
    import_hf.decoder_config({"model_type": "qwen3", "attention_bias": True})
