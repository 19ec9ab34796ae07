"""Imports a Hugging Face model directory into a t5like checkpoint (no torch needed).

Usage::

  python -m t5like.tools.import_hf --hf_dir D --workdir W

``D`` (local or ``gs://``) is either a directory written by ``t5like.tools.export_hf`` (DecLLM or
RedLLM, read back bit for bit) or a plain Llama / Qwen3-layout decoder (``model_type`` "llama",
"qwen3"), which becomes a DecLLM with the switches it needs: no Q/K/V norms (Llama) or Q/K norms
only (Qwen3, ``model.v_norm=False``), its own output table unless tied
(``model.tie_embeddings``), the standard output layer (``model.scale_logits=False``), its RoPE
base and norm epsilon. ``W/checkpoints/0`` then holds the parameters and the resolved config
(fresh optimizer state), so ``--config.train.init_from=W`` fine-tunes it and ``eval.py`` /
``t5like.inference`` read it. A SentencePiece ``tokenizer.model`` in ``D`` is copied to
``W/vocab/spm.model`` and becomes ``data.vocab_path``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

import numpy as np
from etils import epath

from t5like import cli
from t5like.config import Config, apply_dict
from t5like.config.model import ModelConfig
from t5like.config.schema import to_dict
from t5like.errors import UserError
from t5like.tools import hf_layout

DECODER_TYPES = ("llama", "qwen3")


class HFImportError(UserError, ValueError):
  """A directory this import cannot read; the message says why and what would."""


def read_tensors(hf_dir: epath.Path) -> dict[str, np.ndarray]:
  """Every tensor of ``model.safetensors`` or of the shards its index names (numpy)."""
  from safetensors.numpy import load
  index = hf_dir / "model.safetensors.index.json"
  if index.exists():
    files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
  elif (hf_dir / "model.safetensors").exists():
    files = ["model.safetensors"]
  else:
    raise HFImportError(f"{hf_dir} has no model.safetensors (or index); export the weights as "
                       "safetensors (save_pretrained(..., safe_serialization=True))")
  out: dict[str, np.ndarray] = {}
  for name in files:
    out.update(load((hf_dir / name).read_bytes()))
  return out


def _rope_base(hf: dict[str, Any]) -> float:
  params = hf.get("rope_parameters") or {}
  scaling = hf.get("rope_scaling") or {}
  kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
  if kind != "default":
    raise HFImportError(f"rope_type={kind!r} (RoPE scaling) has no t5like equivalent; only plain "
                       "RoPE imports")
  return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def decoder_config(hf: dict[str, Any]) -> ModelConfig:
  """The DecLLM config of a Llama / Qwen3 config.json."""
  kind = hf["model_type"]
  for flag in ("attention_bias", "mlp_bias", "use_sliding_window"):
    if hf.get(flag):
      raise HFImportError(f"{kind} with {flag}=true has no t5like equivalent")
  if hf.get("hidden_act", "silu") != "silu":
    raise HFImportError(f"hidden_act={hf['hidden_act']!r}: t5like's MLP is SwiGLU (silu)")
  rope_base = _rope_base(hf)
  need = ("vocab_size", "hidden_size", "num_attention_heads", "intermediate_size",
          "num_hidden_layers", "rms_norm_eps")
  missing = [k for k in need if k not in hf]
  if missing:
    raise HFImportError(f"config.json of a {kind} model lacks {', '.join(missing)}")
  heads = hf["num_attention_heads"]
  return ModelConfig(
      family="decllm", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], num_heads=heads,
      num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, d_ff=hf["intermediate_size"],
      num_layers=hf["num_hidden_layers"], qkv_norm=kind == "qwen3", v_norm=kind != "qwen3",
      rope_max_wavelength=rope_base, norm_eps=float(hf["rms_norm_eps"]),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)), scale_logits=False)


def model_config(hf: dict[str, Any]) -> ModelConfig:
  kind = hf.get("model_type")
  if kind == "t5like":
    return ModelConfig(**{f: hf[f] for f in hf_layout.MODEL_FIELDS if f in hf})
  if kind in DECODER_TYPES:
    return decoder_config(hf)
  raise HFImportError(f"model_type={kind!r}: import_hf reads t5like exports and the decoder "
                     f"layouts {', '.join(DECODER_TYPES)}")


def _untied_copy(tensors: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
  """A tied checkpoint may still list ``lm_head.weight`` (the same table): drop it."""
  if cfg.tie_embeddings and "lm_head.weight" in tensors:
    tensors = dict(tensors)
    if not np.array_equal(tensors.pop("lm_head.weight"), tensors["model.embed_tokens.weight"]):
      raise HFImportError("tie_word_embeddings=true but lm_head.weight differs from the embedding")
  return tensors


def write_checkpoint(cfg: Config, params: dict[str, Any], workdir: str, step: int = 0) -> str:
  """``workdir/checkpoints/<step>``: ``params`` (nested dict of arrays, the model's structure)
  in a fresh train state with ``cfg``, as train.py writes it. Returns the step directory."""
  import jax
  from t5like import partitioning
  from t5like.training import checkpointing, state as state_lib
  setup = state_lib.build_setup(cfg, partitioning.make_mesh(cfg.mesh))
  placed = jax.tree.map(lambda a, s: jax.device_put(np.asarray(a, s.dtype), s.sharding),
                        params, setup.abstract_state.params)
  state = state_lib.fresh_state_from_params(setup, placed)
  ckpt = checkpointing.Checkpointer(os.fspath(epath.Path(workdir) / "checkpoints"),
                                    cfg.checkpoint)
  try:
    ckpt.save(step, state, to_dict(cfg), None)
    ckpt.wait()
  finally:
    ckpt.close()
  return os.fspath(epath.Path(workdir) / "checkpoints" / str(step))


def import_dir(hf_dir: str, workdir: str) -> str:
  """Reads ``hf_dir`` and writes its checkpoint under ``workdir``; returns the step directory."""
  from flax import nnx
  from t5like.models.param_count import abstract_model
  src = epath.Path(hf_dir)
  if not (src / "config.json").exists():
    raise HFImportError(f"{hf_dir} has no config.json: not a Hugging Face model directory")
  model_cfg = model_config(json.loads((src / "config.json").read_text())).validate()
  cfg = apply_dict(Config(), {"model": to_dict(model_cfg)})
  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 1, -1, 1
  if (src / "tokenizer.model").exists():
    vocab = epath.Path(workdir) / "vocab" / "spm.model"
    vocab.parent.mkdir(parents=True, exist_ok=True)
    vocab.write_bytes((src / "tokenizer.model").read_bytes())
    cfg.data.vocab_path = os.fspath(vocab)
  cfg.validate()
  template = nnx.to_pure_dict(nnx.state(abstract_model(model_cfg), nnx.Param))  # Shapes only.
  tensors = _untied_copy(read_tensors(src), model_cfg)
  try:
    params = hf_layout.from_hf(tensors, model_cfg, template)
  except (KeyError, ValueError) as e:
    raise HFImportError(str(e).strip('"')) from None
  return write_checkpoint(cfg, params, workdir)


def model_overrides(model_cfg: ModelConfig) -> list[str]:
  """``--config.model.<field>=<value>`` for every field that differs from the defaults: what a
  training config needs to fine-tune the imported checkpoint (``train.init_from`` checks it)."""
  default = to_dict(ModelConfig())
  return [f"--config.model.{k}={v}" for k, v in to_dict(model_cfg).items() if default[k] != v]


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m t5like.tools.import_hf",
                              description=__doc__.split("\n\n")[0])
  p.add_argument("--hf_dir", required=True, help="a Hugging Face model directory (or gs://)")
  p.add_argument("--workdir", required=True, help="where the t5like checkpoint goes")
  cli.add_debug_argument(p)
  args = p.parse_args(argv)
  step_dir = import_dir(args.hf_dir, args.workdir)
  print(step_dir)
  from t5like.training.restore import load_checkpoint_config
  cfg = load_checkpoint_config(step_dir)
  print(f"fine-tune with: --config.train.init_from={args.workdir} "
        + " ".join(model_overrides(cfg.model)), file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(cli.guard(main))
