"""Tiny RedLLM with mixture-of-experts feed-forwards in its encoder and decoder layer
(docs/moe.md) on the embedded RedPajama sample: 8 routed experts of width 128, top-3, plus 1
shared expert (active feed-forward width 512 = the dense tiny model's d_ff), as tiny_decllm_moe.py.
"""
from t5like.config.presets import tiny_pretraining


def get_config():
  cfg = tiny_pretraining("redllm")
  m = cfg.model.moe
  m.num_experts, m.num_shared_experts, m.top_k, m.expert_d_ff = 8, 1, 3, 128
  m.bias_update_rate, m.balance_loss, m.router_z_loss = 1e-3, 1e-4, 0.0
  return cfg.validate()
