"""``run(cfg, workdir)``: the training loop, from config checks to the final checkpoint.

Order of work (everything that can be misconfigured fails before anything is compiled):
  1. multi-process start-up, mesh from ``cfg.mesh`` (must use every device), batch divisibility,
     ``train.init_from`` existence, data iterators (missing data fails here);
  2. abstract sharded state; resume from the newest good checkpoint in the workdir (with its
     data-iterator position), else parameters from ``train.init_from``, else random init;
  3. steps: global batch assembled from per-host rows, jitted step (donated state), metrics of
     step s fetched after step s+1 is dispatched (keeps the device busy), checkpoints every
     ``checkpoint.every`` steps, held-out eval every ``train.eval_every`` steps;
  4. at the end (or on SIGTERM / preemption): final checkpoint, eval, metrics, return.
"""
from __future__ import annotations

import json
import logging
import signal
import threading
import time
from typing import Any, Callable

import jax
from etils import epath

from t5like import partitioning, paths
from t5like.config import Config, ConfigError, to_dict
from t5like.evaluation.perplexity import held_out_metrics, pad_rows
from t5like.training import checkpointing, distributed
from t5like.training import data as data_lib
from t5like.training import flops as flops_lib
from t5like.training import state as state_lib
from t5like.training import step as step_lib
from t5like.training.metrics import IntervalStats, MetricsWriter

log = logging.getLogger("t5like.training")

# Model fields that decide parameter shapes/meaning: a checkpoint only fits a model that agrees
# on all of them. The others (dtype, dropout, remat, scan, attention masks) may differ.
ARCH_FIELDS = ("family", "vocab_size", "d_model", "num_heads", "num_kv_heads", "head_dim",
               "d_ff", "num_layers", "num_encoder_layers", "num_decoder_layers", "qkv_norm",
               "attn_out_norm", "attn_out_norm_scope", "param_dtype")


class NonFiniteError(RuntimeError):
  """Too many consecutive steps with a NaN/Inf loss or gradient."""


def _arch_mismatch(saved: dict | None, cfg: Config) -> list[str]:
  if not saved or "model" not in saved:
    return []
  now = to_dict(cfg.model)
  fields = [f for f in ARCH_FIELDS
            if (cfg.model.family == "decllm" or f != "num_layers")
            and (cfg.model.family == "redllm" or f not in ("num_encoder_layers",
                                                           "num_decoder_layers"))]
  return [f"model.{f}: checkpoint {saved['model'].get(f)!r} vs config {now[f]!r}"
          for f in fields if saved["model"].get(f) != now[f]]


def _make_workdir(workdir: str) -> None:
  """Creates the workdir (local or URI); an unreachable bucket is a clear error, at once."""
  try:
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  except Exception as e:  # noqa: BLE001 - storage libraries raise many types.
    raise ConfigError(f"cannot create or reach the workdir {workdir}: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:300] if str(e) else ''}") from None


def _setup_logging(workdir: str) -> logging.Handler | None:
  log.setLevel(logging.INFO)
  if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
             for h in log.handlers):
    console = logging.StreamHandler()
    console.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    log.addHandler(console)
  log.propagate = False
  if jax.process_index() != 0:
    return None
  handler = logging.StreamHandler(paths.AppendFile(paths.join(workdir, "train.log")))
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
  log.addHandler(handler)
  return handler


def check_batch_layout(cfg: Config, mesh) -> None:
  """Batch sizes must split evenly over processes, data shards and microbatches."""
  shards = partitioning.data_shards(mesh)
  procs = jax.process_count()
  b, m = cfg.train.batch_size, cfg.train.microbatches
  where = f"mesh data*fsdp = {shards} ({dict(mesh.shape)})"
  if (b // m) % shards:
    raise ConfigError(
        f"train.batch_size={b} / train.microbatches={m} = {b // m} rows per microbatch is not "
        f"divisible by the data shards: {where}. Make the (micro)batch a multiple of {shards}, "
        "or move devices to mesh.tensor")
  if b % procs:
    raise ConfigError(f"train.batch_size={b} is not divisible by the {procs} processes")
  eb = cfg.train.eval_batch_size or b
  if eb % shards or eb % procs:
    raise ConfigError(
        f"train.eval_batch_size={eb} must be divisible by the data shards ({where}) and by the "
        f"{procs} processes")


def _open_train_data(cfg: Config, data, rows: int, pid: int, nproc: int):
  try:
    return data.train(rows, pid, nproc)
  except (ValueError, FileNotFoundError) as e:
    raise ConfigError(f"cannot read the training data data.mixture={cfg.data.mixture!r} "
                      f"(data.data_dir={cfg.data.data_dir!r}): {e}") from e


def _close(iterator) -> None:
  if iterator is not None and hasattr(iterator, "close"):
    iterator.close()


class _Preemption:
  """SIGTERM (single process) or JAX's preemption sync point (multi-process) -> save and stop."""

  def __init__(self):
    self.flag = threading.Event()
    self._previous = None
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, lambda *_: self.flag.set())

  def reached(self, step: int, manager) -> bool:
    if jax.process_count() > 1:
      try:
        return bool(manager.reached_preemption(step))
      except Exception:  # noqa: BLE001 - no preemption service: never preempted.
        return False
    return self.flag.is_set()

  def close(self):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def run(cfg: Config, workdir: str, *, data: data_lib.DataSource | None = None,
        step_hook: Callable[[int, Any], None] | None = None) -> dict[str, Any]:
  """Trains ``cfg`` in ``workdir`` (resuming from its checkpoints) and returns final metrics.

  ``data``: where batches come from (default: the seqio pipeline of ``t5like.data``);
  ``step_hook(step, checkpointer)``: called after every step (tests, custom monitoring).
  Returned keys include ``step``, ``loss`` (last logged train loss), ``eval_loss``,
  ``eval_accuracy``, ``checkpoint_dir``, ``metrics_file``, ``resumed_from_step``, ``preempted``.
  """
  cfg.validate()
  distributed.initialize(cfg.distributed)
  workdir = paths.resolve(workdir)
  _make_workdir(workdir)
  file_handler = _setup_logging(workdir)
  try:
    return _run(cfg, workdir, data, step_hook)
  finally:
    if file_handler is not None:
      log.removeHandler(file_handler)
      file_handler.close()
      file_handler.stream.close()  # Writes train.log out (a URI file is rewritten whole).


def _run(cfg: Config, workdir: str, data, step_hook) -> dict[str, Any]:
  t_start = time.time()
  # ---- 1. checks that need no compilation ---------------------------------------------------
  mesh = partitioning.make_mesh(cfg.mesh)
  check_batch_layout(cfg, mesh)
  pid, nproc = jax.process_index(), jax.process_count()
  init_dir = None
  if cfg.train.init_from:
    try:
      init_dir = checkpointing.resolve_step_dir(cfg.train.init_from)
    except FileNotFoundError as e:
      raise ConfigError(str(e)) from None
    bad = _arch_mismatch(checkpointing.read_step_config(init_dir), cfg)
    if bad:
      raise ConfigError(f"train.init_from={cfg.train.init_from!r} holds a different "
                        f"architecture: {'; '.join(bad)}")
  elif cfg.data.objective == "inputs_targets":
    log.warning("instruction-tuning objective without train.init_from: training from a random "
                "initialisation (set --config.train.init_from=<pretraining workdir>)")
  data = data if data is not None else data_lib.PipelineData(cfg)
  train_iter = _open_train_data(cfg, data, cfg.train.batch_size // nproc, pid, nproc)

  # ---- 2. state: resume, init_from, or random -------------------------------------------------
  setup = state_lib.build_setup(cfg, mesh)
  log.info("%s: %.3fM parameters; mesh %s over %d devices (%d processes); batch %d x %d "
           "microbatches", cfg.model.family, setup.num_params / 1e6, dict(mesh.shape),
           mesh.size, nproc, cfg.train.batch_size, cfg.train.microbatches)
  state_lib.log_memory_layout(setup)
  ckpt_dir = paths.resolve(cfg.checkpoint.dir) if cfg.checkpoint.dir else paths.join(
      workdir, "checkpoints")
  ckpt = checkpointing.Checkpointer(ckpt_dir, cfg.checkpoint)
  holder = {"iter": train_iter}
  try:
    return _train(cfg, workdir, data, step_hook, setup, ckpt, ckpt_dir, holder, init_dir,
                  t_start)
  finally:
    _close(holder["iter"])
    ckpt.close()


def _train(cfg: Config, workdir: str, data, step_hook, setup, ckpt, ckpt_dir: str, holder: dict,
           init_dir: str | None, t_start: float) -> dict[str, Any]:
  """Restores or initialises the state, then steps, evaluates and checkpoints (see module doc)."""
  mesh = setup.mesh
  pid, nproc = jax.process_index(), jax.process_count()
  local_rows = cfg.train.batch_size // nproc
  eval_rows = cfg.train.eval_batch_size or cfg.train.batch_size
  train_iter = holder["iter"]
  state, resumed_from = None, None
  if cfg.checkpoint.resume:
    def check_config(saved: dict) -> None:
      bad = _arch_mismatch(saved, cfg)
      if bad:
        raise ConfigError(f"{ckpt_dir} holds checkpoints of a different model "
                          f"({'; '.join(bad)}); use a new --workdir or set "
                          "checkpoint.resume=false")
    restored = ckpt.restore(setup.abstract_state,
                            train_iter if cfg.checkpoint.restore_data else None, check_config)
    if restored is not None:
      state, resumed_from = restored.state, restored.step
      log.info("resumed from checkpoint %s/%d%s", ckpt_dir, resumed_from,
               "" if cfg.checkpoint.restore_data else " (data stream restarted: "
               "checkpoint.restore_data=false)")
      if cfg.checkpoint.restore_data and not restored.data_restored:
        _close(train_iter)  # Every host restarts its stream (agreed in restore).
        train_iter = holder["iter"] = _open_train_data(cfg, data, local_rows, pid, nproc)
  if state is None and init_dir is not None:
    params = checkpointing.restore_params(init_dir, setup.abstract_state.params)
    state = state_lib.fresh_state_from_params(setup, params)
    log.info("initialised parameters from %s (fresh optimizer, step 0)", init_dir)
  if state is None:
    state = state_lib.init_state(setup)
  config_dict = to_dict(cfg)
  if pid == 0:
    (epath.Path(workdir) / "config.json").write_text(
        json.dumps(config_dict, indent=2, sort_keys=True))

  # ---- 3. steps ------------------------------------------------------------------------------
  train_step = step_lib.make_train_step(setup)
  eval_step = step_lib.make_eval_step(setup)
  check_finite = jax.jit(state_lib.all_finite, out_shardings=setup.replicated)
  start = int(jax.device_get(state.step))
  total = cfg.train.steps
  writer = MetricsWriter(workdir, total_steps=total, start_step=start,
                         progress_bar=cfg.train.progress_bar)
  preempt = _Preemption()
  stats = IntervalStats()
  flops_per_step = tokens_per_step = 0.0
  peak_total = flops_lib.peak_flops_per_device(cfg.train.peak_flops_per_device,
                                               cfg.model.dtype) * mesh.size
  last_logged: dict[str, float] = {}
  last_eval: dict[str, float] = {}
  pending: tuple[int, Any] | None = None
  preempted = False

  def evaluate(params) -> dict[str, float]:
    if cfg.train.eval_steps == 0:
      return {}
    it = data.eval(eval_rows // nproc, pid, nproc)
    if it is None:
      return {}
    to_global = lambda b: data_lib.global_batch(  # noqa: E731
        pad_rows(b, eval_rows // nproc), setup.batch_sharding, eval_rows)
    try:
      out = held_out_metrics(eval_step, params, it, to_global, cfg.train.eval_steps)
    finally:
      _close(it)
    for name, extra in data_lib.extra_eval_iterators(data, eval_rows // nproc, pid, nproc):
      try:  # data.extra_eval sets (Paloma style): eval/<name>/loss, eval/<name>/accuracy.
        m = held_out_metrics(eval_step, params, extra, to_global, cfg.train.eval_steps)
      finally:
        _close(extra)
      out.update({f"eval/{name}/{k[5:]}": m[k] for k in ("eval_loss", "eval_accuracy") if out
                  and k in m})
    return out

  def save(step: int) -> None:
    if step in ckpt.all_steps():
      return
    if not bool(jax.device_get(check_finite(state.params))):
      log.error("step %d: parameters are not finite; NOT saving this checkpoint", step)
      return
    ckpt.save(step, state, config_dict, train_iter)

  def consume(step: int, metrics) -> None:
    nonlocal last_logged
    m = {k: float(v) for k, v in jax.device_get(metrics).items()}
    stats.add(m)
    if m["consecutive_skipped"] >= cfg.train.max_nonfinite_steps:
      ckpt.wait()
      raise NonFiniteError(
          f"{int(m['consecutive_skipped'])} consecutive steps (up to step {step}) had a "
          f"non-finite loss or gradient (loss={m['loss']}, grad_norm={m['grad_norm']}); each "
          "was skipped. Lower train.learning_rate, check the data, or raise "
          f"train.max_nonfinite_steps. Last checkpoint: {ckpt.latest_step()} in {ckpt_dir}")
    if not m["finite"]:
      writer.message(f"step {step}: non-finite loss/gradient, update skipped "
                     f"({int(m['skipped_steps'])} skipped so far)")
    if step % cfg.train.log_every == 0 or step == total:
      last_logged = stats.summary(flops_per_step=flops_per_step, tokens_per_step=tokens_per_step,
                                  peak_flops_total=peak_total, num_devices=mesh.size)
      writer.write(step, last_logged)
      stats.reset_clock()
    writer.progress(step, {"loss": last_logged.get("loss", m["loss"]),
                           "tok/s": last_logged.get("tokens_per_sec", 0.0)})

  try:
    step = start
    while step < total:
      try:
        local = next(train_iter)
      except StopIteration:
        raise ConfigError(f"the training data ran out at step {step}; the training iterator "
                          "must repeat (data pipeline with repeat=True)") from None
      batch = data_lib.global_batch(local, setup.batch_sharding, cfg.train.batch_size)
      if not flops_per_step:
        dec_len, enc_len = flops_lib.batch_lengths(batch)
        flops_per_step = flops_lib.train_flops(cfg.model, cfg.train.batch_size, dec_len, enc_len)
        tokens_per_step = cfg.train.batch_size * (dec_len + enc_len)
      state, metrics = train_step(state, batch)
      step += 1
      if pending is not None:
        consume(*pending)
      else:
        stats.reset_clock()  # Exclude compilation from the first throughput interval.
      pending = (step, metrics)
      if cfg.checkpoint.every and step % cfg.checkpoint.every == 0 and step < total:
        save(step)
      if cfg.train.eval_every and step % cfg.train.eval_every == 0 and step < total:
        t_eval = time.perf_counter()
        last_eval = evaluate(state.params)
        stats.pause(time.perf_counter() - t_eval)  # Eval time is not training throughput.
        if last_eval:
          writer.write(step, last_eval)
          writer.message(f"step {step}: eval_loss {last_eval['eval_loss']:.4f}")
      if step_hook is not None:
        step_hook(step, ckpt)
      if step < total and preempt.reached(step, ckpt.manager):
        consume(*pending)
        pending = None
        writer.message(f"preemption signal at step {step}: saving a checkpoint and stopping")
        save(step)
        preempted = True
        break
    if pending is not None:
      consume(*pending)
    final_step = int(jax.device_get(state.step))
    if not preempted:
      last_eval = evaluate(state.params) or last_eval
      if last_eval:
        writer.write(final_step, last_eval)
      if cfg.checkpoint.save_at_end:
        save(final_step)
    ckpt.wait()
  finally:
    preempt.close()
    writer.close()
  latest = ckpt.latest_step()

  result = dict(last_logged)
  result.update(last_eval)
  result.update({
      "step": final_step, "preempted": preempted, "resumed_from_step": resumed_from,
      "num_params": setup.num_params, "workdir": workdir, "checkpoint_dir": ckpt_dir,
      "metrics_file": writer.jsonl_path, "tensorboard_dir": writer.tb_dir,
      "wall_time_s": time.time() - t_start, "flops_per_step": flops_per_step,
      "latest_checkpoint": latest,
  })
  log.info("done at step %d: %s", final_step,
           ", ".join(f"{k}={v:.4g}" for k, v in result.items()
                     if k in ("loss", "eval_loss", "eval_accuracy", "tokens_per_sec", "mfu")))
  return result
