"""Model architecture config shared by DecLLM and RedLLM (docs/paper.md §1)."""
from __future__ import annotations

import dataclasses

from t5like.config.moe import MoEConfig, check_layer_counts
from t5like.config.schema import ConfigError, check_choice, check_positive

FAMILIES = ("decllm", "redllm")
DECODER_ATTENTION = ("causal", "prefix")
MIXED_ATTENTION = ("none", "per_head", "per_layer")
ATTN_OUT_NORM_SCOPES = ("per_head", "all_heads")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch", "attention_out")
DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_IMPLS = ("auto", "reference", "splash", "cudnn")


@dataclasses.dataclass
class ModelConfig:
  """Architecture of one model; every field is used by both families unless its comment says so."""

  family: str = "decllm"  # "decllm" (decoder-only) or "redllm" (revisited encoder-decoder).
  vocab_size: int = 32768  # Size of the (tied) token embedding and of the output logits.
  d_model: int = 1024  # Residual stream width d.
  num_heads: int = 8  # Query heads per attention layer.
  num_kv_heads: int = 0  # Key/value heads (grouped-query attention); 0 means num_heads (plain MHA).
  head_dim: int = 128  # Per-head width d_h (even: RoPE rotates pairs).
  d_ff: int = 4096  # SwiGLU hidden width (paper: 4 * d_model).
  num_layers: int = 8  # DecLLM: decoder layers. Ignored by RedLLM.
  num_encoder_layers: int = 3  # RedLLM: encoder layers. Ignored by DecLLM.
  num_decoder_layers: int = 3  # RedLLM: decoder layers. Ignored by DecLLM.
  decoder_attention: str = "causal"  # DecLLM: "causal", or "prefix" (bidirectional over the
  #   positions flagged by the `decoder_causal_attention` feature, causal after: DecLLM + BiAttn).
  mixed_attention: str = "none"  # Replace bidirectional attention (RedLLM encoder, DecLLM prefix)
  #   by triangular maps: "per_head" (first half of heads forward, second half backward) or
  #   "per_layer" (even layers forward, odd layers backward); "none" keeps full bidirectional.
  qkv_norm: bool = True  # RMSNorm (learned scale over head_dim) on Q, K and V of every attention.
  v_norm: bool = True  # With qkv_norm: norm V too (the paper); False norms Q and K only (Qwen3).
  attn_out_norm: bool = False  # RedLLM's extra norm on the attention output, before the output
  #   projection (paper: Attn_Red = LN(Attn_Dec)). Paper setting: True for RedLLM, False for DecLLM.
  attn_out_norm_scope: str = "per_head"  # "per_head": RMSNorm over head_dim of each head (our
  #   reading of the paper); "all_heads": RMSNorm over the concatenated heads (num_heads*head_dim).
  rope_max_wavelength: float = 10_000.0  # RoPE base wavelength.
  shared_encoder_decoder: bool = False  # RedLLM: the decoder layers reuse the encoder layers'
  #   self-attention, MLP and their pre-norms (T5's "encoder-decoder, shared"); each decoder
  #   layer keeps its own cross-attention. Needs num_encoder_layers == num_decoder_layers.
  cross_attention_rope: bool = True  # RedLLM: rotate cross-attention queries/keys by their positions.
  continuous_positions: bool = True  # RedLLM: decoder positions continue after the encoder length
  #   (k..k+m-1) instead of restarting at 0. Read by the data pipeline, which makes the positions.
  norm_eps: float = 1e-6  # Epsilon of every RMSNorm.
  tie_embeddings: bool = True  # The output layer is the input embedding table (the paper); False
  #   gives the output its own [vocab, embed] table (Llama / Qwen3 checkpoints, import_hf).
  scale_logits: bool = True  # logits = (x / sqrt(d_model)) @ table^T, T5's tied convention (the
  #   paper); False: x @ table^T, the standard output layer of Llama / Qwen3 checkpoints.
  dropout_rate: float = 0.0  # Dropout on residual branches and attention probabilities (paper: 0.0
  #   pretraining, 0.05 instruction tuning).
  dtype: str = "bfloat16"  # Compute dtype of matmuls and activations.
  param_dtype: str = "float32"  # Storage dtype of parameters.
  scan_layers: bool = True  # Run the layer stack with lax.scan (one compiled layer) instead of a
  #   Python loop. Parameters are stacked [layers, ...] either way, so checkpoints are identical.
  remat_policy: str = "none"  # Rematerialisation per layer: "none", "full" (save nothing),
  #   "dots" (save matmul outputs), "dots_no_batch" (save weight matmuls), "attention_out".
  attention_impl: str = "auto"  # The attention core: "auto" (by the mesh's platform: splash on
  #   TPU, cudnn on Hopper+ GPUs where they serve the config, else reference; logged with the
  #   reason, t5like/ops/__init__.py), "reference" (any device; builds the [batch, heads, q, kv]
  #   mask), "splash" (TPU Pallas kernel, block-sparse masks + segment ids; interpret mode on
  #   CPU) or "cudnn" (NVIDIA GPU fused kernel; causal/full masks, packed rows through cuDNN's
  #   packed layout on Hopper or newer; docs/gpus.md). Decoding over the KV cache: reference.
  max_segments_per_row: int = 0  # attention_impl="cudnn": the static number of packed segments
  #   a row may hold (cuDNN's packed layout takes per-segment offsets for that many slots; each
  #   slot adds saved softmax statistics). 1 = one example per row, the plain cuDNN call (Hopper
  #   not needed). 0 = auto: 1 with data.pack=False (set by Config.validate), else length // 32
  #   (2048 -> 64). A batch with more segments in a row is a clear error, never dropped.
  attention_logit_soft_cap: float = 0.0  # > 0: attention scores become cap * tanh(score / cap)
  #   before the softmax (Gemma 2's soft cap); 0: plain scores (the paper). Splash computes it;
  #   cuDNN has no soft cap and refuses it.
  moe: MoEConfig = dataclasses.field(default_factory=MoEConfig)  # Mixture-of-experts FFNs
  #   (docs/moe.md); off by default (moe.num_experts = 0).

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  def validate(self) -> "ModelConfig":
    check_choice("model.family", self.family, FAMILIES)
    check_choice("model.decoder_attention", self.decoder_attention, DECODER_ATTENTION)
    check_choice("model.mixed_attention", self.mixed_attention, MIXED_ATTENTION)
    check_choice("model.attn_out_norm_scope", self.attn_out_norm_scope, ATTN_OUT_NORM_SCOPES)
    check_choice("model.remat_policy", self.remat_policy, REMAT_POLICIES)
    check_choice("model.dtype", self.dtype, DTYPES)
    check_choice("model.attention_impl", self.attention_impl, ATTENTION_IMPLS)
    check_positive("model.attention_logit_soft_cap", self.attention_logit_soft_cap,
                   allow_zero=True)
    self._check_attention_impl()
    self.moe.validate()
    if self.moe.enabled and self.shared_encoder_decoder:
      raise ConfigError("model.moe with model.shared_encoder_decoder=True is not supported yet; "
                        "set model.moe.num_experts=0 or model.shared_encoder_decoder=False")
    check_layer_counts(self.moe, self.family, self.num_layers if self.family == "decllm" else
                       self.num_decoder_layers, self.num_encoder_layers)
    check_choice("model.param_dtype", self.param_dtype, DTYPES)
    for name in ("vocab_size", "d_model", "num_heads", "head_dim", "d_ff"):
      check_positive(f"model.{name}", getattr(self, name))
    check_positive("model.num_kv_heads", self.num_kv_heads, allow_zero=True)
    check_positive("model.max_segments_per_row", self.max_segments_per_row, allow_zero=True)
    check_positive("model.norm_eps", self.norm_eps)
    check_positive("model.rope_max_wavelength", self.rope_max_wavelength)
    if self.head_dim % 2:
      raise ConfigError(
          f"model.head_dim={self.head_dim} is odd; RoPE rotates pairs of features, so head_dim "
          "must be even")
    if self.num_heads % self.kv_heads:
      raise ConfigError(
          f"model.num_heads={self.num_heads} is not a multiple of model.num_kv_heads="
          f"{self.kv_heads}; each key/value head must serve the same number of query heads")
    if self.num_heads * self.head_dim < 1:
      raise ConfigError("model.num_heads * model.head_dim must be positive")
    if self.mixed_attention == "per_head" and self.num_heads % 2:
      raise ConfigError(
          f"model.mixed_attention='per_head' splits heads into forward and backward halves; "
          f"model.num_heads={self.num_heads} must be even")
    if not self.v_norm and not self.qkv_norm:
      raise ConfigError("model.v_norm=False removes the V norm of model.qkv_norm=True; with "
                        "model.qkv_norm=False there is no V norm to remove (leave v_norm=True)")
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ConfigError(f"model.dropout_rate must be in [0, 1), got {self.dropout_rate}")
    if self.family == "decllm":
      check_positive("model.num_layers", self.num_layers)
      if self.shared_encoder_decoder:
        raise ConfigError("model.shared_encoder_decoder is a RedLLM option (DecLLM has one stack)")
    else:
      if self.num_encoder_layers < 1 or self.num_decoder_layers < 1:
        raise ConfigError(
            "RedLLM needs at least one encoder and one decoder layer; got "
            f"model.num_encoder_layers={self.num_encoder_layers}, "
            f"model.num_decoder_layers={self.num_decoder_layers}")
      if self.shared_encoder_decoder and self.num_encoder_layers != self.num_decoder_layers:
        raise ConfigError(
            "model.shared_encoder_decoder=True runs decoder layer i with encoder layer i's "
            f"weights: set model.num_encoder_layers ({self.num_encoder_layers}) equal to "
            f"model.num_decoder_layers ({self.num_decoder_layers})")
      if self.decoder_attention != "causal":
        raise ConfigError(
            "model.decoder_attention='prefix' is a DecLLM option; RedLLM's encoder is already "
            "bidirectional over the input. Use model.decoder_attention='causal' with RedLLM")
    return self

  def _check_attention_impl(self, impl: str | None = None) -> None:
    """ConfigError where the fused core ``impl`` (default: model.attention_impl) cannot serve
    this config (``ops.choose_attention`` asks it for ``auto``)."""
    impl = impl or self.attention_impl
    if impl in ("auto", "reference"):
      return
    if self.dropout_rate > 0:
      raise ConfigError(f"model.attention_impl={impl!r} has no dropout on attention "
                        "probabilities; use model.dropout_rate=0 or model.attention_impl="
                        "'reference'")
    if impl == "cudnn" and self.attention_logit_soft_cap:
      raise ConfigError("model.attention_impl='cudnn' has no attention_logit_soft_cap (cuDNN "
                        "computes plain scores); use model.attention_impl='reference' on GPU "
                        "or model.attention_logit_soft_cap=0")
    bidir = self.family == "redllm" or self.decoder_attention == "prefix"
    if impl == "splash" and self.decoder_attention == "prefix" and self.mixed_attention != "none":
      raise ConfigError("model.attention_impl='splash' has no mixed forward/backward PrefixLM "
                        "mask; use model.attention_impl='reference' with model.mixed_attention="
                        f"{self.mixed_attention!r}")
    if impl == "cudnn" and (self.decoder_attention == "prefix"
                            or (bidir and self.mixed_attention != "none")):
      raise ConfigError("model.attention_impl='cudnn' expresses causal and full attention only "
                        "(no prefix or mixed forward/backward masks); use 'reference' (GPU) or "
                        "'splash' (TPU)")
    if impl == "cudnn" and self.dtype not in ("bfloat16", "float16"):  # cuDNN: fp16/bf16/fp8.
      raise ConfigError(f"model.attention_impl='cudnn' needs model.dtype='bfloat16' or "
                        f"'float16' (cuDNN's fused attention takes no {self.dtype} inputs); got "
                        f"model.dtype={self.dtype!r}. Use model.attention_impl='reference' for float32")
    if impl == "cudnn" and (self.head_dim % 8 or self.head_dim > 256):
      raise ConfigError("model.attention_impl='cudnn' needs model.head_dim a multiple of 8 and "
                        f"<= 256 (<= 128 before Hopper); got {self.head_dim}")


# The paper's sizes (docs/paper.md §1: d_h = 128, FFN = 4d, vocab 32,768, all embeddings tied).
# name -> (d_model, num_heads, DecLLM layers, RedLLM encoder layers, RedLLM decoder layers)
PAPER_SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "150m": (1024, 8, 8, 3, 3),
    "1b": (2048, 16, 16, 7, 7),
    "2b": (2560, 20, 20, 9, 9),
    "4b": (3072, 24, 24, 10, 10),
    "8b": (4096, 32, 32, 14, 14),
}


def paper_model(family: str, size: str) -> ModelConfig:
  """The paper's architecture for ``family`` ("decllm"/"redllm") at ``size`` (e.g. "1b")."""
  if size not in PAPER_SIZES:
    raise ConfigError(f"unknown paper size {size!r}; valid sizes: {', '.join(PAPER_SIZES)}")
  check_choice("family", family, FAMILIES)
  d, h, l_dec, l_enc, l_red_dec = PAPER_SIZES[size]
  return ModelConfig(
      family=family, vocab_size=32768, d_model=d, num_heads=h, head_dim=128, d_ff=4 * d,
      num_layers=l_dec, num_encoder_layers=l_enc, num_decoder_layers=l_red_dec,
      attn_out_norm=(family == "redllm")).validate()
