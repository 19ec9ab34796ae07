"""``train.profile_steps``: a ``jax.profiler`` trace of a window of training steps.

The trace goes to ``<workdir>/profile`` (``plugins/profile/<time>/*.xplane.pb``: TensorBoard's
profile tab, ``tensorboard --logdir <workdir>/profile``; the profiler writes URIs such as gs://
itself). On a local workdir the same folder also gets ``perfetto_trace.json.gz`` for
https://ui.perfetto.dev. The same on CPU, GPU and TPU: only what the device reports differs.
"""
from __future__ import annotations

import logging

import jax

from t5like import paths
from t5like.config.train import TrainConfig

log = logging.getLogger("t5like.training")


class StepProfiler:
  """Starts a trace before step START's update and stops it once step STOP's is done."""

  def __init__(self, train: TrainConfig, workdir: str):
    self.window = train.profile_window()
    self.logdir = paths.join(workdir, "profile")
    self.active = False

  def before_step(self, step: int) -> None:
    """Called with the state's step before its update is dispatched."""
    if self.window and step == self.window[0] and not self.active:
      local = not paths.is_uri(self.logdir)
      jax.profiler.start_trace(self.logdir, create_perfetto_trace=local)
      self.active = True
      log.info("profiling steps %d to %d into %s", *self.window, self.logdir)

  def after_step(self, step: int, outputs) -> None:
    """Called with the state's step after the update; ``outputs`` are waited for at the end."""
    if self.active and step >= self.window[1]:
      jax.block_until_ready(outputs)  # The device work of the last step belongs to the trace.
      self.stop()

  def stop(self) -> None:
    if self.active:
      self.active = False
      jax.profiler.stop_trace()
      log.info("profile written to %s (tensorboard --logdir %s)", self.logdir, self.logdir)
