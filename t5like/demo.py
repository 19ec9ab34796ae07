"""The README's first command (``make demo``): train tiny DecLLM and RedLLM on the embedded real
text, evaluate both checkpoints with ``eval.py``'s code, and print them side by side.

The comparison is like for like: RedLLM is scored on the target half of each mid-split held-out
chunk given the encoder half; DecLLM is scored on exactly those target tokens given the same
prefix (causal attention, ``data.objective=prefix``) as well as on every token (its own causal-LM
loss). Running it again resumes the finished runs (nothing is retrained) and re-evaluates.

  python -m t5like.demo [--workdir runs/demo] [--steps N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from t5like import cli

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> int:
  return cli.guard(_main, argv)


def _main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", default=os.path.join("runs", "demo"))
  parser.add_argument("--steps", type=int, default=0, help="training steps (default: the config's)")
  cli.add_debug_argument(parser)
  args = parser.parse_args(argv)

  from t5like import runtime
  from t5like.config import load_config
  runtime.init_tensorflow()
  from t5like.evaluation.checkpoint_eval import evaluate_checkpoint, format_report
  from t5like.training import run

  rows = []
  for family in ("decllm", "redllm"):
    overrides = [f"train.steps={args.steps}"] if args.steps else []
    cfg = load_config(os.path.join(HERE, "configs", f"tiny_{family}.py"), overrides)
    workdir = os.path.join(args.workdir, f"tiny_{family}")
    print(f"\n=== training tiny {family} in {workdir} ===", flush=True)
    t0 = time.time()
    train_metrics = run(cfg, workdir)
    train_s = time.time() - t0
    print(f"\n=== evaluating tiny {family} ===", flush=True)
    same_targets = evaluate_checkpoint(workdir, overrides=["data.objective=prefix"])
    print(format_report(same_targets))
    all_tokens = None
    if family == "decllm":
      all_tokens = evaluate_checkpoint(workdir, per_task=False, write=False)
      print(format_report(all_tokens))
    rows.append((family, same_targets, all_tokens, train_metrics, train_s))

  print("\n=== side by side: held-out embedded RedPajama (target half of mid-split chunks) ===")
  head = (f"{'model':<8} {'params':>8} {'steps':>6} {'train s':>8} {'train loss':>10} "
          f"{'held-out loss':>13} {'ppl':>8} {'acc':>6} {'all-token loss':>14}")
  print(head)
  print("-" * len(head))
  for family, same, allt, tm, secs in rows:
    m = same["results"][next(iter(same["results"]))]
    extra = f"{allt['results'][next(iter(allt['results']))]['eval_loss']:.4f}" if allt else "-"
    print(f"{family:<8} {same['num_params'] / 1e6:>7.2f}M {same['step']:>6} {secs:>8.0f} "
          f"{tm.get('loss', float('nan')):>10.4f} {m['eval_loss']:>13.4f} "
          f"{m['eval_perplexity']:>8.1f} {m['eval_accuracy']:>6.3f} {extra:>14}")
  tokens = rows[0][1]["results"][next(iter(rows[0][1]["results"]))].get("eval_tokens", 0)
  print(f"\nheld-out loss: nats per target token over all {tokens:.0f} target tokens of the "
        "validation split (target half of each mid-split chunk); all-token loss: DecLLM's own "
        "causal-LM loss over every token. The report below scores the first batches only, so "
        "its numbers differ slightly.")
  print("RedLLM learns from half the target tokens per step (the encoder half carries no loss), "
        "as in the paper's pretraining.")
  _suite_report([os.path.join(args.workdir, f"tiny_{f}") for f in ("decllm", "redllm")],
                os.path.join(args.workdir, "report"))
  print("Losses are nats per target token. Reports: <workdir>/eval/step_<N>.json; training "
        "metrics: <workdir>/metrics.jsonl and TensorBoard events in <workdir>/tensorboard.")
  return 0


def _suite_report(workdirs: list[str], output_dir: str) -> None:
  """eval.py --suite on both checkpoints: held-out loss, tasks, length extrapolation, inference
  cost and attention maps, into one side-by-side report."""
  from t5like.evaluation.suite import run_suite
  print(f"\n=== the paper's evaluations, side by side ({output_dir}) ===", flush=True)
  res = run_suite(workdirs, ["ppl", "tasks", "length", "cost", "attention"], output_dir=output_dir,
                  shots=[0, 1], max_batches=4)
  names = {p: f"{os.path.basename(p)}" for p in workdirs}
  for p, c in res["checkpoints"].items():
    tasks = c.get("tasks", {}).get("tasks", {})
    grades = ", ".join(
        f"{t} {s}: {m.get('multiple_choice_grade', m.get('exact_str_match', 0.0)):.2f}"
        for t, per in tasks.items() for s, m in per.items()
        if s.endswith("shot") and isinstance(m, dict) and "error" not in m)
    curve = c.get("length", {}).get("loss", {})
    print(f"{names[p]:<12} length x1..x8 loss: "
          + " ".join(f"{v:.3f}" for v in curve.values()) + f" | {grades}")
  from t5like.evaluation.suite import all_plots, check_failures
  print(f"report: {output_dir}/report.md (tables), plots: " + ", ".join(all_plots(res)))
  check_failures(res, output_dir)  # A suite that failed fails `make demo`.


if __name__ == "__main__":
  sys.exit(main())
