"""Tiny DecLLM + BiAttn instruction tuning (bidirectional over the input) on embedded FLAN.

Initialise from a tiny DecLLM pretraining run: --config.train.init_from=runs/tiny_decllm
"""
from t5like.config.presets import tiny_instruction_tuning


def get_config():
  return tiny_instruction_tuning("decllm", prefix=True)
