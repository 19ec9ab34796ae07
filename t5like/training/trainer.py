"""``Trainer``: one training run as four verbs — restore, step, evaluate, save — and a loop.

``t5like.training.loop.run`` builds it after the start-up checks and calls ``train()``; the
order of work is in that module's docstring.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

import jax
from etils import epath

from t5like.config import Config, ConfigError, to_dict
from t5like.errors import UserError
from t5like import ops
from t5like.ops import cudnn_packed
from t5like.training.held_out import held_out_metrics, pad_rows
from t5like.training import aot, checkpointing, compile_cache, startup, step_dirs
from t5like.training import data as data_lib
from t5like.training import goodput as goodput_lib
from t5like.training import held_out
from t5like.training import flops as flops_lib
from t5like.training import optimizer as opt_lib
from t5like.training import profile as profile_lib
from t5like.training import state as state_lib
from t5like.training import step as step_lib
from t5like.training.metrics import IntervalStats, MetricsWriter

log = logging.getLogger("t5like.training")


class NonFiniteError(UserError, RuntimeError):
  """Too many consecutive steps with a NaN/Inf loss or gradient."""


def close_iterator(iterator) -> None:
  if iterator is not None and hasattr(iterator, "close"):
    iterator.close()


def _same_layout(abstract, real) -> bool:
  """Whether arrays ``real`` have the shapes, dtypes and shardings of ``abstract`` (then a step
  compiled for ``abstract`` runs on them)."""
  a, r = jax.tree.leaves(abstract), jax.tree.leaves(real)
  return jax.tree.structure(abstract) == jax.tree.structure(real) and all(
      x.shape == y.shape and x.dtype == y.dtype
      and getattr(x, "sharding", None) is not None
      and x.sharding.is_equivalent_to(y.sharding, len(x.shape)) for x, y in zip(a, r))


def lower_and_compile(cfg: Config, setup: state_lib.TrainSetup, train_step, state, batch,
                      cancelled: Callable[[], bool] = lambda: False):
  """(the train step compiled for ``state`` and ``batch`` with its memory checked, seconds); None
  instead of compiling once ``cancelled()``."""
  t0 = time.time()
  lowered = train_step.lower(state, batch)
  if cancelled():
    return None
  return aot.compile_checked(cfg, setup, lowered), time.time() - t0


def compile_ahead(cfg: Config, setup: state_lib.TrainSetup) -> startup.Background:
  """Starts compiling the train step from the abstract state and the data pipeline's batch shapes
  in a background thread, so that opening the data, building or restoring the state and reading
  the first batch overlap the compile; hand it to ``Trainer(ahead=...)``."""
  batch = aot.abstract_batch(cfg, setup.batch_sharding, cfg.train.batch_size)
  return startup.Background(
      lambda cancelled: (batch, lower_and_compile(cfg, setup, step_lib.make_train_step(setup),
                                                  setup.abstract_state, batch, cancelled)),
      "compile-train-step")


_LOGGED = ("loss", "accuracy", "grad_norm", "learning_rate", "tokens_per_sec", "mfu")


def _brief(metrics: dict) -> str:
  """A log line's ``key=value`` pairs (4 significant digits): the train metrics above, or every
  eval metric (all in metrics.jsonl)."""
  keys = [k for k in metrics if k in _LOGGED or k.startswith("eval")]
  return ", ".join(f"{k}={metrics[k]:.4g}" if isinstance(metrics[k], float)
                   else f"{k}={metrics[k]}" for k in keys)


class Trainer:
  """Holds the state of one run (train state, data iterator, checkpointer, metrics)."""

  def __init__(self, cfg: Config, workdir: str, data: data_lib.DataSource,
               setup: state_lib.TrainSetup, ckpt: checkpointing.Checkpointer, train_iter: Any,
               open_train_data: Callable[[], Any], *, init_dir: str | None = None,
               arch_mismatch: Callable[[dict], list[str]] = lambda saved: [],
               step_hook: Callable[[int, Any], None] | None = None, t_start: float = 0.0,
               timeline: startup.Timeline | None = None,
               ahead: startup.Background | None = None):
    self.t_start = t_start or time.time()
    self.timeline = timeline
    self.cfg, self.workdir, self.data, self.setup, self.ckpt = cfg, workdir, data, setup, ckpt
    self._open_train_data, self.init_dir = open_train_data, init_dir
    self._arch_mismatch, self.step_hook = arch_mismatch, step_hook
    self.pid, self.nproc = jax.process_index(), jax.process_count()
    self.eval_rows = cfg.train.eval_batch_size or cfg.train.batch_size
    self.train_iter = train_iter  # Reopened with ``open_train_data`` if hosts restart it.
    self.state, self.resumed_from = None, None
    self.config_dict = to_dict(cfg)
    self.flops_per_step = self.tokens_per_step = 0.0
    self.peak_total = flops_lib.peak_flops_per_device(
        cfg.train.peak_flops_per_device, cfg.model.dtype) * setup.mesh.size
    self.stats = IntervalStats()
    self.last_logged: dict[str, float] = {}
    self.last_eval: dict[str, float] = {}
    self.writer: MetricsWriter | None = None
    self._compiled_step = None  # The train step compiled for this run's shapes (``step``).
    self._ahead = ahead  # Its compile from the abstract shapes, started by ``compile_ahead``.
    self._train_step = step_lib.make_train_step(setup)
    self._eval_step = step_lib.make_eval_step(setup)
    self._check_finite = jax.jit(state_lib.all_finite, out_shardings=setup.replicated)
    self.goodput = goodput_lib.Recorder(workdir, write=self.pid == 0)  # Where the time goes.

  # ---- restore ---------------------------------------------------------------------------------
  def restore(self) -> None:
    """Newest good checkpoint (with the data position), else ``train.init_from``, else random."""
    cfg, setup = self.cfg, self.setup
    if cfg.checkpoint.resume:
      def check_config(saved: dict) -> None:
        bad = self._arch_mismatch(saved)
        if bad:
          raise ConfigError(f"{self.ckpt.directory} holds checkpoints of a different model "
                            f"({'; '.join(bad)}); use a new --workdir or set "
                            "checkpoint.resume=false")
        for change in opt_lib.changed_settings(saved, cfg.train):
          log.warning("resuming with another optimizer setting than the checkpoint was trained "
                      "with (%s); pass the checkpoint's value to keep its behaviour", change)
      with self.goodput.time("restore"):
        restored = self.ckpt.restore(
            setup.abstract_state, self.train_iter if cfg.checkpoint.restore_data else None,
            check_config)
      if restored is not None:
        self.state, self.resumed_from = restored.state, restored.step
        log.info("resumed from checkpoint %s/%d%s", self.ckpt.directory, restored.step,
                 "" if cfg.checkpoint.restore_data else " (data stream restarted: "
                 "checkpoint.restore_data=false)")
        if cfg.checkpoint.restore_data and not restored.data_restored:
          close_iterator(self.train_iter)  # Every host restarts its stream (agreed in restore).
          self.train_iter = self._open_train_data()
    if self.state is None and self.ckpt.unfinished:  # Never a silent start from step 0.
      log.warning("no finished checkpoint in %s (only the unfinished save(s) %s): starting from "
                  "%s", self.ckpt.directory, self.ckpt.unfinished,
                  "train.init_from" if self.init_dir else "step 0")
    if self.state is None and self.init_dir is not None:
      params = step_dirs.restore_params(self.init_dir, setup.abstract_state.params)
      biases = step_dirs.restore_model_state(self.init_dir, setup.abstract_state.model_state)
      self.state = state_lib.fresh_state_from_params(setup, params, biases)
      log.info("initialised parameters from %s (fresh optimizer, step 0)", self.init_dir)
    if self.state is None:
      self.state = state_lib.init_state(setup)
    if self.pid == 0:
      (epath.Path(self.workdir) / "config.json").write_text(
          json.dumps(self.config_dict, indent=2, sort_keys=True))

  # ---- evaluate --------------------------------------------------------------------------------
  def evaluate(self) -> dict[str, float]:
    """Held-out metrics of the current parameters (lock-step over hosts): for a mixture the
    rate-weighted average of its parts plus ``eval/<part>/loss``; extra eval sets as
    ``eval/<name>/loss``; {} when evaluation is off or there is no held-out split."""
    cfg = self.cfg
    if cfg.train.eval_steps == 0:
      return {}
    rows, pid, nproc = self.eval_rows // self.nproc, self.pid, self.nproc
    to_global = lambda b: data_lib.global_batch(  # noqa: E731
        pad_rows(self._checked(b), rows), self.setup.batch_sharding, self.eval_rows)
    eval_step = step_lib.bind_model_state(self._eval_step, self.state.model_state)
    if hasattr(self.data, "eval_parts"):  # A mixture: every part, combined by rate.
      out = held_out.evaluate_parts(eval_step, self.state.params,
                                    self.data.eval_parts(rows, pid, nproc, cfg.train.eval_steps),
                                    to_global)
    else:
      it = self.data.eval(rows, pid, nproc)
      if it is None:
        return {}
      try:
        out = held_out_metrics(eval_step, self.state.params, it, to_global,
                               cfg.train.eval_steps)
      finally:
        close_iterator(it)
    for name, extra in data_lib.extra_eval_iterators(self.data, rows, pid, nproc):
      try:  # data.extra_eval sets (Paloma style): eval/<name>/loss, eval/<name>/accuracy.
        m = held_out_metrics(eval_step, self.state.params, extra, to_global,
                             cfg.train.eval_steps)
      finally:
        close_iterator(extra)
      out.update({f"eval/{name}/{k[5:]}": m[k] for k in ("eval_loss", "eval_accuracy") if out
                  and k in m})
    return out

  # ---- save ------------------------------------------------------------------------------------
  def save(self, step: int) -> None:
    """Checkpoint ``step`` unless it exists or the parameters are not finite."""
    if step in self.ckpt.all_steps():
      return
    if not bool(jax.device_get(self._check_finite(self.state.params))):
      log.error("step %d: parameters are not finite; NOT saving this checkpoint", step)
      return
    with self.goodput.time("checkpoint"):  # Its blocking part (an async write goes on).
      self.ckpt.save(step, self.state, self.config_dict, self.train_iter)

  # ---- step ------------------------------------------------------------------------------------
  def step(self, step: int) -> Any:
    """One optimizer step on the next global batch; returns its (on-device) metrics."""
    try:
      with self.goodput.time("data"):
        local = next(self.train_iter)
    except StopIteration:
      raise ConfigError(f"the training data ran out at step {step}; the training iterator "
                        "must repeat (data pipeline with repeat=True)") from None
    batch = data_lib.global_batch(self._checked(local), self.setup.batch_sharding,
                                  self.cfg.train.batch_size)
    if not self.flops_per_step:
      dec_len, enc_len = flops_lib.batch_lengths(batch)
      self.flops_per_step = flops_lib.train_flops(self.cfg.model, self.cfg.train.batch_size,
                                                  dec_len, enc_len)
      self.tokens_per_step = self.cfg.train.batch_size * (dec_len + enc_len)
    first = self._compiled_step is None
    if first:  # Compiled before the first step runs: memory checked first.
      with self.goodput.time("compile"):
        self._compiled_step = self._compile(batch)
    self.state, metrics = self._compiled_step(self.state, batch)
    if first and self.timeline is not None:
      jax.block_until_ready(metrics)
      self.timeline.mark("first step")
    return metrics

  def _checked(self, local: dict) -> dict:
    """The host's batch, refused with a clear error where cuDNN's packed layout cannot hold it
    (more segments in a row than model.max_segments_per_row)."""
    if ops.resolve(self.cfg.model, self.setup.mesh).attention_impl == "cudnn":
      cudnn_packed.check_batch(self.cfg.model.max_segments_per_row, local)
    return local

  # ---- compile ---------------------------------------------------------------------------------
  def _lower_and_compile(self, state, batch):
    return lower_and_compile(self.cfg, self.setup, self._train_step, state, batch)

  def _compile(self, batch):
    """The train step compiled for ``batch`` and the state: the ahead-of-time compile when its
    abstract shapes are the real ones, else compiled now."""
    ahead, self._ahead = self._ahead, None
    if ahead is not None:
      abstract, (compiled, secs) = ahead.result()
      if _same_layout(abstract, batch) and _same_layout(self.setup.abstract_state, self.state):
        self._mark_compiled(secs, overlapped=True)
        return compiled
      log.info("the batch or state differs from the shapes compiled ahead; compiling again")
    compiled, secs = self._lower_and_compile(self.state, batch)
    self._mark_compiled(secs, overlapped=False)
    return compiled

  def _mark_compiled(self, secs: float, overlapped: bool) -> None:
    cache = compile_cache.describe()  # This run's compiles so far.
    detail = (f"train step lowered and compiled in {secs:.1f} s"
              f"{' (in the background, beside the state and data)' if overlapped else ''}; "
              f"{cache}")
    if self.timeline is not None:
      self.timeline.mark("compiled", detail)
    else:
      log.info("%s", detail)

  def _consume(self, step: int, metrics) -> None:
    """Host side of a finished step: non-finite guard, logging, progress bar."""
    cfg = self.cfg
    m = {k: float(v) for k, v in jax.device_get(metrics).items()}
    self.stats.add(m)
    if m["consecutive_skipped"] >= cfg.train.max_nonfinite_steps:
      self.ckpt.wait()
      raise NonFiniteError(
          f"{int(m['consecutive_skipped'])} consecutive steps (up to step {step}) had a "
          f"non-finite loss or gradient (loss={m['loss']}, grad_norm={m['grad_norm']}); each "
          "was skipped. Lower train.learning_rate, check the data, or raise "
          f"train.max_nonfinite_steps. Last checkpoint: {self.ckpt.latest_step()} in "
          f"{self.ckpt.directory}")
    if not m["finite"]:
      self.writer.message(f"step {step}: non-finite loss/gradient, update skipped "
                          f"({int(m['skipped_steps'])} skipped so far)")
    if step % cfg.train.log_every == 0 or step == cfg.train.steps:
      self.last_logged = self.stats.summary(
          flops_per_step=self.flops_per_step, tokens_per_step=self.tokens_per_step,
          peak_flops_total=self.peak_total, num_devices=self.setup.mesh.size)
      self.last_logged.update(self.goodput.metrics())  # goodput, badput/<cause>: all runs.
      self.writer.write(step, self.last_logged)
      self.stats.reset_clock()
      log.info("step %d: %s", step, _brief(self.last_logged),  # train.log; the console: the bar.
               extra={"file_only": cfg.train.progress_bar})
    postfix = {"loss": self.last_logged.get("loss", m["loss"])}
    if "tokens_per_sec" in self.last_logged:  # Measured at the first log step, not before.
      postfix["tok/s"] = self.last_logged["tokens_per_sec"]
    self.writer.progress(step, postfix)

  # ---- the loop --------------------------------------------------------------------------------
  def train(self, preemption) -> dict[str, Any]:
    """Steps to ``train.steps`` (saving, evaluating on schedule; stopping early at a preemption
    point after a checkpoint) and returns the final metrics."""
    cfg = self.cfg
    step = start = int(jax.device_get(self.state.step))
    total = cfg.train.steps
    self.writer = MetricsWriter(self.workdir, total_steps=total, start_step=start,
                                progress_bar=cfg.train.progress_bar)
    pending, preempted = None, False
    profiler = profile_lib.StepProfiler(cfg.train, self.workdir)
    self.goodput.loop_started(step)
    try:
      while step < total:
        profiler.before_step(step)
        metrics = self.step(step)
        step += 1
        self.goodput.step_done(step)
        profiler.after_step(step, metrics)
        if pending is not None:
          self._consume(*pending)  # Step s-1's metrics, fetched once step s is dispatched.
        else:
          self.stats.reset_clock()  # Exclude compilation from the first throughput interval.
        pending = (step, metrics)
        if cfg.checkpoint.every and step % cfg.checkpoint.every == 0 and step < total:
          self.save(step)
        if cfg.train.eval_every and step % cfg.train.eval_every == 0 and step < total:
          self._periodic_eval(step)
        if self.step_hook is not None:
          self.step_hook(step, self.ckpt)
        if step < total and preemption.reached(step, self.ckpt.manager):
          self._consume(*pending)
          pending = None
          self.save(step)
          self.ckpt.wait()
          preempted = getattr(preemption, "reason", "") or True
          self.writer.message(f"{'preemption signal' if preempted is True else preempted} at "
                              f"step {step}: checkpoint {self.ckpt.latest_step()} saved in "
                              f"{self.ckpt.directory}; the same command resumes from it")
          break
      if pending is not None:
        self._consume(*pending)
      final_step = int(jax.device_get(self.state.step))
      if not preempted:
        with self.goodput.time("eval"):
          self.last_eval = self.evaluate() or self.last_eval
        if self.last_eval:
          self.writer.write(final_step, self.last_eval)
        if cfg.checkpoint.save_at_end:
          self.save(final_step)
      with self.goodput.time("checkpoint"):
        self.ckpt.wait()
    finally:
      profiler.stop()
      self.writer.close()
    return self._result(final_step, preempted)

  def _periodic_eval(self, step: int) -> None:
    t_eval = time.perf_counter()
    with self.goodput.time("eval"):
      self.last_eval = self.evaluate()
    self.stats.pause(time.perf_counter() - t_eval)  # Eval time is not training throughput.
    if self.last_eval:
      self.writer.write(step, self.last_eval)
      self.writer.message(f"step {step}: eval_loss {self.last_eval['eval_loss']:.4f}")
      log.info("step %d: %s", step, _brief(self.last_eval), extra={"file_only": True})

  def _result(self, final_step: int, preempted: bool | str) -> dict[str, Any]:
    result = dict(self.last_logged)
    result.update(self.last_eval)
    result.update({
        "step": final_step, "preempted": bool(preempted),
        "stopped_by": preempted if isinstance(preempted, str) else None,
        "resumed_from_step": self.resumed_from,
        "num_params": self.setup.num_params, "workdir": self.workdir,
        "checkpoint_dir": self.ckpt.directory, "metrics_file": self.writer.jsonl_path,
        "tensorboard_dir": self.writer.tb_dir, "wall_time_s": time.time() - self.t_start,
        "flops_per_step": self.flops_per_step, "latest_checkpoint": self.ckpt.latest_step(),
    })
    result.update(self._goodput_summary())
    log.info("done at step %d: %s", final_step,
             ", ".join(f"{k}={v:.4g}" for k, v in result.items()
                       if k in ("loss", "eval_loss", "eval_accuracy", "tokens_per_sec", "mfu")),
             extra={"file_only": preempted == "Ctrl-C"})  # Ctrl-C: one console line, above.
    return result

  def _goodput_summary(self) -> dict[str, Any]:
    done = self.goodput.finish()
    total = goodput_lib.shares(done["total"])
    log.info("goodput %.1f%% of %.0f s over %d run(s) of this workdir (this run: %.1f%%); "
             "python -m t5like.tools.goodput %s", 100 * total.get("goodput", 0),
             done["total"]["wall_s"], done["total"]["runs"],
             100 * goodput_lib.shares(done["run"]).get("goodput", 0), self.workdir)
    return {**total, "goodput_run": done["run"], "goodput_total": done["total"]}

  def close(self) -> None:
    close_iterator(self.train_iter)
    self.ckpt.close()
