"""Tiny DecLLM prefix LM (bidirectional attention over the first 64 tokens) on the embedded
RedPajama sample."""
from t5like.config.presets import tiny_pretraining


def get_config():
  return tiny_pretraining("decllm", prefix=True)
