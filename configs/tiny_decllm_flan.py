"""Tiny DecLLM instruction tuning on the embedded FLAN sample.

  python train.py --config configs/tiny_decllm_flan.py --workdir runs/tiny_decllm_flan \
      --config.train.init_from=runs/tiny_decllm
"""
from t5like.config.presets import tiny_instruction_tuning


def get_config():
  return tiny_instruction_tuning("decllm")
