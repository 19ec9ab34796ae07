"""PyTorch DecLLM and RedLLM for Hugging Face ``transformers`` (written for t5like, arXiv 2510.26622).

Shipped with every model that ``python -m t5like.tools.export_hf`` writes; load with
``trust_remote_code=True``:

- ``DecLLMForCausalLM`` (``AutoModelForCausalLM``): pre-norm decoder, RMSNorm, SwiGLU, RoPE, per-head
  RMSNorm on Q, K (and V), tied embedding with T5's ``x / sqrt(d)`` output scale. With
  ``decoder_attention="prefix"`` the positions flagged by ``prefix_mask`` attend to each other
  bidirectionally; ``generate()`` flags the prompt.
- ``RedLLMForConditionalGeneration`` (``AutoModelForSeq2SeqLM``): bidirectional encoder; decoder
  with causal self-attention and cross-attention, RoPE in all three with continuous positions
  (decoder position = the row's encoder length + t; cross-attention queries rotate by decoder
  positions, keys by encoder positions) and an RMSNorm on the attention output.

Every computation follows t5like's JAX model (``t5like/models``): exported logits equal the JAX
model's in float32 (``tests/hf``). Attention is computed here in plain PyTorch (no fused
backends), masks from ``attention_mask`` (1 = token, 0 = padding, left or right). Without one,
DecLLM's ``forward`` attends over every position and its ``generate()`` infers the mask from the
ids (the last of a row's leading zeros is the BOS, the zeros before it left padding;
``mask_without_bos_padding``); RedLLM's encoder masks id 0 (padding, as in t5like).
"""
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import (BaseModelOutput, BaseModelOutputWithPast,
                                           CausalLMOutputWithPast, Seq2SeqLMOutput)

from .configuration_t5like import T5LikeConfig

NEG_INF = -0.7 * torch.finfo(torch.float32).max  # As t5like: finite, fully masked rows stay 0.


def _output(cls, **fields):
  """``cls(**fields)`` with the cache under the name this transformers release uses."""
  names = getattr(cls, "__dataclass_fields__", {})
  if "cache" in fields and "cache" not in names:
    fields["past_key_values"] = fields.pop("cache")
  return cls(**fields)


def _cache_arg(cache, kwargs):
  """The KV cache, given as ``cache`` (transformers >= 5.2x) or ``past_key_values``."""
  return cache if cache is not None else kwargs.pop("past_key_values", None)


class RMSNorm(nn.Module):
  """``x * rsqrt(mean(x^2) + eps) * weight`` over the last axis, in float32."""

  def __init__(self, size, eps):
    super().__init__()
    self.weight = nn.Parameter(torch.ones(size))
    self.eps = eps

  def forward(self, x):
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
    return (y * self.weight.float()).to(x.dtype)


def rope(x, positions, max_wavelength):
  """Rotates feature pairs (i, i + d/2) of ``x [b, heads, t, d]`` by ``positions [b, t]``."""
  half = x.shape[-1] // 2
  inv_freq = max_wavelength ** (-torch.arange(half, dtype=torch.float32, device=x.device)
                                * 2.0 / x.shape[-1])
  angle = positions.float()[:, None, :, None] * inv_freq  # [b, 1, t, half]
  sin, cos = angle.sin(), angle.cos()
  x32 = x.float()
  x1, x2 = x32[..., :half], x32[..., half:]
  return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def mask_without_bos_padding(input_ids, bos_id):
  """The attention mask of DecLLM rows ``[pad...] + [BOS] + prompt`` where padding and BOS share
  one id (seqio's 0): in each row's leading run of ``bos_id``, the last one is the BOS (1) and the
  ones before it are left padding (0); any later ``bos_id`` (right padding; text never encodes to
  it) is padding too. A row that does not start with ``bos_id`` has no padding in front."""
  is_id = input_ids == bos_id
  leading = is_id.long().cumprod(-1).bool()  # The leading run of bos_id.
  run = leading.sum(-1, keepdim=True)  # Its length; the BOS sits at run - 1.
  bos = torch.arange(input_ids.shape[-1], device=input_ids.device)[None] == run - 1
  return (~is_id | bos).long()


def positions_from_mask(mask, length):
  """Positions counted from each row's first token (left padding allowed): the last
  ``length`` columns of ``cumsum(mask) - 1``, 0 on padding."""
  return (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -length:]


class Attention(nn.Module):
  """Multi-head (grouped-query) attention with per-head Q/K/V norms and RoPE; optional RMSNorm on
  the attention output (RedLLM) before the output projection."""

  def __init__(self, config, layer_idx, use_rope=True, is_cross=False):
    super().__init__()
    c = config
    self.config, self.layer_idx, self.use_rope, self.is_cross = c, layer_idx, use_rope, is_cross
    self.heads, self.kv_heads, self.head_dim = c.num_heads, c.num_kv_heads or c.num_heads, c.head_dim
    self.q_proj = nn.Linear(c.d_model, self.heads * c.head_dim, bias=False)
    self.k_proj = nn.Linear(c.d_model, self.kv_heads * c.head_dim, bias=False)
    self.v_proj = nn.Linear(c.d_model, self.kv_heads * c.head_dim, bias=False)
    self.o_proj = nn.Linear(self.heads * c.head_dim, c.d_model, bias=False)
    if c.qkv_norm:
      self.q_norm = RMSNorm(c.head_dim, c.norm_eps)
      self.k_norm = RMSNorm(c.head_dim, c.norm_eps)
      if c.v_norm:
        self.v_norm = RMSNorm(c.head_dim, c.norm_eps)
    if c.attn_out_norm:
      per_head = c.attn_out_norm_scope == "per_head"
      self.o_norm = RMSNorm(c.head_dim if per_head else self.heads * c.head_dim, c.norm_eps)

  def _heads(self, x, n):  # [b, t, n * d] -> [b, n, t, d]
    b, t, _ = x.shape
    return x.view(b, t, n, self.head_dim).transpose(1, 2)

  def project_kv(self, x_kv, kv_positions):
    k = self._heads(self.k_proj(x_kv), self.kv_heads)
    v = self._heads(self.v_proj(x_kv), self.kv_heads)
    if self.config.qkv_norm:
      k = self.k_norm(k)
      v = self.v_norm(v) if self.config.v_norm else v
    if self.use_rope:
      k = rope(k, kv_positions, self.config.rope_max_wavelength)
    return k, v

  def forward(self, x, q_positions, mask, x_kv=None, kv_positions=None, cache=None):
    """x [b, t, d]; mask bool [b, 1, t, s] (True = may attend); returns [b, t, d]."""
    q = self._heads(self.q_proj(x), self.heads)
    if self.config.qkv_norm:
      q = self.q_norm(q)
    if self.use_rope:
      q = rope(q, q_positions, self.config.rope_max_wavelength)
    if self.is_cross:
      if cache is not None and cache.is_updated.get(self.layer_idx):
        layer = cache.cross_attention_cache.layers[self.layer_idx]
        k, v = layer.keys, layer.values
      else:
        k, v = self.project_kv(x_kv, kv_positions)
        if cache is not None:
          k, v = cache.cross_attention_cache.update(k, v, self.layer_idx)
          cache.is_updated[self.layer_idx] = True
    else:
      k, v = self.project_kv(x, q_positions)
      if cache is not None:
        k, v = cache.update(k, v, self.layer_idx)
    group = self.heads // self.kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q * self.head_dim ** -0.5, k.transpose(-1, -2)).float()
    scores = scores + torch.where(mask, 0.0, NEG_INF)
    probs = torch.softmax(scores, dim=-1) * mask.any(-1, keepdim=True)
    out = torch.matmul(probs.to(v.dtype), v).transpose(1, 2)  # [b, t, heads, d]
    b, t = out.shape[:2]
    if self.config.attn_out_norm:
      if self.config.attn_out_norm_scope == "per_head":
        out = self.o_norm(out)
      else:
        out = self.o_norm(out.reshape(b, t, -1))
    return self.o_proj(out.reshape(b, t, -1))


class MLP(nn.Module):
  """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

  def __init__(self, config):
    super().__init__()
    self.gate_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
    self.up_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
    self.down_proj = nn.Linear(config.d_ff, config.d_model, bias=False)

  def forward(self, x):
    return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SelfAttentionLayer(nn.Module):
  """DecLLM layer / RedLLM encoder layer: ``x + Attn(Norm(x))``, ``x + MLP(Norm(x))``."""

  def __init__(self, config, layer_idx):
    super().__init__()
    self.input_layernorm = RMSNorm(config.d_model, config.norm_eps)
    self.self_attn = Attention(config, layer_idx)
    self.post_attention_layernorm = RMSNorm(config.d_model, config.norm_eps)
    self.mlp = MLP(config)

  def forward(self, x, positions, mask, cache=None):
    x = x + self.self_attn(self.input_layernorm(x), positions, mask, cache=cache)
    return x + self.mlp(self.post_attention_layernorm(x))


class CrossAttentionLayer(nn.Module):
  """RedLLM decoder layer: causal self-attention, cross-attention to the encoder, MLP."""

  def __init__(self, config, layer_idx):
    super().__init__()
    self.self_attn_layernorm = RMSNorm(config.d_model, config.norm_eps)
    self.self_attn = Attention(config, layer_idx)
    self.cross_attn_layernorm = RMSNorm(config.d_model, config.norm_eps)
    self.cross_attn = Attention(config, layer_idx, use_rope=config.cross_attention_rope,
                                is_cross=True)
    self.mlp_layernorm = RMSNorm(config.d_model, config.norm_eps)
    self.mlp = MLP(config)

  def forward(self, x, positions, mask, encoded, enc_positions, cross_mask, cache=None):
    self_cache = cache.self_attention_cache if cache is not None else None
    x = x + self.self_attn(self.self_attn_layernorm(x), positions, mask, cache=self_cache)
    x = x + self.cross_attn(self.cross_attn_layernorm(x), positions, cross_mask, encoded,
                            enc_positions, cache=cache)
    return x + self.mlp(self.mlp_layernorm(x))


class T5LikePreTrainedModel(PreTrainedModel):
  config_class = T5LikeConfig
  base_model_prefix = "model"
  supports_gradient_checkpointing = False
  _no_split_modules = ["SelfAttentionLayer", "CrossAttentionLayer"]

  @torch.no_grad()
  def _init_weights(self, module):
    """t5like's initialisers: fan-in normal kernels, N(0, 1) embedding, unit norm scales."""
    if isinstance(module, nn.Linear):
      module.weight.normal_(0.0, module.in_features ** -0.5)
    elif isinstance(module, nn.Embedding):
      module.weight.normal_(0.0, 1.0)
    elif isinstance(module, RMSNorm):
      module.weight.fill_(1.0)


def _logits(config, hidden, embed, lm_head):
  if config.scale_logits:
    hidden = hidden * config.d_model ** -0.5
  weight = embed.weight if lm_head is None else lm_head.weight
  return F.linear(hidden, weight).float()


def _loss(logits, labels):
  return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                         ignore_index=-100)


class DecLLMModel(T5LikePreTrainedModel):
  """The DecLLM decoder stack; returns the final-normed hidden states."""

  def __init__(self, config):
    super().__init__(config)
    self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
    self.layers = nn.ModuleList([SelfAttentionLayer(config, i) for i in range(config.num_layers)])
    self.norm = RMSNorm(config.d_model, config.norm_eps)
    self.post_init()

  def get_input_embeddings(self):
    return self.embed_tokens

  def set_input_embeddings(self, value):
    self.embed_tokens = value

  def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
              inputs_embeds=None, use_cache=None, prefix_mask=None, **kwargs):
    """``prefix_mask`` [b, t] (prefix models): 1 on the positions that attend bidirectionally to
    each other (the prompt; t5like's ``decoder_causal_attention``)."""
    cache = _cache_arg(cache, kwargs)
    x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
    b, t = x.shape[:2]
    if use_cache and cache is None:
      cache = DynamicCache(config=self.config)
    past = cache.get_seq_length() if cache is not None else 0
    if attention_mask is None:
      attention_mask = torch.ones(b, past + t, dtype=torch.long, device=x.device)
    if attention_mask.dim() != 2:
      raise ValueError("t5like models take a 2-D attention_mask [batch, length] (1 = token)")
    if position_ids is None:
      position_ids = positions_from_mask(attention_mask, t)
    valid = attention_mask.bool()
    q_idx = torch.arange(past, past + t, device=x.device)[:, None]
    allowed = torch.arange(past + t, device=x.device)[None, :] <= q_idx  # [t, s] causal
    allowed = allowed[None] & valid[:, None, :]
    if self.config.decoder_attention == "prefix" and prefix_mask is not None:
      if past:
        raise ValueError("prefix_mask applies to the first (uncached) forward only")
      p = prefix_mask.bool()
      allowed = allowed | (p[:, :, None] & p[:, None, :] & valid[:, None, :])
    mask = (allowed & valid[:, -t:, None])[:, None]  # Padding queries attend to nothing.
    for layer in self.layers:
      x = layer(x, position_ids, mask, cache=cache)
    return _output(BaseModelOutputWithPast, last_hidden_state=self.norm(x), cache=cache)


class DecLLMForCausalLM(T5LikePreTrainedModel, GenerationMixin):

  def __init__(self, config):
    super().__init__(config)
    self.model = DecLLMModel(config)
    self.lm_head = None if config.tie_embeddings else nn.Linear(config.d_model,
                                                                 config.vocab_size, bias=False)
    self.post_init()

  def get_input_embeddings(self):
    return self.model.embed_tokens

  def set_input_embeddings(self, value):
    self.model.embed_tokens = value

  def get_output_embeddings(self):
    return self.lm_head

  def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
              inputs_embeds=None, labels=None, use_cache=None, prefix_mask=None,
              logits_to_keep=0, return_dict=None, **kwargs):
    cache = _cache_arg(cache, kwargs)
    out = self.model(input_ids, attention_mask, position_ids, cache, inputs_embeds, use_cache,
                     prefix_mask)
    cache = out["cache"] if "cache" in out else out.get("past_key_values")
    hidden = out.last_hidden_state
    if logits_to_keep:
      hidden = hidden[:, -logits_to_keep:]
    logits = _logits(self.config, hidden, self.model.embed_tokens, self.lm_head)
    loss = None
    if labels is not None:  # Labels aligned with input_ids, shifted here (transformers' rule).
      loss = _loss(logits[:, :-1], labels[:, 1:])
    return _output(CausalLMOutputWithPast, loss=loss, logits=logits,
                   cache=cache if use_cache else None)

  def _prepare_attention_mask_for_generation(self, inputs_tensor, *args, **kwargs):
    """The mask ``generate()`` infers when the caller passes none. transformers' own rule,
    ``input_ids != pad_token_id``, would mask the BOS, which is the pad id (0) here: the BOS is
    told from left padding as the last of each row's leading zeros instead."""
    pad, bos = self.config.pad_token_id, self.config.bos_token_id
    if (pad is None or pad != bos or inputs_tensor.dim() != 2
        or inputs_tensor.dtype not in (torch.int32, torch.int64)):
      return super()._prepare_attention_mask_for_generation(inputs_tensor, *args, **kwargs)
    return mask_without_bos_padding(inputs_tensor, bos)

  def prepare_inputs_for_generation(self, *args, **kwargs):
    inputs = super().prepare_inputs_for_generation(*args, **kwargs)
    cache = inputs.get("cache", inputs.get("past_key_values"))
    first = cache is None or cache.get_seq_length() == 0
    if self.config.decoder_attention == "prefix" and first:  # The prompt is the prefix.
      mask = inputs.get("attention_mask")  # Left out by generate() where there is no padding.
      inputs["prefix_mask"] = torch.ones_like(inputs["input_ids"]) if mask is None else mask
    return inputs


def _encoder_mask(config, input_ids, x):
  """RedLLM's encoder mask when none is given: every id but padding (t5like's encoder reads id 0
  as padding; a prompt never holds it, the tokenizer adds no BOS)."""
  if input_ids is None:
    return torch.ones(x.shape[:2], dtype=torch.long, device=x.device)
  return (input_ids != config.pad_token_id).long()


class RedLLMEncoder(T5LikePreTrainedModel):
  """Bidirectional encoder over the input; returns the final-normed states."""

  def __init__(self, config, embed_tokens):
    super().__init__(config)
    self.__dict__["_embed"] = embed_tokens  # Shared with the decoder, owned by RedLLMModel.
    self.layers = nn.ModuleList([SelfAttentionLayer(config, i)
                                 for i in range(config.num_encoder_layers)])
    self.norm = RMSNorm(config.d_model, config.norm_eps)

  def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, **kwargs):
    x = self._embed(input_ids) if inputs_embeds is None else inputs_embeds
    if attention_mask is None:
      attention_mask = _encoder_mask(self.config, input_ids, x)
    valid = attention_mask.bool()
    mask = (valid[:, :, None] & valid[:, None, :])[:, None]
    positions = positions_from_mask(attention_mask, x.shape[1])
    for layer in self.layers:
      x = layer(x, positions, mask)
    return BaseModelOutput(last_hidden_state=self.norm(x))


class RedLLMDecoder(nn.Module):

  def __init__(self, config):
    super().__init__()
    self.config = config
    self.layers = nn.ModuleList([CrossAttentionLayer(config, i)
                                 for i in range(config.num_decoder_layers)])
    self.norm = RMSNorm(config.d_model, config.norm_eps)

  def forward(self, x, encoded, encoder_attention_mask, decoder_attention_mask=None,
              position_ids=None, cache=None):
    b, t = x.shape[:2]
    past = cache.get_seq_length() if cache is not None else 0
    enc_valid = encoder_attention_mask.bool()
    enc_positions = positions_from_mask(encoder_attention_mask, encoded.shape[1])
    if position_ids is None:  # Continuous positions: the row's encoder length + t.
      position_ids = torch.arange(past, past + t, device=x.device)[None].expand(b, t)
      if self.config.continuous_positions:
        position_ids = position_ids + enc_valid.sum(-1, keepdim=True)
    if decoder_attention_mask is None:
      decoder_attention_mask = torch.ones(b, past + t, dtype=torch.long, device=x.device)
    valid = decoder_attention_mask.bool()
    q_idx = torch.arange(past, past + t, device=x.device)[:, None]
    causal = torch.arange(past + t, device=x.device)[None, :] <= q_idx
    q_valid = valid[:, -t:, None]
    mask = (causal[None] & valid[:, None, :] & q_valid)[:, None]
    cross_mask = (enc_valid[:, None, :] & q_valid)[:, None]
    for layer in self.layers:
      x = layer(x, position_ids, mask, encoded, enc_positions, cross_mask, cache=cache)
    return self.norm(x)


class RedLLMModel(T5LikePreTrainedModel):

  def __init__(self, config):
    super().__init__(config)
    self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
    self.encoder = RedLLMEncoder(config, self.embed_tokens)
    self.decoder = RedLLMDecoder(config)
    self.post_init()

  def get_input_embeddings(self):
    return self.embed_tokens

  def get_encoder(self, modality=None):
    return self.encoder


class RedLLMForConditionalGeneration(T5LikePreTrainedModel, GenerationMixin):

  def __init__(self, config):
    super().__init__(config)
    self.model = RedLLMModel(config)
    self.lm_head = None if config.tie_embeddings else nn.Linear(config.d_model,
                                                                 config.vocab_size, bias=False)
    self.post_init()

  def get_input_embeddings(self):
    return self.model.embed_tokens

  def get_output_embeddings(self):
    return self.lm_head

  def get_encoder(self, modality=None):
    return self.model.encoder

  def _maybe_prepare_encoder_kwargs_for_generation(self, inputs_tensor, model_kwargs, *args,
                                                    **kwargs):
    """``generate()`` without a mask: padding masked in the encoder and in every decoding step's
    cross-attention (transformers infers no mask for encoder-decoders)."""
    if (model_kwargs.get("attention_mask") is None and model_kwargs.get("encoder_outputs") is None
        and inputs_tensor.dim() == 2 and not inputs_tensor.is_floating_point()):
      model_kwargs["attention_mask"] = _encoder_mask(self.config, inputs_tensor, inputs_tensor)
    return super()._maybe_prepare_encoder_kwargs_for_generation(inputs_tensor, model_kwargs,
                                                                *args, **kwargs)

  def prepare_decoder_input_ids_from_labels(self, labels):
    """Labels shifted right behind ``decoder_start_token_id`` (-100 read as padding)."""
    start = torch.full_like(labels[:, :1], self.config.decoder_start_token_id)
    shifted = torch.cat([start, labels[:, :-1]], dim=1)
    return shifted.masked_fill(shifted == -100, self.config.pad_token_id)

  def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None,
              decoder_attention_mask=None, decoder_position_ids=None, encoder_outputs=None,
              cache=None, inputs_embeds=None, labels=None, use_cache=None, return_dict=None,
              **kwargs):
    cache = _cache_arg(cache, kwargs)
    if encoder_outputs is None:
      encoder_outputs = self.model.encoder(input_ids, attention_mask, inputs_embeds)
    encoded = encoder_outputs[0] if isinstance(encoder_outputs, tuple) else \
        encoder_outputs.last_hidden_state
    if attention_mask is None:
      attention_mask = _encoder_mask(self.config, input_ids, encoded)
    if decoder_input_ids is None:
      if labels is None:
        raise ValueError("RedLLM needs decoder_input_ids or labels")
      decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
    if use_cache and cache is None:
      cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache())
    x = self.model.embed_tokens(decoder_input_ids)
    hidden = self.model.decoder(x, encoded, attention_mask, decoder_attention_mask,
                                decoder_position_ids, cache)
    logits = _logits(self.config, hidden, self.model.embed_tokens, self.lm_head)
    loss = _loss(logits, labels) if labels is not None else None
    return _output(Seq2SeqLMOutput, loss=loss, logits=logits,
                   cache=cache if use_cache else None, encoder_last_hidden_state=encoded)


__all__ = ["DecLLMForCausalLM", "DecLLMModel", "RedLLMForConditionalGeneration", "RedLLMModel",
           "T5LikePreTrainedModel"]
