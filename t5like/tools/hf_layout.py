"""The Hugging Face layout of a t5like model: config fields and tensor names, both directions.

t5like stores every layer's parameters stacked on a leading ``layers`` axis with einsum-shaped
kernels (``wq: [d, heads, head_dim]``); the exported directory holds one tensor per layer in
PyTorch's ``nn.Linear`` layout (``[out_features, in_features]``) under Llama-style names, which
``t5like/hf/modeling_t5like.py`` reads. ``to_hf`` and ``from_hf`` are exact inverses (transposes
and reshapes only, no arithmetic), so an import of an export is bit-identical. numpy only.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from t5like.config.model import ModelConfig

# ModelConfig fields carried into config.json under the same name (the HF config's own
# hidden_size etc. are derived from them, see ``hf_config``).
MODEL_FIELDS = ("family", "vocab_size", "d_model", "num_heads", "num_kv_heads", "head_dim",
                "d_ff", "num_layers", "num_encoder_layers", "num_decoder_layers",
                "decoder_attention", "qkv_norm", "v_norm", "attn_out_norm",
                "attn_out_norm_scope", "rope_max_wavelength", "cross_attention_rope",
                "continuous_positions", "norm_eps", "tie_embeddings", "scale_logits")
# Training-only choices an exported model cannot reproduce; refused rather than dropped.
UNSUPPORTED = {"mixed_attention": "none", "shared_encoder_decoder": False,
               "attention_logit_soft_cap": 0.0}


# How a t5like leaf becomes an HF tensor: "in": a kernel contracting its first axis ([d, ...] ->
# [prod(...), d]); "out": a kernel producing its last axis ([..., d] -> [d, prod(...)]);
# "vec": a norm scale (flattened); "same": as it is.
_ATTENTION = (("wq", "q_proj", "in"), ("wk", "k_proj", "in"), ("wv", "v_proj", "in"),
              ("wo", "o_proj", "out"), ("q_norm/scale", "q_norm", "vec"),
              ("k_norm/scale", "k_norm", "vec"), ("v_norm/scale", "v_norm", "vec"),
              ("out_norm/scale", "o_norm", "vec"))
_MLP = (("wi_gate", "gate_proj", "in"), ("wi_up", "up_proj", "in"), ("wo", "down_proj", "out"))
_SELF_BLOCK = (("pre_attention_norm/scale", "input_layernorm", "vec"),
               *((f"attention/{a}", f"self_attn.{b}", c) for a, b, c in _ATTENTION),
               ("pre_mlp_norm/scale", "post_attention_layernorm", "vec"),
               *((f"mlp/{a}", f"mlp.{b}", c) for a, b, c in _MLP))
_CROSS_BLOCK = (("pre_self_attention_norm/scale", "self_attn_layernorm", "vec"),
                *((f"self_attention/{a}", f"self_attn.{b}", c) for a, b, c in _ATTENTION),
                ("pre_cross_attention_norm/scale", "cross_attn_layernorm", "vec"),
                *((f"cross_attention/{a}", f"cross_attn.{b}", c) for a, b, c in _ATTENTION),
                ("pre_mlp_norm/scale", "mlp_layernorm", "vec"),
                *((f"mlp/{a}", f"mlp.{b}", c) for a, b, c in _MLP))


def _has(params: dict, path: str) -> bool:
  for key in path.split("/"):
    if not isinstance(params, dict) or key not in params:
      return False
    params = params[key]
  return True


def _get(params: dict, path: str) -> Any:
  for key in path.split("/"):
    params = params[key]
  return params


def entries(params: dict, cfg: ModelConfig) -> Iterator[tuple[str, str, int | None, str]]:
  """(HF name, t5like leaf path, layer index or None, kind) of every tensor of ``params``
  (a nested dict of arrays or of shape-carrying leaves)."""
  yield "model.embed_tokens.weight", "embedding/table", None, "same"
  if not cfg.tie_embeddings:
    yield "lm_head.weight", "embedding/output", None, "same"
  if cfg.family == "decllm":
    stacks = [("decoder", "model.layers", cfg.num_layers, _SELF_BLOCK)]
    finals = [("final_norm/scale", "model.norm.weight")]
  else:
    stacks = [("encoder", "model.encoder.layers", cfg.num_encoder_layers, _SELF_BLOCK),
              ("decoder", "model.decoder.layers", cfg.num_decoder_layers, _CROSS_BLOCK)]
    finals = [("encoder_norm/scale", "model.encoder.norm.weight"),
              ("decoder_norm/scale", "model.decoder.norm.weight")]
  for stack, hf, n, block in stacks:
    for path, hf_name, kind in block:
      path = f"{stack}/layers/{path}"
      if _has(params, path):
        for i in range(n):
          yield f"{hf}.{i}.{hf_name}.weight", path, i, kind
  for path, hf_name in finals:
    yield hf_name, path, None, "same"


def _hf_view(a: np.ndarray, kind: str) -> np.ndarray:
  if kind == "in":
    return a.reshape(a.shape[0], -1).T
  if kind == "out":
    return a.reshape(-1, a.shape[-1]).T
  if kind == "vec":
    return a.reshape(-1)
  return a


def to_hf(params: dict[str, Any], cfg: ModelConfig) -> dict[str, np.ndarray]:
  """t5like parameters (nested dict of arrays) -> {HF tensor name: numpy array}."""
  out = {}
  for name, path, i, kind in entries(params, cfg):
    a = np.asarray(_get(params, path))
    out[name] = np.ascontiguousarray(_hf_view(a if i is None else a[i], kind))
  return out


def hf_shapes(template: dict[str, Any], cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
  """{HF name: shape} for abstract parameters ``template`` (leaves with .shape)."""
  out = {}
  for name, path, i, kind in entries(template, cfg):
    shape = tuple(_get(template, path).shape)[(0 if i is None else 1):]
    out[name] = _hf_view(np.empty(shape, np.int8), kind).shape
  return out


def from_hf(tensors: dict[str, np.ndarray], cfg: ModelConfig, template: dict[str, Any]
            ) -> dict[str, Any]:
  """{HF tensor name: array} -> t5like parameters shaped like ``template`` (abstract parameters:
  a nested dict of leaves with .shape/.dtype). The inverse of ``to_hf``: layers are stacked back
  on the leading axis. Raises KeyError / ValueError naming a missing, surplus or misshapen
  tensor."""
  shapes = hf_shapes(template, cfg)
  missing = sorted(set(shapes) - set(tensors))
  surplus = sorted(set(tensors) - set(shapes))
  if missing or surplus:
    raise KeyError(f"the tensor names do not match a t5like {cfg.family} of this config: "
                   f"missing {missing[:4]}, unexpected {surplus[:4]}")
  for name, want in shapes.items():
    if tuple(tensors[name].shape) != tuple(want):
      raise ValueError(f"tensor {name} has shape {tuple(tensors[name].shape)}; the config "
                       f"expects {tuple(want)}")
  out = _zeros_like(template)
  for name, path, i, kind in entries(template, cfg):
    leaf = _get(out, path)
    target = leaf if i is None else leaf[i]
    _hf_view(target, kind)[...] = tensors[name]  # Views: writes into ``out``.
  return out


def _zeros_like(template: Any) -> Any:
  if isinstance(template, dict):
    return {k: _zeros_like(v) for k, v in template.items()}
  return np.zeros(template.shape, np.dtype(template.dtype))
