"""Finding 1: DecLLM and RedLLM scaling on RedPajama-style data (docs/paper.md, finding 1).

Laptop scale: five sizes per family (d_model 64..192, FFN 4d, head size 32; RedLLM with about half
the layers per stack, as in the paper's table), all trained on the same number of tokens of the
embedded RedPajama sample and scored on the same held-out target tokens (the second half of each
mid-split chunk: RedLLM reads the first half with its encoder, DecLLM as a causal prefix).
Paper scale: the ten pretraining configs (150M..8B per family).
"""
from t5like.experiments.spec import ExperimentSpec, RunSpec

# (name, d_model, DecLLM layers, RedLLM layers per stack)
SIZES = (("d64", 64, 2, 1), ("d96", 96, 2, 1), ("d128", 128, 4, 2), ("d160", 160, 4, 2),
         ("d192", 192, 6, 3))
BUDGET = {  # steps, batch size, warmup, held-out batches, seeds, sizes
    "quick": (24, 8, 2, 2, (0,), ("d64", "d128", "d192")),  # 3 sizes: the fewest a fit takes.
    "full": (400, 16, 20, 16, (0,), tuple(s[0] for s in SIZES)),
}
PAPER_SIZES = ("150m", "1b", "2b", "4b", "8b")


def _model(family: str, d: int, dec_layers: int, red_layers: int) -> tuple[str, ...]:
  layers = ((f"model.num_layers={dec_layers}",) if family == "decllm" else
            (f"model.num_encoder_layers={red_layers}", f"model.num_decoder_layers={red_layers}"))
  return (f"model.d_model={d}", f"model.num_heads={d // 32}", "model.head_dim=32",
          f"model.d_ff={4 * d}") + layers


def get_experiment(budget: str = "quick") -> ExperimentSpec:
  steps, batch, warmup, eval_batches, seeds, sizes = BUDGET[budget]
  runs = []
  for family in ("decllm", "redllm"):
    for name, d, dl, rl in (s for s in SIZES if s[0] in sizes):
      for seed in seeds:
        loop = (f"train.steps={steps}", f"train.batch_size={batch}",
                f"train.warmup_steps={warmup}", "train.eval_every=0", "train.eval_steps=0",
                f"train.log_every={max(steps // 4, 1)}", f"checkpoint.every={steps}",
                f"train.seed={seed}")
        runs.append(RunSpec(
            name=f"{family}_{name}_s{seed}", config=f"tiny_{family}.py",
            overrides=_model(family, d, dl, rl) + loop, eval_overrides=("data.objective=prefix",),
            tags=(("family", family), ("size", name), ("seed", seed))))
  paper = tuple(RunSpec(name=f"{f}_{s}", config=f"{f}_{s}.py",
                        overrides=("data.data_dir={data_dir}",),
                        eval_overrides=("data.objective=prefix",),
                        tags=(("family", f), ("size", s)))
                for f in ("decllm", "redllm") for s in PAPER_SIZES)
  return ExperimentSpec(
      name="scaling", analysis="scaling", budget=budget, runs=tuple(runs), paper_runs=paper,
      eval_batches=eval_batches,
      claim=("Both families scale with similar exponents; DecLLM is more parameter-efficient, "
             "RedLLM more compute-efficient, and DecLLM dominates the compute-optimal frontier "
             "in pretraining (paper: exponents vs FLOPs 0.20 DecLLM / 0.24 RedLLM)."),
      criterion=("Fit L = A x^-alpha by least squares in log-log space per family, x = training "
                 "FLOPs and x = non-embedding parameters, 95% t-intervals on alpha. Exponents: "
                 "'supported' if the two FLOPs intervals overlap, else 'contradicted'. "
                 "Efficiency: at the geometric middle of the shared x range, the claimed family's "
                 "fitted loss must be lower by more than 2x the combined residual std of the two "
                 "fits (log scale) for 'supported'; higher by as much is 'contradicted'; "
                 "otherwise 'inconclusive'. Frontier: more than half of the Pareto-optimal "
                 "(FLOPs, loss) runs are DecLLM."),
      scale_note=(f"{len(sizes)} sizes x 2 families x {len(seeds)} seed(s), {steps} steps of "
                  f"{batch} x 128 tokens each (the paper: 400K steps of 2048 x 2048), embedded "
                  "8k vocabulary, peak learning rate 0.1 for every size. At the quick budget the "
                  "runs only check the plumbing: expect 'inconclusive'."),
      params=(("confidence", 0.95), ("sigmas", 2.0))).validate()
