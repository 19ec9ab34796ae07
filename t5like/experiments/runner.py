"""Runs an experiment's training runs and scores them, skipping runs that already finished.

Each run trains in ``<output_dir>/runs/<name>`` with train.py's own loop (so an interrupted run
resumes from its last checkpoint) and is then scored on held-out data with eval.py's scoring.
A finished run leaves ``result.json`` holding the run's digest and its resolved config's digest:
re-running the experiment skips it, and a changed spec (other size, steps, seed, ...) or a changed
default of the config it resolves to (e.g. an optimizer setting) retrains it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from typing import Any, Callable

from etils import epath

from t5like.config import ConfigError
from t5like.experiments.spec import ExperimentSpec, RunSpec

log = logging.getLogger(__name__)
RESULT = "result.json"
CONFIGS_ENV = "T5LIKE_CONFIGS"
# The checkout this package was imported from (an editable install or PYTHONPATH=checkout).
_CHECKOUT_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "configs")


def configs_dir() -> str:
  """The ``configs/`` folder the experiments' runs name their config files in: ``$T5LIKE_CONFIGS``,
  else the checkout the package was imported from, else ``./configs``. An installed (non-editable)
  package has no checkout around it, so it reads the one of the working directory or the
  variable; none of them is an error that says so."""
  tried = []
  for where in (os.environ.get(CONFIGS_ENV, ""), _CHECKOUT_CONFIGS,
                os.path.join(os.getcwd(), "configs")):
    if where and os.path.isdir(os.path.join(where, "experiments")):
      return where
    if where:
      tried.append(where)
  raise ConfigError(f"no configs/ folder with experiments/ found (tried {', '.join(tried)}): run "
                    f"from a t5like checkout, or set {CONFIGS_ENV}=<checkout>/configs")


def run_config(run: RunSpec, workdirs: dict[str, str]):
  """The resolved config of a run (its file, its overrides, and init_from for finetuning)."""
  from t5like.config import load_config
  overrides = list(run.overrides)
  if run.init_from_run:
    overrides.append(f"train.init_from={workdirs[run.init_from_run]}")
  return load_config(os.path.join(configs_dir(), run.config), overrides)


def config_digest(cfg) -> str:
  """Digest of a run's resolved config: every field, defaults included, but ``train.init_from``
  (a path; the run it starts from is part of the spec's own digest)."""
  from t5like.config import to_dict
  fields = to_dict(cfg)
  fields["train"].pop("init_from", None)
  blob = json.dumps(fields, sort_keys=True, default=str)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


def sequence_lengths(cfg) -> tuple[int, int]:
  """(decoder_length, encoder_length) of the training batches (encoder 0 for DecLLM)."""
  if cfg.model.family == "redllm":
    return cfg.data.targets_length, cfg.data.inputs_length
  return cfg.data.sequence_length, 0


def measure(cfg, train_metrics: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
  """The numbers every analysis may use, from a finished run and its held-out report."""
  from t5like.evaluation.cost import inference_flops
  from t5like.models.param_count import analytic_param_count
  from t5like.training import flops
  dec_len, enc_len = sequence_lengths(cfg)
  steps, batch = cfg.train.steps, cfg.train.batch_size
  params = analytic_param_count(cfg.model)
  (scores,) = report["results"].values()
  return {
      "family": cfg.model.family,
      "params": params,
      "non_embedding_params": params - cfg.model.vocab_size * cfg.model.d_model,
      "train_flops": flops.train_flops(cfg.model, batch, dec_len, enc_len) * steps,
      "train_tokens": steps * batch * (dec_len + enc_len),
      # Prefill of the input + KV-cache decode of the target (t5like.evaluation.cost), the same
      # input/target lengths for both families.
      "inference_flops_per_sequence": inference_flops(
          cfg.model, cfg.data.inputs_length, cfg.data.targets_length)["total"],
      "steps": steps,
      "train_loss": train_metrics.get("loss"),
      "eval_loss": scores.get("eval_loss"),
      "eval_accuracy": scores.get("eval_accuracy"),
      "eval_tokens": scores.get("eval_tokens"),
      "objective": report.get("objective"),
  }


def run_experiment(spec: ExperimentSpec, output_dir: str, *,
                   on_run: Callable[[str, str], None] | None = None) -> dict[str, dict[str, Any]]:
  """Trains and scores every run of ``spec`` not finished yet; returns results by run name."""
  from t5like.evaluation.checkpoint_eval import evaluate_checkpoint
  from t5like.training import run as train

  spec.validate()
  root = epath.Path(output_dir) / "runs"
  root.mkdir(parents=True, exist_ok=True)
  workdirs = {r.name: str(root / r.name) for r in spec.runs}
  results: dict[str, dict[str, Any]] = {}
  for i, run in enumerate(spec.runs):
    done = epath.Path(workdirs[run.name]) / RESULT
    cfg = run_config(run, workdirs)
    if done.exists():
      prev = json.loads(done.read_text())
      if prev.get("digest") == run.digest() and prev.get("config") == config_digest(cfg):
        results[run.name] = _extra_evals(run, prev, spec.eval_batches, done)
        _notify(on_run, run.name, "skipped (finished earlier)")
        continue
      log.warning("run %s changed since it finished (%s); training it again", run.name,
                  "its spec" if prev.get("digest") != run.digest() else
                  "the config it resolves to, e.g. a default")
    _notify(on_run, run.name, f"training ({i + 1}/{len(spec.runs)})")
    t0 = time.time()
    train_metrics = train(cfg, workdirs[run.name])
    train_s = time.time() - t0
    report = evaluate_checkpoint(workdirs[run.name], overrides=run.eval_overrides,
                                 per_task=False, max_batches=spec.eval_batches, write=False)
    result = {"name": run.name, "digest": run.digest(), "config": config_digest(cfg),
              "tags": dict(run.tags),
              "workdir": workdirs[run.name], "train_seconds": round(train_s, 1),
              **measure(cfg, train_metrics, report)}
    done.write_text(json.dumps(result, indent=2, sort_keys=True, default=str))
    results[run.name] = _extra_evals(run, result, spec.eval_batches, done)
  return results


def _extra_evals(run: RunSpec, result: dict[str, Any], eval_batches: int,
                 done: epath.Path) -> dict[str, Any]:
  """Scores the run's extra evals that ``result`` does not hold yet, and stores them."""
  from t5like.evaluation.checkpoint_eval import evaluate_checkpoint
  evals = result.setdefault("evals", {})
  todo = [(label, list(ov)) for label, ov in run.evals
          if evals.get(label, {}).get("overrides") != list(ov)]  # New, or its settings changed.
  for label, overrides in todo:
    report = evaluate_checkpoint(result["workdir"], overrides=overrides, per_task=False,
                                 max_batches=eval_batches, write=False)
    (scores,) = report["results"].values()
    evals[label] = {**scores, "overrides": overrides}
  tasks_todo = run.tasks and result.get("tasks", {}).get("files") != list(run.tasks)
  if tasks_todo:
    result["tasks"] = {"files": list(run.tasks), "scores": task_scores(result["workdir"],
                                                                       run.tasks)}
  if todo or tasks_todo:
    done.write_text(json.dumps(result, indent=2, sort_keys=True, default=str))
  return result


def task_scores(workdir: str, task_paths: tuple[str, ...]) -> dict[str, dict[str, float]]:
  """0-shot scores of the newest checkpoint on BIG-bench-format tasks ("shipped": the project's
  small tasks): {task: {metric: value}}; a task that fails is recorded with its error."""
  from t5like.data.vocab import get_vocabulary
  from t5like.evaluation import bigbench
  from t5like.training.restore import restore_model
  from t5like.evaluation.downstream import score_tasks
  paths = [bigbench.shipped_tasks_dir() if p == "shipped" else p for p in task_paths]
  tasks, errors = bigbench.load_tasks(paths)
  model, cfg, _ = restore_model(workdir)
  scored = score_tasks(model, get_vocabulary(cfg.data.vocab_path), tasks, shots=(0,))
  out = {name: per["0-shot"] for name, per in scored["tasks"].items()}
  out.update({path: {"error": e} for path, e in errors.items()})
  return out


def _notify(on_run, name: str, what: str) -> None:
  if on_run is not None:
    on_run(name, what)
  log.info("run %s: %s", name, what)
