"""Tiny DecLLM (causal LM) on the embedded RedPajama sample: a few minutes on 2 CPU cores.

The default of `python train.py` with no arguments.
"""
from t5like.config.presets import tiny_pretraining


def get_config():
  return tiny_pretraining("decllm")
