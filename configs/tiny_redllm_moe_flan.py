"""Tiny RedLLM with mixture-of-experts feed-forwards (tiny_redllm_moe.py), instruction tuning on the
embedded FLAN sample.

  python train.py --config configs/tiny_redllm_moe_flan.py --workdir runs/tiny_redllm_moe_flan \
      --config.train.init_from=runs/tiny_redllm_moe
"""
from t5like.config.moe import tiny_moe
from t5like.config.presets import tiny_instruction_tuning


def get_config():
  cfg = tiny_instruction_tuning("redllm")
  cfg.model.moe = tiny_moe()
  return cfg.validate()
