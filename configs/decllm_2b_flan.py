"""Paper instruction tuning (FLAN), DecLLM 2B, causal attention.

Needs --config.data.data_dir=<FLAN root> --config.train.init_from=<decllm_2b workdir>.
"""
from t5like.config.presets import paper_instruction_tuning


def get_config():
  return paper_instruction_tuning("decllm", "2b", prefix=False)
