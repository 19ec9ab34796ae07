"""Run the paper's claims as experiments: ``python -m t5like.experiments NAME ... --output_dir D``.

  python -m t5like.experiments scaling --output_dir runs/exp/scaling --quick
  python -m t5like.experiments all --output_dir runs/exp            # each under runs/exp/<name>
  python -m t5like.experiments scaling --scale paper --workdir_root gs://bucket/exp   # commands

Experiments are ``configs/experiments/<name>.py`` (the checkout's configs/, or ``./configs``, or
``$T5LIKE_CONFIGS``). Re-running skips finished runs; the report (``report.md``,
``results.json``, PNGs) is rewritten from all results each time. Expected errors print as
``error: ...`` (``--debug`` or ``T5LIKE_DEBUG=1``: with the traceback). Of several experiments,
one that fails is reported in one line and the others still run; the command then fails.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shlex
import sys

from t5like import cli
from t5like.config import ConfigError
from t5like.errors import UserError
from t5like.experiments.runner import configs_dir, run_experiment


def experiments_dir() -> str:
  return os.path.join(configs_dir(), "experiments")


def available() -> list[str]:
  return sorted(f[:-3] for f in os.listdir(experiments_dir())
                if f.endswith(".py") and not f.startswith("_"))


def load_experiment(name: str, budget: str):
  path = os.path.join(experiments_dir(), f"{name}.py")
  if not os.path.exists(path):
    raise ConfigError(f"unknown experiment {name!r}; available: {', '.join(available())} "
                      f"(files in {experiments_dir()})")
  spec = importlib.util.spec_from_file_location(f"t5like_experiment_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)  # type: ignore[union-attr]
  return module.get_experiment(budget)


def paper_commands(spec, workdir_root: str, data_dir: str, flan_dir: str,
                   vocab_path: str = "gs://YOUR_BUCKET/vocab/spm32k.model",
                   validation_holdout: float = 0.001, table=None) -> list[str]:
  """train.py / eval.py command lines of the experiment at paper scale; with ``table`` (the TPU
  table's rows, ``budget.read_table``) each train command is followed by its cost per slice and
  the experiment by its total (``budget``)."""
  from t5like.experiments import budget
  lines, totals = [], {}
  for run in spec.paper_runs:
    workdir = f"{workdir_root.rstrip('/')}/{spec.name}/{run.name}"
    train = ["python", "train.py", "--config", f"configs/{run.config}", "--workdir", workdir]
    overrides = [o.format(data_dir=data_dir, flan_dir=flan_dir) for o in run.overrides]
    if any(o.startswith("data.data_dir=") for o in run.overrides):  # Paper presets require both.
      overrides += [f"data.vocab_path={vocab_path}", f"data.validation_holdout={validation_holdout}"]
    if run.init_from_run:
      overrides.append(f"train.init_from={workdir_root.rstrip('/')}/{spec.name}/"
                       f"{run.init_from_run}")
    train += [f"--config.{o}" for o in overrides]
    lines.append(shlex.join(train))
    if table is not None:
      lines += budget.run_lines(os.path.join(configs_dir(), run.config), overrides, table,
                                totals, train)
    for overrides in [run.eval_overrides] + [ov for _, ov in run.evals]:
      lines.append(shlex.join(["python", "eval.py", "--workdir", workdir]
                              + [f"--config.{o}" for o in overrides]))
  if table is not None:
    lines += budget.total_lines(spec.name, len(spec.paper_runs), totals)
  return lines


def run_one(name: str, budget: str, output_dir: str) -> int:
  from t5like.experiments.report import write_report
  spec = load_experiment(name, budget)
  print(f"=== experiment {name} ({budget}): {len(spec.runs)} runs in {output_dir} ===",
        flush=True)
  results = run_experiment(spec, output_dir,
                           on_run=lambda run, what: print(f"  {run}: {what}", flush=True))
  analysis = importlib.import_module(f"t5like.experiments.{spec.analysis}").analyse(
      spec, results, output_dir)
  paths = write_report(spec, results, analysis, output_dir)
  for v in analysis.verdicts:
    print(f"  [{v.verdict:>12}] {v.claim}: {v.evidence}")
  print(f"  report: {paths['report']}")
  return 0


def _compilation_cache(output_dir: str) -> None:
  """Runs of the same shapes (other seeds, re-runs) reuse compiled steps: a persistent cache."""
  if "://" in output_dir:
    return
  import jax
  jax.config.update("jax_compilation_cache_dir", os.path.join(output_dir, ".jax_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def main(argv: list[str] | None = None) -> int:
  return cli.guard(_main, argv)


def _main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("names", nargs="+", help="experiments (files in configs/experiments/) or all")
  parser.add_argument("--output_dir", default=os.path.join("runs", "exp"),
                      help="where runs and reports go (several experiments: <dir>/<name>)")
  parser.add_argument("--quick", action="store_true", help="the quick budget (plumbing check)")
  parser.add_argument("--scale", choices=("laptop", "paper"), default="laptop",
                      help="paper: print the pod commands of the same experiment and exit")
  parser.add_argument("--workdir_root", default="gs://YOUR_BUCKET/t5like-experiments",
                      help="--scale paper: where the pod runs write")
  parser.add_argument("--data_dir", default="gs://YOUR_BUCKET/redpajama_v1",
                      help="--scale paper: the RedPajama V1 root the pretraining runs read")
  parser.add_argument("--flan_dir", default="gs://YOUR_BUCKET/flan",
                      help="--scale paper: the FLAN root the instruction-tuning runs read")
  parser.add_argument("--vocab_path", default="gs://YOUR_BUCKET/vocab/spm32k.model",
                      help="--scale paper: the 32,768-piece vocabulary (t5like.tools.build_vocab)")
  parser.add_argument("--validation_holdout", type=float, default=0.001,
                      help="--scale paper: fraction of documents held out when a corpus has no "
                           "validation files")
  parser.add_argument("--tpu_table", nargs="*", default=None,
                      help="--scale paper: where each run's slice, setting, step time and "
                           "chip-hours come from: TPU table pages (docs/pods.md) or results files "
                           "of t5like.tools.tpu_table, later ones first (default: docs/pods.md, "
                           "then runs/tpu_table.json if it exists); none given: no costs")
  cli.add_debug_argument(parser)
  args = parser.parse_args(argv)
  names = available() if args.names == ["all"] else args.names
  budget = "quick" if args.quick else "full"
  if args.scale == "paper":
    from t5like.experiments import budget as cost
    tables = cost.default_tables(configs_dir()) if args.tpu_table is None else args.tpu_table
    missing = [t for t in (args.tpu_table or []) if not cost.exists(t)]
    if missing:  # Named by the user: a typo must not silently drop the costs.
      raise UserError(f"--tpu_table: no such file: {', '.join(missing)} (a TPU table page such as docs/pods.md, or a results file of python -m t5like.tools.tpu_table)")
    table = cost.read_table(tables) if tables else None
    for name in names:
      print(f"# {name}")
      print("\n".join(paper_commands(load_experiment(name, budget), args.workdir_root,
                                     args.data_dir, args.flan_dir, args.vocab_path,
                                     args.validation_holdout, table)))
    return 0
  for name in names:  # Unknown names fail before anything is set up.
    load_experiment(name, budget)
  from t5like import runtime
  runtime.init_tensorflow()
  _compilation_cache(args.output_dir)
  failed = []
  for name in names:
    out = args.output_dir if len(names) == 1 else os.path.join(args.output_dir, name)
    try:
      run_one(name, budget, out)
    except Exception as e:  # noqa: BLE001 - one line; the experiments after it still run.
      failed.append(f"experiment {name} failed: {type(e).__name__}: "
                    f"{(str(e).splitlines() or [''])[0][:300]}")
      print(f"  {failed[-1]}", flush=True)
      if cli.debugging(argv):
        import traceback
        traceback.print_exception(e)
  if failed:
    raise ExperimentsFailed("\n".join(failed) + f"\n({len(names) - len(failed)} of "
                            f"{len(names)} experiments finished; --debug for the tracebacks)")
  return 0


class ExperimentsFailed(UserError):
  """Some experiments of ``all`` (or a list) failed; the others ran."""


if __name__ == "__main__":
  sys.exit(main())
