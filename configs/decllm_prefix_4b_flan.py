"""Paper instruction tuning (FLAN), DecLLM + BiAttn 4B: bidirectional attention over the input.

Needs --config.data.data_dir=<FLAN root> --config.train.init_from=<decllm_4b workdir>.
"""
from t5like.config.presets import paper_instruction_tuning


def get_config():
  return paper_instruction_tuning("decllm", "4b", prefix=True)
