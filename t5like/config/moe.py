"""Mixture-of-experts feed-forward config (``model.moe``; docs/moe.md), DeepSeek-V3 routing.

``num_experts = 0`` (the default) keeps every feed-forward dense. With routed experts, the layers
chosen by the ``*_layers`` / ``*_first_dense`` fields replace their SwiGLU by
``sum of shared experts(u) + sum over the top-K routed experts of g_i * expert_i(u)``.
"""
from __future__ import annotations

import dataclasses

from t5like.config.schema import ConfigError, check_choice, check_positive

LAYER_PATTERNS = ("all", "every_other", "none")


@dataclasses.dataclass
class MoEConfig:
  """Routed + shared SwiGLU experts; every field is read only when ``num_experts > 0``."""

  num_experts: int = 0  # Routed experts N_r per MoE layer; 0 = no MoE (dense SwiGLU everywhere).
  num_shared_experts: int = 1  # Shared experts N_s every token goes through (0 = none).
  top_k: int = 2  # Routed experts K chosen per token.
  expert_d_ff: int = 512  # SwiGLU hidden width of every expert (routed and shared): moe_d_ff.
  num_groups: int = 1  # Group-limited routing: experts split into G equal groups (1 = off).
  top_groups: int = 1  # Tokens route only within their top M groups (group score = sum of the
  #   group's top-2 selection scores). Ignored when num_groups = 1.
  routed_scaling: float = 1.0  # Gates g_i = s_i / sum_{TopK} s_j times this factor.
  decoder_layers: str = "all"  # Which DecLLM layers / RedLLM decoder layers are MoE (after the
  #   dense prefix): "all", "every_other" (the first after the prefix, then every second), "none".
  decoder_first_dense: int = 0  # That many leading decoder layers stay dense (DeepSeek-V3: 3).
  encoder_layers: str = "all"  # RedLLM encoder: as decoder_layers. Ignored by DecLLM.
  encoder_first_dense: int = 0  # RedLLM encoder: leading dense layers. Ignored by DecLLM.
  bias_update_rate: float = 1e-3  # gamma of the auxiliary-loss-free balancing: after each
  #   optimizer step b_i += gamma * sign(mean load - load_i) (loads over the global batch).
  balance_loss: float = 1e-4  # alpha: weight of the sequence-wise balance loss (0 = off).
  router_z_loss: float = 0.0  # Weight of the router z-loss mean(logsumexp(router logits)^2).
  capacity_factor: float = 0.0  # 0: dropless (every routed token computed). > 0: each expert
  #   takes at most ceil(capacity_factor * tokens * top_k / num_experts) tokens per batch shard,
  #   the rest are dropped (and counted); the path for expert parallelism (mesh.expert > 1).

  @property
  def enabled(self) -> bool:
    return self.num_experts > 0

  def validate(self) -> "MoEConfig":
    check_positive("model.moe.num_experts", self.num_experts, allow_zero=True)
    if not self.enabled:
      return self
    e = self.num_experts
    check_positive("model.moe.num_shared_experts", self.num_shared_experts, allow_zero=True)
    check_positive("model.moe.expert_d_ff", self.expert_d_ff)
    check_positive("model.moe.routed_scaling", self.routed_scaling)
    for name in ("bias_update_rate", "balance_loss", "router_z_loss", "capacity_factor"):
      check_positive(f"model.moe.{name}", getattr(self, name), allow_zero=True)
    check_choice("model.moe.decoder_layers", self.decoder_layers, LAYER_PATTERNS)
    check_choice("model.moe.encoder_layers", self.encoder_layers, LAYER_PATTERNS)
    check_positive("model.moe.decoder_first_dense", self.decoder_first_dense, allow_zero=True)
    check_positive("model.moe.encoder_first_dense", self.encoder_first_dense, allow_zero=True)
    if not 1 <= self.top_k <= e:
      raise ConfigError(f"model.moe.top_k={self.top_k} must be in [1, model.moe.num_experts={e}]")
    g, m = self.num_groups, self.top_groups
    if g < 1 or e % g:
      raise ConfigError(f"model.moe.num_groups={g} must be >= 1 and divide "
                        f"model.moe.num_experts={e} (experts are split into equal groups)")
    if g > 1:
      if e // g < 2:
        raise ConfigError(f"group-limited routing scores a group by its top-2 experts; "
                          f"model.moe.num_experts={e} / model.moe.num_groups={g} leaves fewer "
                          "than 2 per group: use fewer groups")
      if not 1 <= m <= g:
        raise ConfigError(f"model.moe.top_groups={m} must be in [1, model.moe.num_groups={g}]")
      if self.top_k > m * (e // g):
        raise ConfigError(f"model.moe.top_k={self.top_k} exceeds the {m * (e // g)} experts in "
                          f"the top {m} groups; raise model.moe.top_groups or lower top_k")
    return self


def moe_layer_flags(num_layers: int, pattern: str, first_dense: int) -> tuple[bool, ...]:
  """Which of ``num_layers`` layers are MoE: none of the first ``first_dense``, then per
  ``pattern`` ("all", "every_other" starting with the first layer after the prefix, "none")."""
  flags = []
  for i in range(num_layers):
    j = i - first_dense
    flags.append(j >= 0 and (pattern == "all" or (pattern == "every_other" and j % 2 == 0)))
  return tuple(flags)


def check_layer_counts(moe: MoEConfig, family: str, dec_layers: int, enc_layers: int) -> None:
  """Rejects dense prefixes longer than their stack, and an MoE config with no MoE layer."""
  if not moe.enabled:
    return
  stacks = [("decoder", dec_layers)] + ([("encoder", enc_layers)] if family == "redllm" else [])
  any_moe = False
  for name, n in stacks:
    first = getattr(moe, f"{name}_first_dense")
    if first > n:
      raise ConfigError(f"model.moe.{name}_first_dense={first} exceeds the {n} {name} layers")
    any_moe |= any(moe_layer_flags(n, getattr(moe, f"{name}_layers"), first))
  if not any_moe:
    raise ConfigError("model.moe.num_experts > 0 but no layer is MoE: check "
                      "model.moe.decoder_layers / encoder_layers and the *_first_dense counts "
                      "(or set model.moe.num_experts=0 for a dense model)")


def stack_moe_flags(moe: MoEConfig, stack: str, num_layers: int) -> tuple[bool, ...]:
  """Per layer of the ``stack`` ("decoder": DecLLM's layers or RedLLM's decoder; "encoder"),
  whether it is MoE (all False when MoE is off)."""
  if not moe.enabled:
    return (False,) * num_layers
  return moe_layer_flags(num_layers, getattr(moe, f"{stack}_layers"),
                         getattr(moe, f"{stack}_first_dense"))


def tiny_moe() -> MoEConfig:
  """The tiny MoE feed-forward (configs/tiny_*_moe*.py): 8 routed experts of width 128, top-3, plus
  1 shared expert, so a token uses (3 + 1) x 128 = 512 hidden units, the dense tiny model's d_ff:
  equal active feed-forward parameters (plus the 8-column router), 2.25x them in total."""
  return MoEConfig(num_experts=8, num_shared_experts=1, top_k=3, expert_d_ff=128,
                   bias_update_rate=1e-3, balance_loss=1e-4, router_z_loss=0.0)


def paper_moe(d_ff: int) -> MoEConfig:
  """The paper-scale MoE feed-forward at the dense model's active width (docs/moe.md).

  DeepSeek-V3's recipe, scaled down: many fine-grained routed experts plus one shared expert,
  the first layer of each stack dense, device-limited (group) routing. 64 routed experts of width
  d_ff / 8, top-7, plus 1 shared: (7 + 1) * d_ff / 8 = d_ff hidden units per token, the dense
  model's, so active parameters match the paper's dense sizes; 8 groups (one per expert-parallel
  shard at expert=8), top-4 groups per token. Each MoE layer holds 65 / 8 = 8.1x the dense FFN.
  """
  return MoEConfig(num_experts=64, num_shared_experts=1, top_k=7, expert_d_ff=d_ff // 8,
                   num_groups=8, top_groups=4, routed_scaling=1.0, decoder_first_dense=1,
                   encoder_first_dense=1, bias_update_rate=1e-3, balance_loss=1e-4)
