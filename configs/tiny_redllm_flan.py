"""Tiny RedLLM instruction tuning on the embedded FLAN sample.

Initialise from a tiny RedLLM pretraining run: --config.train.init_from=runs/tiny_redllm
"""
from t5like.config.presets import tiny_instruction_tuning


def get_config():
  return tiny_instruction_tuning("redllm")
