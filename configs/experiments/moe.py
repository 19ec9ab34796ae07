"""Does the DecLLM-vs-RedLLM comparison keep its sign with mixture-of-experts feed-forwards at
equal active parameters (docs/moe.md)? Both families dense and MoE (8 routed experts of width
128, top-3, + 1 shared: the dense d_ff of 512 active), same data, steps and seeds; held-out loss on
the same target tokens (the prefix-LM split for both). The instruction-tuning half of the claim
is not run yet (docs/moe.md, "Not yet")."""
from t5like.experiments.spec import ExperimentSpec, RunSpec

ARMS = (("decllm", "dense", "tiny_decllm.py"), ("decllm", "moe", "tiny_decllm_moe.py"),
        ("redllm", "dense", "tiny_redllm.py"), ("redllm", "moe", "tiny_redllm_moe.py"))
BUDGET = {"quick": (24, 8, 2, 2, (0,)), "full": (300, 16, 15, 16, (0, 1, 2))}


def get_experiment(budget: str = "quick") -> ExperimentSpec:
  steps, batch, warmup, eval_batches, seeds = BUDGET[budget]
  runs = tuple(
      RunSpec(name=f"{family}_{ffn}_s{seed}", config=config,
              overrides=(f"train.steps={steps}", f"train.batch_size={batch}",
                         f"train.warmup_steps={warmup}", "train.eval_every=0",
                         "train.eval_steps=0", f"train.log_every={max(steps // 4, 1)}",
                         f"checkpoint.every={steps}", f"train.seed={seed}"),
              eval_overrides=("data.objective=prefix",),
              tags=(("family", family), ("ffn", ffn), ("seed", seed)))
      for family, ffn, config in ARMS for seed in seeds)
  paper = tuple(RunSpec(name=f"{f}_{ffn}_1b", config=f"{f}_1b{'_moe' if ffn == 'moe' else ''}.py",
                        overrides=("data.data_dir={data_dir}",),
                        tags=(("family", f), ("ffn", ffn)))
                for f, ffn, _ in ARMS)
  return ExperimentSpec(
      name="moe", analysis="moe", budget=budget, runs=runs, paper_runs=paper,
      eval_batches=eval_batches,
      claim=("With mixture-of-experts feed-forwards at equal active parameters, the DecLLM-vs-"
             "RedLLM comparison (held-out loss on the same target tokens) keeps its sign."),
      criterion=("d_dense = mean held-out loss RedLLM - DecLLM (dense), d_moe the same with MoE, "
                 "means over seeds; noise of each = 2 x the standard error of the difference from "
                 "the seed spread. 'supported' if |d_dense| and |d_moe| both exceed their noise "
                 "with the same sign; 'contradicted' if both exceed it with opposite signs; "
                 "'inconclusive' otherwise or with fewer than 2 seeds per arm."),
      scale_note=(f"d_model 128 models, {steps} steps of {batch} x 128 tokens, {len(seeds)} "
                  "seed(s) per arm, embedded RedPajama sample; MoE: 8 experts x 128, top-3 + 1 "
                  "shared, dropless."),
      params=(("sigmas", 2.0),)).validate()
