"""Paper pretraining, decllm 8B active parameters with mixture-of-experts feed-forwards
(docs/moe.md): 64 routed experts of width d_ff/8, top-7, + 1 shared expert, first layer of each
stack dense, group-limited routing (8 groups, top 4). Needs --config.data.data_dir=<RedPajama V1>.
"""
from t5like.config.moe import paper_moe
from t5like.config.presets import paper_pretraining


def get_config():
  cfg = paper_pretraining("decllm", "8b")
  cfg.model.moe = paper_moe(cfg.model.d_ff)
  return cfg
