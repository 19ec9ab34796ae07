"""Mixed forward/backward attention in place of bidirectional attention (docs/paper.md, the
discussions): RedLLM's encoder and DecLLM + BiAttn's prefix, each with full bidirectional,
per-head mixed and per-layer mixed attention, same data, steps and seeds; held-out loss on the
same target tokens."""
from t5like.experiments.spec import ExperimentSpec, RunSpec

BASES = (("redllm", "tiny_redllm.py", ("model.num_encoder_layers=2",)),
         ("decllm_prefix", "tiny_decllm_prefix.py", ()))
VARIANTS = ("none", "per_head", "per_layer")
BUDGET = {"quick": (24, 8, 2, 2, (0,)), "full": (300, 16, 15, 16, (0, 1))}


def get_experiment(budget: str = "quick") -> ExperimentSpec:
  steps, batch, warmup, eval_batches, seeds = BUDGET[budget]
  runs = []
  for base, config, extra in BASES:
    for variant in VARIANTS:
      for seed in seeds:
        runs.append(RunSpec(
            name=f"{base}_{variant}_s{seed}", config=config,
            overrides=extra + (f"model.mixed_attention={variant}", f"train.steps={steps}",
                               f"train.batch_size={batch}", f"train.warmup_steps={warmup}",
                               "train.eval_every=0", "train.eval_steps=0",
                               f"train.log_every={max(steps // 4, 1)}",
                               f"checkpoint.every={steps}", f"train.seed={seed}"),
            eval_overrides=("data.objective=prefix",),
            tags=(("base", base), ("variant", variant), ("seed", seed))))
  paper = tuple(RunSpec(name=f"{b}_{v}", config=c.replace("tiny_", "").replace(".py", "_150m.py"),
                        overrides=("data.data_dir={data_dir}",
                                   f"model.mixed_attention={v}"),
                        tags=(("base", b), ("variant", v)))
                for b, c, _ in BASES[:1] for v in VARIANTS)
  return ExperimentSpec(
      name="mixed_attention", analysis="mixed", budget=budget, runs=tuple(runs),
      paper_runs=paper, eval_batches=eval_batches,
      claim=("Mixed forward/backward attention (every attention map triangular: half the heads or "
             "every other layer backward) does at least as well as full bidirectional attention "
             "(reported slightly better on MLM at ~100M parameters)."),
      criterion=("Per base model and mixed variant: d = mean held-out loss (mixed) - mean "
                 "(bidirectional) over seeds; noise = 2 x the standard error of that difference "
                 "from the seed spread. 'supported' if d < -noise, 'contradicted' if d > noise, "
                 "'inconclusive' otherwise or with fewer than 2 seeds per arm."),
      scale_note=(f"d_model 128 models, {steps} steps of {batch} x 128 tokens, {len(seeds)} "
                  "seed(s) per arm, embedded RedPajama sample."),
      params=(("sigmas", 2.0),)).validate()
