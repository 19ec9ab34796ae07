"""Configuration of t5like's DecLLM and RedLLM for Hugging Face ``transformers``.

Shipped with every model that ``python -m t5like.tools.export_hf`` writes and loaded with
``trust_remote_code=True``. The fields are t5like's ``ModelConfig`` fields under their own names
(see its comments); the standard ``transformers`` names (``hidden_size``, ``num_hidden_layers``,
...) are derived from them.
"""
from transformers import PretrainedConfig


class T5LikeConfig(PretrainedConfig):
  """DecLLM (``family="decllm"``: decoder-only, causal or bidirectional over a prefix) or RedLLM
  (``family="redllm"``: encoder-decoder with RoPE in cross-attention and continuous positions)."""

  model_type = "t5like"
  keys_to_ignore_at_inference = ["past_key_values"]
  _DERIVED = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
              "intermediate_size", "rms_norm_eps", "rope_theta", "max_position_embeddings")

  def __init__(self, family="decllm", vocab_size=32768, d_model=1024, num_heads=8,
               num_kv_heads=0, head_dim=128, d_ff=4096, num_layers=8, num_encoder_layers=3,
               num_decoder_layers=3, decoder_attention="causal", qkv_norm=True, v_norm=True,
               attn_out_norm=False, attn_out_norm_scope="per_head",
               rope_max_wavelength=10000.0, cross_attention_rope=True,
               continuous_positions=True, norm_eps=1e-6, tie_embeddings=True,
               scale_logits=True, pad_token_id=0, eos_token_id=1, bos_token_id=0,
               decoder_start_token_id=0, **kwargs):
    if family not in ("decllm", "redllm"):
      raise ValueError(f"family must be 'decllm' or 'redllm', got {family!r}")
    if decoder_attention not in ("causal", "prefix"):
      raise ValueError(f"decoder_attention must be 'causal' or 'prefix', got "
                       f"{decoder_attention!r}")
    self.family = family
    self.vocab_size = vocab_size
    self.d_model = d_model
    self.num_heads = num_heads
    self.num_kv_heads = num_kv_heads
    self.head_dim = head_dim
    self.d_ff = d_ff
    self.num_layers = num_layers
    self.num_encoder_layers = num_encoder_layers
    self.num_decoder_layers = num_decoder_layers
    self.decoder_attention = decoder_attention
    self.qkv_norm = qkv_norm
    self.v_norm = v_norm
    self.attn_out_norm = attn_out_norm
    self.attn_out_norm_scope = attn_out_norm_scope
    self.rope_max_wavelength = rope_max_wavelength
    self.cross_attention_rope = cross_attention_rope
    self.continuous_positions = continuous_positions
    self.norm_eps = norm_eps
    self.tie_embeddings = tie_embeddings
    self.scale_logits = scale_logits
    for name in self._DERIVED:  # Written by to_dict; always recomputed from the fields above.
      kwargs.pop(name, None)
    self.hidden_size = d_model
    self.num_attention_heads = num_heads
    self.num_key_value_heads = num_kv_heads or num_heads
    self.num_hidden_layers = num_layers if family == "decllm" else num_decoder_layers
    self.intermediate_size = d_ff
    self.rms_norm_eps = norm_eps
    self.rope_theta = rope_max_wavelength
    kwargs["is_encoder_decoder"] = family == "redllm"
    kwargs["tie_word_embeddings"] = tie_embeddings
    super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id,
                     bos_token_id=bos_token_id, decoder_start_token_id=decoder_start_token_id,
                     **kwargs)
