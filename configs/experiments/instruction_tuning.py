"""Findings 4 and 5: pretrain, then instruction-tune on FLAN-style data — DecLLM, DecLLM + BiAttn
(bidirectional attention over the input during finetuning) and RedLLM; held-out FLAN loss on the
same target tokens against inference FLOPs per sequence (docs/paper.md, findings 4-5); 0-shot
scores on the project's small BIG-bench-format tasks are reported beside it.

Laptop scale: the tiny models pretrained on the embedded RedPajama sample, then finetuned on the
embedded FLAN sample (96 input + 32 target tokens). Paper scale: the 150M pretraining and
instruction-tuning configs (the other sizes follow the same pattern).
"""
from t5like.experiments.spec import ExperimentSpec, RunSpec

BUDGET = {  # pretrain steps, finetune steps, batch, held-out batches, finetune seeds
    "quick": (24, 16, 8, 2, (0,)),
    "full": (600, 300, 16, 16, (0, 1)),
}
# (variant, pretraining run, finetuning config)
VARIANTS = (("decllm", "pretrain_decllm", "tiny_decllm_flan.py"),
            ("decllm_biattn", "pretrain_decllm", "tiny_decllm_prefix_flan.py"),
            ("redllm", "pretrain_redllm", "tiny_redllm_flan.py"))


def _loop(steps: int, batch: int, seed: int) -> tuple[str, ...]:
  return (f"train.steps={steps}", f"train.batch_size={batch}", "train.eval_every=0",
          "train.eval_steps=0", f"train.log_every={max(steps // 4, 1)}",
          f"checkpoint.every={steps}", f"train.seed={seed}")


def get_experiment(budget: str = "quick") -> ExperimentSpec:
  pre_steps, ft_steps, batch, eval_batches, seeds = BUDGET[budget]
  runs = [RunSpec(name=f"pretrain_{f}", config=f"tiny_{f}.py",
                  overrides=_loop(pre_steps, batch, 0) + (f"train.warmup_steps={pre_steps // 10}",),
                  eval_overrides=("data.objective=prefix",),
                  tags=(("stage", "pretrain"), ("variant", f), ("seed", 0)))
          for f in ("decllm", "redllm")]
  for variant, pretrain, config in VARIANTS:
    for seed in seeds:
      runs.append(RunSpec(name=f"finetune_{variant}_s{seed}", config=config,
                          overrides=_loop(ft_steps, batch, seed), init_from_run=pretrain,
                          tasks=("shipped",),
                          tags=(("stage", "finetune"), ("variant", variant), ("seed", seed))))
  paper = (
      RunSpec(name="pretrain_decllm", config="decllm_150m.py",
              overrides=("data.data_dir={data_dir}",)),
      RunSpec(name="pretrain_redllm", config="redllm_150m.py",
              overrides=("data.data_dir={data_dir}",)),
      RunSpec(name="finetune_decllm", config="decllm_150m_flan.py",
              overrides=("data.data_dir={flan_dir}",), init_from_run="pretrain_decllm"),
      RunSpec(name="finetune_decllm_biattn", config="decllm_prefix_150m_flan.py",
              overrides=("data.data_dir={flan_dir}",), init_from_run="pretrain_decllm"),
      RunSpec(name="finetune_redllm", config="redllm_150m_flan.py",
              overrides=("data.data_dir={flan_dir}",), init_from_run="pretrain_redllm"))
  return ExperimentSpec(
      name="instruction_tuning", analysis="instruct", budget=budget, runs=tuple(runs),
      paper_runs=paper, eval_batches=eval_batches,
      claim=("After instruction tuning RedLLM matches or beats DecLLM at similar size at lower "
             "inference FLOPs per sequence (finding 4); giving DecLLM bidirectional attention over "
             "the input during finetuning improves it (finding 5)."),
      criterion=("Held-out FLAN loss on the targets, mean over finetuning seeds; noise = 2 x the "
                 "standard error of a difference from the seed spread. Finding 4: 'supported' if "
                 "RedLLM's loss is not above DecLLM's by more than the noise AND its inference "
                 "FLOPs per sequence are lower; 'contradicted' if its loss is higher by more than "
                 "the noise; else 'inconclusive'. Finding 5: 'supported' if DecLLM + BiAttn's loss "
                 "is below DecLLM's by more than the noise, 'contradicted' if above by more, else "
                 "'inconclusive'. Fewer than 2 seeds per arm: 'inconclusive'."),
      scale_note=(f"Tiny d_model-128 models: pretraining {pre_steps} steps, finetuning {ft_steps} "
                  f"steps of {batch} sequences, {len(seeds)} finetuning seed(s) from one "
                  "pretraining run per family; embedded corpora and 8k vocabulary."),
      params=(("sigmas", 2.0),)).validate()
