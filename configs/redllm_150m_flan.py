"""Paper instruction tuning (FLAN), RedLLM 150M.

Needs --config.data.data_dir=<FLAN root> --config.train.init_from=<redllm_150m workdir>.
"""
from t5like.config.presets import paper_instruction_tuning


def get_config():
  return paper_instruction_tuning("redllm", "150m")
