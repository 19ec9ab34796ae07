"""``run(cfg, workdir)``: the training loop, from config checks to the final checkpoint.

Order of work (everything that can be misconfigured fails before anything is compiled):
  1. multi-process start-up, mesh from ``cfg.mesh`` (must use every device), batch divisibility,
     ``train.init_from`` existence, data iterators (missing data fails here);
  2. abstract sharded state; the train step starts compiling in a background thread from the
     abstract shapes (``compile_cache``: a restart loads it instead); meanwhile, resume from the
     newest good checkpoint in the workdir (with its data-iterator position), else parameters
     from ``train.init_from``, else random init; start-up milestones logged (``startup``);
  3. steps: global batch assembled from per-host rows, jitted step (donated state), metrics of
     step s fetched after step s+1 is dispatched (keeps the device busy), checkpoints every
     ``checkpoint.every`` steps, held-out eval every ``train.eval_every`` steps;
  4. at the end (or on SIGTERM, Ctrl-C, preemption): final checkpoint, eval, metrics, return.
Steps 2-4 are ``t5like.training.trainer.Trainer`` (restore, step, evaluate, save).
"""
from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from typing import Any, Callable

import jax
from etils import epath

from t5like import partitioning, paths
from t5like.config import Config, ConfigError, to_dict
from t5like.training import checkpointing, compile_cache, distributed, startup, step_dirs
from t5like.training import workdir_lock
from t5like.training import data as data_lib
from t5like.training import fit as fit_lib
from t5like.training import state as state_lib
from t5like.training.trainer import NonFiniteError, Trainer  # noqa: F401 - NonFiniteError: API.
from t5like.training.trainer import compile_ahead
from t5like.training.trainer import close_iterator as _close_iterator

log = logging.getLogger("t5like.training")

# Model fields that decide parameter shapes/meaning: a checkpoint only fits a model that agrees
# on all of them. The others (dtype, dropout, remat, scan, attention masks) may differ.
ARCH_FIELDS = ("family", "vocab_size", "d_model", "num_heads", "num_kv_heads", "head_dim",
               "d_ff", "num_layers", "num_encoder_layers", "num_decoder_layers", "qkv_norm",
               "v_norm", "attn_out_norm", "attn_out_norm_scope", "tie_embeddings",
               "scale_logits", "shared_encoder_decoder", "param_dtype")


def _arch_mismatch(saved: dict | None, cfg: Config) -> list[str]:
  if not saved or "model" not in saved:
    return []
  now = to_dict(cfg.model)
  fields = [f for f in ARCH_FIELDS
            if (cfg.model.family == "decllm" or f != "num_layers")
            and (cfg.model.family == "redllm" or f not in ("num_encoder_layers",
                                                           "num_decoder_layers"))]
  default = to_dict(type(cfg.model)())  # Checkpoints from before a field was added: default.
  return [f"model.{f}: checkpoint {saved['model'].get(f, default[f])!r} vs config {now[f]!r}"
          for f in fields if saved["model"].get(f, default[f]) != now[f]]


def _make_workdir(workdir: str) -> None:
  """Creates the workdir (local or URI); an unreachable bucket is a clear error, at once."""
  try:
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  except (NameError, TypeError, AttributeError):
    raise  # Bugs, not storage.
  except Exception as e:  # noqa: BLE001 - storage libraries raise many types.
    raise ConfigError(f"cannot create or reach the workdir {workdir}: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:300] if str(e) else ''}") from None


class _Stderr(logging.StreamHandler):
  """The console handler: writes to whatever ``sys.stderr`` is when a record comes (a handler
  bound to the stream of its creation writes into a closed one once that stream is replaced, as
  by an in-process CLI test's capture)."""

  @property
  def stream(self):
    return sys.stderr

  @stream.setter
  def stream(self, value):
    del value

  def emit(self, record):
    if getattr(record, "file_only", False):
      return  # Per-step lines: train.log only while the progress bar shows them.
    try:  # Above a progress bar, not through it.
      from tqdm import tqdm
      tqdm.write(self.format(record), file=sys.stderr)
    except Exception:  # noqa: BLE001 - logging's own policy for a failing handler.
      self.handleError(record)


class _Once(logging.Filter):
  """Lets a message that starts with ``prefix`` through once per process (seqio's packing
  warning repeats for every dataset it packs)."""

  def __init__(self, prefix: str):
    super().__init__()
    self.prefix, self.seen = prefix, False

  def filter(self, record):
    if not str(record.msg).startswith(self.prefix):
      return True
    seen, self.seen = self.seen, True
    return not seen


_PACKING_WARNING = _Once("Features not in `features_length` will be removed during packing")


def _setup_logging(workdir: str) -> logging.Handler | None:
  log.setLevel(logging.INFO)
  absl = logging.getLogger("absl")
  if _PACKING_WARNING not in absl.filters:
    absl.addFilter(_PACKING_WARNING)
  if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
             for h in log.handlers):
    console = _Stderr()
    console.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    log.addHandler(console)
  log.propagate = False
  if jax.process_index() != 0:
    return None
  handler = logging.StreamHandler(paths.AppendFile(paths.join(workdir, "train.log")))
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
  log.addHandler(handler)
  return handler


def _open_train_data(cfg: Config, data, rows: int, pid: int, nproc: int):
  try:
    return data.train(rows, pid, nproc)
  except (ValueError, FileNotFoundError) as e:
    raise ConfigError(f"cannot read the training data data.mixture={cfg.data.mixture!r} "
                      f"(data.data_dir={cfg.data.data_dir!r}): {e}") from e


class _Preemption:
  """SIGTERM or Ctrl-C (SIGINT; single process) or JAX's preemption sync point (multi-process)
  -> save and stop. ``reason`` names what stopped the run; a second Ctrl-C stops at once."""

  def __init__(self):
    self.flag = threading.Event()
    self.reason = ""
    self._previous, self._warned = {}, False
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    del frame
    if signum == signal.SIGINT:
      if self.flag.is_set():
        raise KeyboardInterrupt  # The second Ctrl-C: stop without waiting for the save.
      self.reason = "Ctrl-C"
    else:
      self.reason = self.reason or "SIGTERM"
    self.flag.set()

  def reached(self, step: int, manager) -> bool:
    if jax.process_count() > 1:  # JAX's sync manager: SIGTERM on any host -> all save one step.
      try:
        return bool(manager.reached_preemption(step))
      except Exception as e:  # noqa: BLE001
        if not self._warned:
          self._warned = True
          log.warning("preemption sync point unavailable (%s): this multi-process run will not "
                      "save on SIGTERM", e)
        return False
    return self.flag.is_set()

  def close(self):
    for sig, previous in self._previous.items():
      signal.signal(sig, previous)


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
  lock = workdir_lock.hold(workdir)  # One run per workdir: before its logs, metrics, checkpoints.
  file_handler = _setup_logging(workdir)
  compile_cache.configure(cfg.train, workdir)  # Before the first compile.
  try:
    return _run(cfg, workdir, data, step_hook)
  finally:
    if lock is not None:
      lock.release()
    if file_handler is not None:
      log.removeHandler(file_handler)
      file_handler.close()
      file_handler.stream.close()  # Writes train.log out (a URI file is rewritten whole).


def _run(cfg: Config, workdir: str, data, step_hook) -> dict[str, Any]:
  t_start = time.time()
  timeline = startup.Timeline(log, startup.run_start_time())
  timeline.mark("imports")
  # ---- 1. checks that need no compilation ---------------------------------------------------
  mesh = partitioning.make_mesh(cfg.mesh)
  state_lib.check_batch_layout(cfg, mesh)
  if fit_lib.resolve_mode(cfg, mesh.devices.flat[0].platform) != "off":
    cfg, _ = fit_lib.choose(cfg)  # train.fit: a remat / microbatch setting that fits.
  init_dir = None
  if cfg.train.init_from:
    try:
      init_dir = step_dirs.resolve_step_dir(cfg.train.init_from)
    except FileNotFoundError as e:
      raise ConfigError(str(e)) from None
    bad = _arch_mismatch(step_dirs.read_step_config(init_dir), cfg)
    if bad:
      raise ConfigError(f"train.init_from={cfg.train.init_from!r} holds a different "
                        f"architecture: {'; '.join(bad)}")
  elif cfg.data.objective == "inputs_targets":
    log.warning("instruction-tuning objective without train.init_from: training from a random "
                "initialisation (set --config.train.init_from=<pretraining workdir>)")
  data = data if data is not None else data_lib.PipelineData(cfg)
  setup = state_lib.build_setup(cfg, mesh)
  # The pipeline's batches have known shapes: the train step compiles in the background from here
  # to the first step, beside opening the data, building or restoring the state, the first batch.
  ahead = compile_ahead(cfg, setup) if isinstance(data, data_lib.PipelineData) else None
  try:
    return _train(cfg, workdir, data, setup, init_dir, step_hook, t_start, timeline, ahead)
  finally:
    if ahead is not None:
      ahead.cancel()  # Nothing once it is done; after an error, no compile nobody will use.


def _train(cfg: Config, workdir: str, data, setup, init_dir, step_hook, t_start, timeline,
           ahead) -> dict[str, Any]:
  pid, nproc = jax.process_index(), jax.process_count()
  open_data = lambda: _open_train_data(cfg, data, cfg.train.batch_size // nproc, pid,  # noqa
                                       nproc)
  train_iter = open_data()  # Missing / unreadable data fails here, before any state exists.
  timeline.mark("data pipeline ready")

  # ---- 2. abstract sharded state, checkpointer, then restore / init_from / random -------------
  mesh = setup.mesh
  log.info("%s: %.3fM parameters; mesh %s over %d devices (%d processes)%s; batch %d x %d "
           "microbatches", cfg.model.family, setup.num_params / 1e6, dict(mesh.shape),
           mesh.size, nproc, ", collectives on the SparseCores" if partitioning.compiler_options(
               cfg.mesh, mesh) else "", cfg.train.batch_size, cfg.train.microbatches)
  state_lib.log_memory_layout(setup)
  ckpt_dir = paths.resolve(cfg.checkpoint.dir) if cfg.checkpoint.dir else paths.join(
      workdir, "checkpoints")
  try:
    ckpt = checkpointing.Checkpointer(ckpt_dir, cfg.checkpoint)
  except BaseException:
    _close_iterator(train_iter)
    raise
  trainer = None
  try:
    trainer = Trainer(cfg, workdir, data, setup, ckpt, train_iter, open_data, init_dir=init_dir,
                      arch_mismatch=lambda saved: _arch_mismatch(saved, cfg),
                      step_hook=step_hook, t_start=t_start, timeline=timeline, ahead=ahead)
    trainer.restore()
    timeline.mark("state restored" if trainer.resumed_from is not None else "state built")
    # ---- 3.-4. steps, evals, checkpoints; final eval and checkpoint ---------------------------
    preemption = _Preemption()
    try:
      return trainer.train(preemption)
    finally:
      preemption.close()
  finally:
    if trainer is not None:
      trainer.close()
    else:
      _close_iterator(train_iter)
      ckpt.close()
