"""Evaluate a saved checkpoint: held-out loss, perplexity and accuracy per task (``eval.py``).

The checkpoint's own resolved config rebuilds the model; the mesh defaults to pure FSDP over the
devices at hand (a run trained on a pod evaluates on one host), and any key can be overridden.
Results go to ``<workdir>/eval/step_<N>.json`` and are printed as a table.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Sequence

import jax
from etils import epath

from t5like import partitioning
from t5like.config import ConfigError
from t5like.training.held_out import pad_rows
from t5like.training.restore import find_step_dir, load_checkpoint_config


def evaluate_checkpoint(path: str, *, step: int | None = None, overrides: Sequence[str] = (),
                        mixtures: Sequence[str] = (), per_task: bool = True,
                        max_batches: int = 0, write: bool = True) -> dict[str, Any]:
  """Restores the parameters of a checkpoint and scores its held-out split(s).

  Args:
    path: a workdir, its ``checkpoints/`` directory or one ``<step>`` directory.
    step: a specific step (default: the newest).
    overrides: dotted config overrides applied to the stored config (e.g. data settings).
    mixtures: what to score (default: ``data.eval_mixture`` or ``data.mixture``).
    per_task: also report each direct part of every mixture.
    max_batches: global batches per mixture, split across its parts by rate (at least one
      each); 0: every validation row. A mixture's loss is the rate-weighted average of its
      parts' losses, on the same rows as the trainer's periodic eval (``t5like.data.held_out``).
    write: write ``<workdir>/eval/step_<N>.json``.
  """
  from t5like.data import held_out as data_held_out, pipeline
  from t5like.training import held_out, state as state_lib, step as step_lib, step_dirs
  from t5like.training.data import global_batch

  t0 = time.time()
  step_dir = find_step_dir(path, step)
  cfg = load_checkpoint_config(step_dir, overrides)
  mesh = partitioning.make_mesh(cfg.mesh)
  setup = state_lib.build_setup(cfg, mesh)
  params = step_dirs.restore_params(step_dir, setup.abstract_state.params)
  biases = step_dirs.restore_model_state(step_dir, setup.abstract_state.model_state)
  eval_step = step_lib.bind_model_state(step_lib.make_eval_step(setup), biases)
  pid, nproc = jax.process_index(), jax.process_count()
  rows = cfg.train.eval_batch_size or cfg.train.batch_size
  if rows % nproc:
    raise ConfigError(f"eval batch {rows} rows is not divisible by {nproc} processes")
  local_rows = rows // nproc
  names = list(mixtures) or [cfg.data.eval_mixture or cfg.data.mixture]
  to_global = lambda b: global_batch(pad_rows(b, local_rows), setup.batch_sharding, rows)  # noqa
  results: dict[str, dict[str, float]] = {}
  for name in names:  # A mixture: its parts' fixed samples, combined by rate (as the trainer).
    parts = data_held_out.parts(cfg, name)
    scored = held_out.score_parts(eval_step, params, [
        (p.full, p.rate, data_held_out.sample_iterator_factory(
            cfg, p, batches=n, global_rows=rows, batch_size=local_rows, shard_index=pid,
            num_shards=nproc), n)
        for p, n in zip(parts, data_held_out.part_batches(parts, max_batches))], to_global)
    results[name] = {k: v for k, v in held_out.combine(scored).items()
                     if not k.startswith("eval/")}
    if per_task and len(parts) > 1:
      results.update({part: metrics for part, _, metrics in scored})
  step_num = int(epath.Path(step_dir).name)
  report = {"checkpoint": step_dir, "step": step_num, "family": cfg.model.family,
            "decoder_attention": cfg.model.decoder_attention,
            "objective": pipeline.resolve_objective(cfg, names[0]),
            "num_params": setup.num_params, "results": results,
            "seconds": round(time.time() - t0, 1)}
  if write and pid == 0:
    out_dir = epath.Path(step_dir).parent.parent / "eval"
    out_dir.mkdir(parents=True, exist_ok=True)
    report["file"] = os.fspath(out_dir / f"step_{step_num}.json")
    epath.Path(report["file"]).write_text(json.dumps(report, indent=2, sort_keys=True))
  return report


def format_report(report: dict[str, Any]) -> str:
  """A plain-text table of one ``evaluate_checkpoint`` result."""
  lines = [f"{report['family']} ({report['num_params'] / 1e6:.2f}M params), step "
           f"{report['step']}, objective {report['objective']}: {report['checkpoint']}",
           f"{'task':<40} {'tokens':>9} {'loss':>8} {'ppl':>9} {'acc':>7}"]
  for task, m in report["results"].items():
    if not m:
      lines.append(f"{task:<40} {'(empty validation split)':>35}")
      continue
    lines.append(f"{task:<40} {int(m['eval_tokens']):>9} {m['eval_loss']:>8.4f} "
                 f"{m['eval_perplexity']:>9.2f} {m['eval_accuracy']:>7.3f}")
  return "\n".join(lines)
