"""``eval.py --suite``: the paper's evaluations of one or more checkpoints, side by side.

Suites: ``ppl`` (held-out loss on the target halves, like for like across families), ``tasks``
(zero-/few-shot BIG-bench-format tasks), ``length`` (held-out loss at 1x-8x the training length),
``cost`` (analytic inference FLOPs per sequence; measured sequences/s with the KV cache),
``attention`` (rank, Dong ratio, locality, heatmaps), ``experts`` (MoE checkpoints: expert
assignment per data subset, preferred tokens, load entropy; ``experts.py``). Writes ``results.json`` (every number, checkpoint path, step, config hash, task file
hashes), ``report.md`` and PNGs into the output directory. A suite that fails for one checkpoint
is recorded with its error (one log line; the traceback with ``T5LIKE_DEBUG=1``) and the others
still run; ``check_failures`` then fails the command, naming each suite and checkpoint, after the
report (which says what is missing and why) is written.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from typing import Any, Sequence

from etils import epath

from t5like.config import ConfigError
from t5like.errors import UserError
from t5like.evaluation import bigbench, cost

log = logging.getLogger(__name__)
SUITES = ("ppl", "tasks", "length", "cost", "attention", "experts")
FACTORS = (1, 2, 4, 8)


class SuiteFailed(UserError):
  """One or more suites failed for a checkpoint (the report says which and why)."""


def failures(results: dict) -> list[tuple[str, str, str]]:
  """(suite, checkpoint path, error) of every suite that failed."""
  return [(name, path, c[name]["error"]) for path, c in results["checkpoints"].items()
          for name in results["suites"] if isinstance(c.get(name), dict) and "error" in c[name]]


def check_failures(results: dict, output_dir: str) -> None:
  """Raises ``SuiteFailed`` (one line per failed suite) if any suite failed."""
  bad = failures(results)
  if bad:
    raise SuiteFailed("\n".join(f"suite {s} failed for {p}: {e}" for s, p, e in bad)
                      + f"\n(the other results: {output_dir}/report.md)")


def _train_lengths(cfg) -> tuple[int, int]:
  """(input, target) lengths the model was trained with (DecLLM causal: halves of a sequence)."""
  if cfg.model.family == "redllm" or cfg.data.objective in ("prefix", "inputs_targets"):
    return cfg.data.inputs_length, cfg.data.targets_length
  return cfg.data.sequence_length // 2, cfg.data.sequence_length - cfg.data.sequence_length // 2


def _ppl(path, step, max_batches, overrides=()):
  from t5like.evaluation.checkpoint_eval import evaluate_checkpoint
  report = evaluate_checkpoint(path, step=step, overrides=["data.objective=prefix", *overrides],
                               per_task=False, max_batches=max_batches, write=False)
  (scores,) = report["results"].values()
  return scores


def _length(path, step, cfg, max_batches):
  inp, tgt = _train_lengths(cfg)
  curve, tokens = {}, {}
  for k in FACTORS:
    scores = _ppl(path, step, max_batches, (
        f"data.inputs_length={k * inp}", f"data.targets_length={k * tgt}",
        f"data.sequence_length={k * (inp + tgt)}", "train.eval_batch_size=4"))
    curve[f"x{k}"], tokens[f"x{k}"] = scores["eval_loss"], scores.get("eval_tokens")
  return {"train_input_length": inp, "train_target_length": tgt, "loss": curve,
          "tokens": tokens}


def _cost(model, cfg, lengths: Sequence[tuple[int, int]]) -> dict[str, Any]:
  out: dict[str, Any] = {"flops": {f"{n}+{m}": cost.inference_flops(cfg.model, n, m)
                                   for n, m in lengths}}
  from t5like.inference import Generator
  n, m = lengths[0]
  prompts = [[3 + (i * 7 + j) % 200 for j in range(n)] for i in range(8)]
  generate = Generator(model)  # The decode layout made once, outside the timed call.
  generate(prompts, max_new_tokens=m, eos_id=-1)  # Compile.
  t0 = time.perf_counter()
  outs = generate(prompts, max_new_tokens=m, eos_id=-1)
  secs = time.perf_counter() - t0
  out["measured"] = {"batch": 8, "input": n, "output": m, "sequences_per_s": 8 / secs,
                     "new_tokens_per_s": sum(len(o) for o in outs) / secs}
  return out


def _attention(model, cfg, output_dir, tag):
  from t5like.evaluation import attention_analysis as aa
  maps = aa.attention_maps(model, aa.held_out_batch(cfg, 4))
  png = epath.Path(output_dir) / f"attention_{tag}.png"
  aa.plot_heads(aa.panels(maps), png, title=f"{tag}: attention maps, held-out row 0")
  return {"layers": aa.summarize(maps), "heatmaps": png.name}


def _experts(model, cfg, output_dir, tag, query: str, max_batches: int) -> dict[str, Any]:
  from t5like.data.vocab import get_vocabulary
  from t5like.evaluation import experts
  if not cfg.model.moe.enabled:
    raise ValueError("--suite experts needs an MoE checkpoint (model.moe.num_experts > 0)")
  vocab = get_vocabulary(cfg.data.vocab_path)
  pieces = {p: list(vocab.encode(p)) for p in query.split()}
  counts, per_token = experts.count_routes(
      model, experts.subset_batches(cfg, 8, max_batches), cfg.model.vocab_size)
  layers = experts.summarize(counts, per_token,
                             query_tokens=sorted({i for ids in pieces.values() for i in ids}))
  for layer in layers.values():
    layer["top_pieces"] = [[vocab.decode([t]) for t in ts] for ts in layer["top_tokens"]]
  png = epath.Path(output_dir) / f"experts_{tag}.png"
  experts.plot(layers, str(png), f"{tag}: routed pairs per data subset")
  return {"layers": layers, "query_tokens": pieces, "heatmaps": png.name}


def evaluate_one(path: str, suites: Sequence[str], *, step: int | None, tasks, shots,
                 output_dir: str, max_batches: int, max_context: int, on_long: str,
                 cost_lengths: Sequence[tuple[int, int]],
                 expert_tokens: str = "") -> dict[str, Any]:
  from t5like.config import to_json
  from t5like.data.vocab import get_vocabulary
  from t5like.training.restore import restore_model
  from t5like.evaluation.downstream import score_tasks
  model, cfg, step_dir = restore_model(path, step=step, overrides=["data.objective=prefix"])
  tag = epath.Path(path).name or "model"
  out: dict[str, Any] = {"checkpoint": step_dir, "step": int(epath.Path(step_dir).name),
                         "family": cfg.model.family,
                         "decoder_attention": cfg.model.decoder_attention,
                         "config_sha256": hashlib.sha256(to_json(cfg).encode()).hexdigest()}
  jobs = {
      "ppl": lambda: _ppl(path, step, max_batches),
      "tasks": lambda: score_tasks(model, get_vocabulary(cfg.data.vocab_path), tasks,
                                   shots=shots, max_context=max_context, on_long=on_long),
      "length": lambda: _length(path, step, cfg, max_batches),
      "cost": lambda: _cost(model, cfg, cost_lengths),
      "attention": lambda: _attention(model, cfg, output_dir, tag),
      "experts": lambda: _experts(model, cfg, output_dir, tag, expert_tokens, max_batches)}
  for name in suites:
    try:
      out[name] = jobs[name]()
      png = out[name].get("heatmaps") if isinstance(out[name], dict) else None
      if png is not None and not (epath.Path(output_dir) / png).exists():
        raise RuntimeError(f"it wrote no plot ({png} is missing)")
    except Exception as e:  # noqa: BLE001 — recorded; the other suites still run.
      first = (str(e).splitlines() or [""])[0][:500]
      log.error("suite %s failed for %s: %s: %s", name, path, type(e).__name__, first,
                exc_info=os.environ.get("T5LIKE_DEBUG", "") not in ("", "0"))
      out[name] = {"error": f"{type(e).__name__}: {first}"}
  return out


def all_plots(results: dict) -> list[str]:
  """Every PNG of a suite run: the side-by-side plots and each checkpoint's maps."""
  return list(results["plots"]) + [
      c[name]["heatmaps"] for c in results["checkpoints"].values() for name in results["suites"]
      if isinstance(c.get(name), dict) and "heatmaps" in c[name]]


def run_suite(paths: Sequence[str], suites: Sequence[str], *, output_dir: str,
              step: int | None = None, task_paths: Sequence[str] = (),
              shots: Sequence[int] = (0,), max_batches: int = 8, max_context: int = 1024,
              on_long: str = "truncate",
              cost_lengths: Sequence[tuple[int, int]] = ((128, 64), (512, 128)),
              expert_tokens: str = "") -> dict:
  bad = [s for s in suites if s not in SUITES]
  if bad:
    raise ConfigError(f"unknown --suite {bad}; choose from {', '.join(SUITES)}")
  out = epath.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  seqio_cfg = None
  if any(t.startswith(bigbench.SEQIO_PREFIX) for t in task_paths):
    from t5like.training.restore import find_step_dir, load_checkpoint_config
    seqio_cfg = load_checkpoint_config(find_step_dir(paths[0], step))  # Its data settings.
  tasks, task_errors = bigbench.load_tasks(list(task_paths) or [bigbench.shipped_tasks_dir()],
                                           seqio_cfg)
  results = {"suites": list(suites), "shots": list(shots), "task_errors": task_errors,
             "task_files": {t.path: t.sha256 for t in tasks}, "checkpoints": {}}
  for path in paths:
    log.info("evaluating %s: %s", path, ", ".join(suites))
    results["checkpoints"][path] = evaluate_one(
        path, suites, step=step, tasks=tasks, shots=shots, output_dir=output_dir,
        max_batches=max_batches, max_context=max_context, on_long=on_long,
        cost_lengths=cost_lengths, expert_tokens=expert_tokens)
  from t5like.evaluation.report import plots, write_markdown
  results["plots"] = plots(results, output_dir)
  (out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True, default=str))
  (out / "report.md").write_text(write_markdown(results))
  return results

