"""Tiny RedLLM with mixture-of-experts feed-forwards in its encoder and decoder layer
(docs/moe.md) on the embedded RedPajama sample: 8 routed experts of width 128, top-3, plus 1
shared expert (active feed-forward width 512 = the dense tiny model's d_ff), as tiny_decllm_moe.py.
"""
from t5like.config.moe import tiny_moe
from t5like.config.presets import tiny_pretraining


def get_config():
  cfg = tiny_pretraining("redllm")
  cfg.model.moe = tiny_moe()
  return cfg.validate()
