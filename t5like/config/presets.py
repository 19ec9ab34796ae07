"""Config builders behind ``configs/*.py`` (each config file is one call to one of these).

The paper configs need ``--config.data.data_dir=<corpus root>`` (``load_config`` says so if
missing) and ``--config.data.vocab_path=<32,768-piece SentencePiece model>`` (built once with
``python -m t5like.tools.build_vocab``); with no validation files they also need
``--config.data.validation_holdout`` (or ``validation_dir``). Runs check all three at start-up,
before compiling (``t5like.data.checks``).

- ``paper_pretraining(family, size)``: docs/paper.md §1 pretraining — RedPajama V1, 400K steps, batch
  2048, DecLLM length 2048 / RedLLM 1024 input + 1024 target (mid split), Adafactor 0.8, warmup 2k
  to 0.01 then cosine to 0.1x, clipping 1.0, dropout 0, z-loss 1e-4, bf16 compute.
- ``paper_instruction_tuning(family, size, prefix)``: FLAN, 190K steps, batch 1024, 2048 input /
  512 target, constant 1e-3, dropout 0.05, no z-loss; ``prefix=True`` is "DecLLM + BiAttn"
  (bidirectional attention over the input). Set ``train.init_from`` to the pretraining run.
- ``BENCHMARK_CONFIGS``: the shapes ``benchmarks/`` time (``small_*``: the comparison shape of
  docs/performance.md; ``medium_*``: 150M widths, fewer layers; ``tiny_*``: the tiny presets).
- ``tiny_pretraining`` / ``tiny_instruction_tuning``: the same recipes shrunk to train in a few
  minutes on 2 CPU cores on the embedded corpora (float32 compute, vocab of the embedded
  SentencePiece model, schedule lengths scaled with the number of steps). Their peak learning
  rates are 10x the paper's (0.1 / constant 0.01, same pretraining:finetuning ratio): measured
  here, a d_model-128 model at 0.01 needs about twice the steps for the same held-out loss.
"""
from __future__ import annotations

from t5like.config import Config, ModelConfig, paper_model

PAPER_PRETRAIN_STEPS = 400_000
PAPER_WARMUP_STEPS = 2_000
PAPER_FINETUNE_STEPS = 190_000
EMBEDDED_VOCAB_SIZE = 8192  # t5like/data/embedded/spm.model


def _paper_mesh(cfg: Config) -> None:
  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 1, -1, 1  # Pure FSDP (MaxText's default).


def _paper_data(cfg: Config) -> None:
  cfg.data.vocab_path = ""  # Required: a model of model.vocab_size (32,768) pieces.
  cfg.data.validation_dir = ""  # RedPajama: a held-out root, or set data.validation_holdout.
  cfg.data.validation_holdout = 0.0  # > 0 holds out documents by hash where no validation
  #   files exist; 0 makes a run without validation data stop at start-up naming both flags.


def _checkpointing(cfg: Config, every: int) -> None:
  cfg.checkpoint.every = every
  cfg.checkpoint.keep = 3


def paper_pretraining(family: str, size: str) -> Config:
  cfg = Config()
  cfg.model = paper_model(family, size)
  cfg.model.dropout_rate = 0.0
  cfg.model.dtype = "bfloat16"
  cfg.model.remat_policy = "full" if size != "150m" else "none"
  cfg.data.mixture = "redpajama_v1"
  cfg.data.data_dir = ""  # Required: --config.data.data_dir=<RedPajama V1 root>.
  _paper_data(cfg)
  cfg.data.objective = "auto"  # causal for DecLLM, mid-split prefix for RedLLM.
  cfg.data.pretrain_chunking = "stream"  # Documents concatenated, cut into full 2048 sequences.
  cfg.data.sequence_length = 2048
  cfg.data.inputs_length = 1024
  cfg.data.targets_length = 1024
  cfg.data.prefix_split = "middle"
  t = cfg.train
  t.steps, t.batch_size = PAPER_PRETRAIN_STEPS, 2048
  t.schedule, t.learning_rate, t.warmup_steps, t.final_lr_fraction = (
      "warmup_cosine", 0.01, PAPER_WARMUP_STEPS, 0.1)
  t.adafactor_decay_rate, t.clip_grad_norm, t.z_loss = 0.8, 1.0, 1e-4
  t.log_every, t.eval_every, t.eval_steps = 100, 2000, 20
  _paper_mesh(cfg)
  _checkpointing(cfg, 2000)
  return cfg  # Validated by load_config once data.data_dir is given.


def paper_instruction_tuning(family: str, size: str, *, prefix: bool = False) -> Config:
  cfg = Config()
  cfg.model = paper_model(family, size)
  cfg.model.decoder_attention = "prefix" if prefix else "causal"
  cfg.model.dropout_rate = 0.05
  cfg.model.dtype = "bfloat16"
  cfg.model.remat_policy = "full" if size != "150m" else "none"
  cfg.data.mixture = "flan"
  cfg.data.data_dir = ""  # Required: --config.data.data_dir=<FLAN root> (validated on load).
  _paper_data(cfg)
  cfg.data.objective = "inputs_targets"
  cfg.data.flan_grouping = "submixture"  # Thousands of tasks: one pipeline per sub-mixture.
  cfg.data.inputs_length = 2048
  cfg.data.targets_length = 512
  cfg.data.sequence_length = 2048 + 512  # DecLLM: input and target in one sequence.
  t = cfg.train
  t.steps, t.batch_size = PAPER_FINETUNE_STEPS, 1024
  t.schedule, t.learning_rate, t.warmup_steps = "constant", 1e-3, 0
  t.adafactor_decay_rate, t.clip_grad_norm, t.z_loss = 0.8, 1.0, 0.0
  t.log_every, t.eval_every, t.eval_steps = 100, 2000, 20
  t.init_from = ""  # Set --config.train.init_from=<pretraining workdir> (parameters only).
  _paper_mesh(cfg)
  _checkpointing(cfg, 2000)
  return cfg  # Validated by load_config once data.data_dir is given.


def tiny_model(family: str, *, prefix: bool = False) -> ModelConfig:
  """d_model 128: DecLLM 2 layers (0.53M non-embedding parameters), RedLLM 1 encoder + 1 decoder
  layer (0.59M: fewer layers for a similar size, as in the paper's table); the 8192 x 128 tied
  embedding (1.05M) dominates both."""
  return ModelConfig(
      family=family, vocab_size=EMBEDDED_VOCAB_SIZE, d_model=128, num_heads=4, head_dim=32,
      d_ff=512, num_layers=2, num_encoder_layers=1, num_decoder_layers=1,
      decoder_attention="prefix" if prefix else "causal", attn_out_norm=(family == "redllm"),
      dtype="float32", param_dtype="float32", scan_layers=True,
      # XLA:CPU stacks every saved activation of a scanned layer; recomputing the elementwise
      # ones from the saved weight products is never slower (1.0-1.4x in same-process A/Bs).
      remat_policy="dots_no_batch", dropout_rate=0.0).validate()


def _tiny_loop(cfg: Config, steps: int) -> None:
  t = cfg.train
  t.steps, t.batch_size = steps, 8
  t.log_every, t.eval_every, t.eval_steps, t.eval_batch_size = 25, max(steps // 2, 1), 8, 16
  t.peak_flops_per_device = 0.0  # CPU lookup (docs/performance.md).
  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 1, -1, 1
  _checkpointing(cfg, max(steps // 4, 1))


def tiny_pretraining(family: str, *, prefix: bool = False, steps: int = 500) -> Config:
  """Tiny DecLLM / DecLLM prefix LM / RedLLM on the embedded RedPajama sample."""
  cfg = Config()
  cfg.model = tiny_model(family, prefix=prefix)
  cfg.data.mixture = "embedded_redpajama"
  cfg.data.objective = "auto"
  cfg.data.sequence_length = 128
  cfg.data.inputs_length = 64
  cfg.data.targets_length = 64
  _tiny_loop(cfg, steps)
  t = cfg.train
  # The paper's schedule shape scaled to `steps` (warmup 5% instead of 0.5%), peak 10x (above).
  t.schedule, t.learning_rate = "warmup_cosine", 0.1
  t.warmup_steps, t.final_lr_fraction = max(steps // 20, 1), 0.1
  t.adafactor_decay_rate, t.clip_grad_norm, t.z_loss = 0.8, 1.0, 1e-4
  return cfg.validate()


def tiny_instruction_tuning(family: str, *, prefix: bool = False, steps: int = 200) -> Config:
  """Tiny instruction tuning on the embedded FLAN sample (set train.init_from)."""
  cfg = Config()
  cfg.model = tiny_model(family, prefix=prefix)
  cfg.model.dropout_rate = 0.05
  cfg.data.mixture = "embedded_flan"
  cfg.data.objective = "inputs_targets"
  cfg.data.inputs_length = 96
  cfg.data.targets_length = 32
  cfg.data.sequence_length = 128
  _tiny_loop(cfg, steps)
  t = cfg.train
  t.schedule, t.learning_rate, t.warmup_steps = "constant", 1e-2, 0  # 10x the paper (above).
  t.adafactor_decay_rate, t.clip_grad_norm, t.z_loss = 0.8, 1.0, 0.0
  t.init_from = ""  # --config.train.init_from=<tiny pretraining workdir>
  return cfg.validate()


def small_config(family: str) -> Config:
  """The comparison shape of docs/performance.md: d512, 8 x 64 heads, SwiGLU 1408, vocab 8192;
  DecLLM L4 at S256, RedLLM 2+2 layers at 128 input + 128 target. Scanned layers recompute their
  elementwise results from the saved weight products: on CPU never slower than stacking every
  activation."""
  cfg = Config()
  cfg.model = ModelConfig(family=family, vocab_size=8192, d_model=512, num_heads=8, head_dim=64,
                          d_ff=1408, num_layers=4, num_encoder_layers=2, num_decoder_layers=2,
                          attn_out_norm=family == "redllm", remat_policy="dots_no_batch")
  cfg.data.sequence_length, cfg.data.inputs_length, cfg.data.targets_length = 256, 128, 128
  cfg.train.batch_size, cfg.train.warmup_steps, cfg.train.steps = 8, 10, 1000
  return cfg


def medium_config(family: str) -> Config:
  """150M-like (paper 150M widths, fewer layers, lengths scaled): memory-bound behaviour shows."""
  cfg = Config()
  cfg.model = ModelConfig(family=family, vocab_size=32768, d_model=1024, num_heads=8,
                          head_dim=128, d_ff=4096, num_layers=8, num_encoder_layers=4,
                          num_decoder_layers=4, attn_out_norm=family == "redllm",
                          dtype="bfloat16", remat_policy="full")
  cfg.data.sequence_length, cfg.data.inputs_length, cfg.data.targets_length = 1024, 512, 512
  cfg.train.batch_size, cfg.train.warmup_steps, cfg.train.steps = 4, 10, 1000
  return cfg


def unrolled(cfg: Config) -> Config:
  """The same model as a Python loop of layers, without remat (each at its fastest on CPU)."""
  cfg.model.scan_layers, cfg.model.remat_policy = False, "none"
  return cfg


# The benchmarks' configs by name (unvalidated: a benchmark sets the dtype first); the medium
# ones are timed in bfloat16 only.
BENCHMARK_CONFIGS = {
    "tiny_decllm": lambda: tiny_pretraining("decllm"),
    "tiny_redllm": lambda: tiny_pretraining("redllm"),
    "small_decllm": lambda: small_config("decllm"),
    "small_redllm": lambda: small_config("redllm"),
    "small_decllm_unrolled": lambda: unrolled(small_config("decllm")),
    "medium_decllm": lambda: medium_config("decllm"),
    "medium_redllm": lambda: medium_config("redllm"),
}
BENCHMARK_FIXED_DTYPE = {"medium_decllm": "bfloat16", "medium_redllm": "bfloat16"}
