"""Analytic parameter counts, and the count of a built model without allocating it."""
from __future__ import annotations

import math

import jax
from flax import nnx

from t5like.config.model import ModelConfig
from t5like.config.moe import stack_moe_flags


def attention_params(cfg: ModelConfig) -> int:
  d, h, g, k = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_dim
  n = d * h * k + 2 * d * g * k + h * k * d  # Q, K, V, O projections.
  if cfg.qkv_norm:
    n += (3 if cfg.v_norm else 2) * k  # Per-head scales of the Q, K (and V) norms (shared
    #   across heads).
  if cfg.attn_out_norm:
    n += k if cfg.attn_out_norm_scope == "per_head" else h * k
  return n


def mlp_params(cfg: ModelConfig) -> int:
  return 3 * cfg.d_model * cfg.d_ff  # Gate, up and down projections of SwiGLU.


def moe_mlp_params(cfg: ModelConfig, active: bool = False) -> int:
  """An MoE feed-forward: router + routed experts (all, or the top-K a token uses when
  ``active``) + shared experts. The selection bias is state, not counted."""
  m, d = cfg.moe, cfg.d_model
  expert = 3 * d * m.expert_d_ff
  return d * m.num_experts + (m.top_k if active else m.num_experts) * expert + \
      m.num_shared_experts * expert


def ffn_params(cfg: ModelConfig, stack: str, num_layers: int, active: bool = False) -> int:
  """The feed-forwards of one stack ("decoder" / "encoder"), dense and MoE layers."""
  return sum(moe_mlp_params(cfg, active) if moe else mlp_params(cfg)
             for moe in stack_moe_flags(cfg.moe, stack, num_layers))


def analytic_param_count(cfg: ModelConfig, active: bool = False) -> int:
  """Exact parameter count of ``cfg`` from the formulas (a tied embedding counted once); with
  ``active``, the parameters one token uses (MoE layers: only its top-K routed experts)."""
  d = cfg.d_model
  embedding = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)  # + untied output table.
  self_layer = attention_params(cfg) + 2 * d  # + two pre-norms; feed-forwards below.
  if cfg.family == "decllm":
    return (embedding + cfg.num_layers * self_layer + d  # + final norm.
            + ffn_params(cfg, "decoder", cfg.num_layers, active))
  if cfg.shared_encoder_decoder:  # Decoder layers own only cross-attention and its pre-norm.
    return (embedding + cfg.num_encoder_layers * self_layer + d
            + ffn_params(cfg, "encoder", cfg.num_encoder_layers, active)
            + cfg.num_decoder_layers * (attention_params(cfg) + d) + d)
  cross_layer = 2 * attention_params(cfg) + 3 * d
  return (embedding + cfg.num_encoder_layers * self_layer + d
          + cfg.num_decoder_layers * cross_layer + d
          + ffn_params(cfg, "encoder", cfg.num_encoder_layers, active)
          + ffn_params(cfg, "decoder", cfg.num_decoder_layers, active))


def abstract_model(cfg: ModelConfig, seed: int = 0) -> nnx.Module:
  """The model with ShapeDtypeStruct leaves: shapes and logical axes, no memory."""
  from t5like.models import build_model
  return nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(seed)))


def built_param_count(cfg: ModelConfig) -> int:
  """Counts the parameters of the abstractly built model (``nnx.eval_shape``, no allocation)."""
  state = nnx.state(abstract_model(cfg), nnx.Param)
  return sum(math.prod(x.shape) for x in jax.tree.leaves(state))
