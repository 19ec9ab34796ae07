"""Paper pretraining (docs/paper.md §1), RedLLM 4B.

Needs --config.data.data_dir=<RedPajama V1 root>.
"""
from t5like.config.presets import paper_pretraining


def get_config():
  return paper_pretraining("redllm", "4b")
