"""Paper instruction tuning (FLAN), RedLLM 1B active parameters with mixture-of-experts
feed-forwards (redllm_1b_moe.py, docs/moe.md).

Needs --config.data.data_dir=<FLAN root> --config.train.init_from=<redllm_1b_moe workdir>.
"""
from t5like.config.moe import paper_moe
from t5like.config.presets import paper_instruction_tuning


def get_config():
  cfg = paper_instruction_tuning("redllm", "1b")
  cfg.model.moe = paper_moe(cfg.model.d_ff)
  return cfg
