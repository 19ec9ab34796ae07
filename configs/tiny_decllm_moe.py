"""Tiny DecLLM with mixture-of-experts feed-forwards (docs/moe.md) on the embedded RedPajama
sample: minutes on 2 CPU cores.

Both layers are MoE: 8 routed experts of width 128, top-3, plus 1 shared expert, so a token uses
(3 + 1) x 128 = 512 hidden units, the dense tiny model's d_ff: equal active feed-forward
parameters (plus the 8-column router), 2.25x the feed-forward parameters in total.
"""
from t5like.config.moe import tiny_moe
from t5like.config.presets import tiny_pretraining


def get_config():
  cfg = tiny_pretraining("decllm")
  cfg.model.moe = tiny_moe()
  return cfg.validate()
