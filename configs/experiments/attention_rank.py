"""The rank argument (docs/paper.md, the discussions): attention maps of causal, bidirectional and
mixed forward/backward attention in trained models, on the same input tokens — per-layer rank and
Dong et al.'s residual ratio.

Laptop scale: tiny DecLLM (causal), DecLLM prefix LM (bidirectional over the input), RedLLM
(bidirectional encoder) and RedLLM with per-head / per-layer mixed encoders (2 encoder layers),
trained on the embedded RedPajama sample; maps of held-out rows. Paper scale: the 150M RedLLM
pretraining config with each encoder attention kind.
"""
from t5like.experiments.spec import ExperimentSpec, RunSpec

ARMS = (("decllm_causal", "tiny_decllm.py", ()),
        ("decllm_prefix", "tiny_decllm_prefix.py", ()),
        ("redllm_bidirectional", "tiny_redllm.py", ("model.num_encoder_layers=2",)),
        ("redllm_per_head", "tiny_redllm.py", ("model.num_encoder_layers=2",
                                               "model.mixed_attention=per_head")),
        ("redllm_per_layer", "tiny_redllm.py", ("model.num_encoder_layers=2",
                                                "model.mixed_attention=per_layer")))
KIND = {"decllm_causal": "causal", "decllm_prefix": "bidirectional",
        "redllm_bidirectional": "bidirectional", "redllm_per_head": "mixed",
        "redllm_per_layer": "mixed"}
BUDGET = {"quick": (24, 8, 4, (0,)), "full": (600, 16, 16, (0, 1))}  # steps, batch, rows, seeds


def get_experiment(budget: str = "quick") -> ExperimentSpec:
  steps, batch, rows, seeds = BUDGET[budget]
  runs = tuple(RunSpec(
      name=f"{arm}_s{seed}", config=config,
      overrides=extra + (f"train.steps={steps}", f"train.batch_size={batch}",
                         f"train.warmup_steps={max(steps // 20, 1)}", "train.eval_every=0",
                         "train.eval_steps=0", f"train.log_every={max(steps // 4, 1)}",
                         f"checkpoint.every={steps}", f"train.seed={seed}"),
      eval_overrides=("data.objective=prefix",),
      tags=(("arm", arm), ("kind", KIND[arm]), ("seed", seed)))
      for arm, config, extra in ARMS for seed in seeds)
  paper = tuple(RunSpec(name=f"redllm_150m_{v}", config="redllm_150m.py",
                        overrides=("data.data_dir={data_dir}", f"model.mixed_attention={v}"))
                for v in ("none", "per_head", "per_layer"))
  return ExperimentSpec(
      name="attention_rank", analysis="rank", budget=budget, runs=runs, paper_runs=paper,
      eval_batches=2,
      claim=("A causal attention map is triangular with a positive diagonal, hence always full "
             "rank, while bidirectional softmax attention with head size below the length tends "
             "to low rank; mixed forward/backward attention keeps every map triangular (full "
             "rank) while still mixing both directions."),
      criterion=("On the same held-out input tokens (first segment, first half of each row), "
                 "mean normalised entropy effective rank of the input self-attention maps over "
                 "rows (all layers and heads averaged per row). 'supported' if bidirectional "
                 "arms are lower than the causal DecLLM by more than 2 x the standard error of "
                 "the difference over rows, 'contradicted' if higher by as much, else "
                 "'inconclusive'. Structural check, reported: the fraction of causal and mixed "
                 "maps that are triangular with a full diagonal (exactly full rank)."),
      scale_note=(f"Tiny models, {steps} steps of {batch} x 128 tokens, {len(seeds)} seed(s); "
                  f"maps of {rows} held-out rows with 64-token inputs (head size 32)."),
      params=(("rows", rows), ("sigmas", 2.0))).validate()
