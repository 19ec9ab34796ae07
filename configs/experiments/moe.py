"""Does the DecLLM-vs-RedLLM comparison keep its sign with mixture-of-experts feed-forwards at
equal active parameters (docs/moe.md)? Both families dense and MoE (8 routed experts of width
128, top-3, + 1 shared: the dense d_ff of 512 active), same data, steps and seeds. Two stages, as
the paper compares the families: pretraining (held-out loss on the same target tokens, the
prefix-LM split for both) and instruction tuning on FLAN from each pretrained run (held-out FLAN
loss on the targets; the instruction_tuning experiment's stage, configs/tiny_*_flan.py)."""
from t5like.experiments.spec import ExperimentSpec, RunSpec

# (family, feed-forward, pretraining config, instruction-tuning config)
ARMS = (("decllm", "dense", "tiny_decllm.py", "tiny_decllm_flan.py"),
        ("decllm", "moe", "tiny_decllm_moe.py", "tiny_decllm_moe_flan.py"),
        ("redllm", "dense", "tiny_redllm.py", "tiny_redllm_flan.py"),
        ("redllm", "moe", "tiny_redllm_moe.py", "tiny_redllm_moe_flan.py"))
# pretrain steps, finetune steps, batch, held-out batches, seeds. As in instruction_tuning: warmup
# a tenth of the pretraining steps, finetuning at the instruction-tuning configs' own schedule.
BUDGET = {"quick": (24, 16, 8, 2, (0,)), "full": (300, 150, 16, 16, (0, 1))}


def _loop(steps: int, batch: int, seed: int) -> tuple[str, ...]:
  return (f"train.steps={steps}", f"train.batch_size={batch}", "train.eval_every=0",
          "train.eval_steps=0", f"train.log_every={max(steps // 4, 1)}",
          f"checkpoint.every={steps}", f"train.seed={seed}")


def _runs(budget: str) -> tuple[RunSpec, ...]:
  """Per arm and seed: a pretraining run, then instruction tuning from it (same seed). Seed by
  seed, so a run stopped part way has every arm at its first seeds."""
  pre_steps, ft_steps, batch, _, seeds = BUDGET[budget]
  runs = []
  for seed in seeds:
    for family, ffn, pretrain, finetune in ARMS:
      tags = (("family", family), ("ffn", ffn), ("seed", seed))
      runs.append(RunSpec(name=f"{family}_{ffn}_s{seed}", config=pretrain,
                          overrides=_loop(pre_steps, batch, seed) + (
                              f"train.warmup_steps={pre_steps // 10}",),
                          eval_overrides=("data.objective=prefix",),
                          tags=(("stage", "pretrain"),) + tags))
      runs.append(RunSpec(name=f"finetune_{family}_{ffn}_s{seed}", config=finetune,
                          overrides=_loop(ft_steps, batch, seed),
                          init_from_run=f"{family}_{ffn}_s{seed}", tasks=("shipped",),
                          tags=(("stage", "finetune"),) + tags))
  return tuple(runs)


def _paper_runs() -> tuple[RunSpec, ...]:
  runs = []
  for family, ffn, _, _ in ARMS:
    moe = "_moe" if ffn == "moe" else ""
    runs.append(RunSpec(name=f"{family}_{ffn}_1b", config=f"{family}_1b{moe}.py",
                        overrides=("data.data_dir={data_dir}",),
                        eval_overrides=("data.objective=prefix",),
                        tags=(("stage", "pretrain"), ("family", family), ("ffn", ffn))))
    runs.append(RunSpec(name=f"finetune_{family}_{ffn}_1b", config=f"{family}_1b{moe}_flan.py",
                        overrides=("data.data_dir={flan_dir}",),
                        init_from_run=f"{family}_{ffn}_1b",
                        tags=(("stage", "finetune"), ("family", family), ("ffn", ffn))))
  return tuple(runs)


def get_experiment(budget: str = "quick") -> ExperimentSpec:
  pre_steps, ft_steps, batch, eval_batches, seeds = BUDGET[budget]
  return ExperimentSpec(
      name="moe", analysis="moe", budget=budget, runs=_runs(budget), paper_runs=_paper_runs(),
      eval_batches=eval_batches,
      claim=("With mixture-of-experts feed-forwards at equal active parameters, the DecLLM-vs-"
             "RedLLM comparison (held-out loss on the same target tokens, and after instruction "
             "tuning) keeps its sign."),
      criterion=("Per stage (pretraining: held-out loss with the prefix-LM split for both; after "
                 "instruction tuning: held-out FLAN loss on the targets): d_dense = mean loss "
                 "RedLLM - DecLLM (dense), d_moe the same with MoE, means over seeds; noise of each "
                 "= 2 x the standard error of the difference from the seed spread. 'supported' if "
                 "|d_dense| and |d_moe| both exceed their noise with the same sign; "
                 "'contradicted' if both exceed it with opposite signs; 'inconclusive' otherwise "
                 "or with fewer than 2 seeds per arm. One verdict per stage; 0-shot task scores "
                 "are reported beside, not judged."),
      scale_note=(f"d_model 128 models, pretraining {pre_steps} steps then instruction tuning "
                  f"{ft_steps} steps, {batch} sequences of 128 tokens, {len(seeds)} seed(s) per "
                  "arm (each seed its own pretraining and finetuning run), embedded RedPajama and "
                  "FLAN samples; MoE: 8 experts x 128, top-3 + 1 shared, dropless."),
      params=(("sigmas", 2.0),)).validate()
