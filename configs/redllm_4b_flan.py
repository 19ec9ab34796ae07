"""Paper instruction tuning (FLAN), RedLLM 4B.

Needs --config.data.data_dir=<FLAN root> --config.train.init_from=<redllm_4b workdir>.
"""
from t5like.config.presets import paper_instruction_tuning


def get_config():
  return paper_instruction_tuning("redllm", "4b")
