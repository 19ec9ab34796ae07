"""Finding 3: length extrapolation. Both families trained at one length L, scored on held-out data
at 1x, 2x, 4x and 8x L (RedLLM: input and target lengths scaled together; DecLLM: the same target
tokens, scored after the same prefix) — docs/paper.md, finding 3.

Laptop scale: tiny models trained at L = 128 (RedLLM 64 + 64), scored up to 1,024 tokens.
Paper scale: the 150M pretraining configs (L = 2048), scored up to 16,384 tokens.
"""
from t5like.experiments.spec import ExperimentSpec, RunSpec

FACTORS = (1, 2, 4, 8)
BUDGET = {"quick": (24, 8, 2, (0,)), "full": (600, 16, 8, (0, 1))}  # steps, batch, evals, seeds


def _evals(base: int) -> tuple[tuple[str, tuple[str, ...]], ...]:
  out = []
  for k in FACTORS:
    n = k * base
    # Scored on the target half after the input half (data.objective=prefix) for both families.
    lengths = (f"data.sequence_length={n}", f"data.inputs_length={n // 2}",
               f"data.targets_length={n // 2}")
    out.append((f"x{k}", ("data.objective=prefix", "train.eval_batch_size=4") + lengths))
  return tuple(out)


def get_experiment(budget: str = "quick") -> ExperimentSpec:
  steps, batch, eval_batches, seeds = BUDGET[budget]
  runs = [RunSpec(name=f"{f}_s{seed}", config=f"tiny_{f}.py",
                  overrides=(f"train.steps={steps}", f"train.batch_size={batch}",
                             f"train.warmup_steps={max(steps // 20, 1)}", "train.eval_every=0",
                             "train.eval_steps=0", f"train.log_every={max(steps // 4, 1)}",
                             f"checkpoint.every={steps}", f"train.seed={seed}"),
                  eval_overrides=("data.objective=prefix",), evals=_evals(128),
                  tags=(("family", f), ("seed", seed)))
          for f in ("decllm", "redllm") for seed in seeds]
  paper = tuple(RunSpec(name=f"{f}_150m", config=f"{f}_150m.py",
                        overrides=("data.data_dir={data_dir}",),
                        eval_overrides=("data.objective=prefix",), evals=_evals(2048))
                for f in ("decllm", "redllm"))
  return ExperimentSpec(
      name="length_extrapolation", analysis="length", budget=budget, runs=tuple(runs),
      paper_runs=paper, eval_batches=eval_batches,
      claim=("Trained at length L, RedLLM's perplexity rises smoothly with evaluation length while "
             "DecLLM's degrades sharply beyond ~2x L (finding 3)."),
      criterion=("Degradation D(k) = held-out loss at k x L minus at 1 x L, mean over seeds. "
                 "'supported' if D_DecLLM(8) - D_RedLLM(8) exceeds 2 x its standard error from the "
                 "seed spread; 'contradicted' if it is below minus that; else 'inconclusive'. "
                 "Fewer than 2 seeds per family: 'inconclusive'."),
      scale_note=(f"Tiny models trained {steps} steps at L = 128 (batch {batch}), scored on "
                  f"{eval_batches} held-out batches of 4 rows per length, {len(seeds)} seed(s) "
                  "per family; embedded RedPajama sample."),
      params=(("sigmas", 2.0), ("factors", FACTORS))).validate()
