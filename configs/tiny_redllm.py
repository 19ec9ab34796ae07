"""Tiny RedLLM (mid-split prefix LM, 64 input + 64 target tokens) on embedded RedPajama."""
from t5like.config.presets import tiny_pretraining


def get_config():
  return tiny_pretraining("redllm")
