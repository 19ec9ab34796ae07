"""The start-up import race, made to happen if it comes back.

``etils.epy.lazy_imports()`` (entered by TFDS and so by seqio while they import) replaces
``builtins.__import__`` for the whole process; a thread tracing JAX meanwhile gets lazy proxies
for JAX's own function-level imports. The train step compiles in a background thread
(``startup.Background``) while the main thread opens the data pipeline, so every such import must
be done before that thread starts.

The check does not rely on timing: in a fresh interpreter the compile thread waits to trace until
the main thread has opened its data pipeline, and ``epy.lazy_imports`` is wrapped so that a
context entered while that thread is alive is recorded, lets the thread trace, and stays open
until its trace is done — the worst case of a busy host, every time.
"""
from __future__ import annotations

import json

from train_helpers import run_script

_SCRIPT = """
import contextlib, json, threading, sys
from etils import epy
real = epy.lazy_imports
entered_while_tracing = []
go, traced = threading.Event(), threading.Event()

@contextlib.contextmanager
def held_lazy_imports(*args, **kwargs):
  with real(*args, **kwargs):
    if any(t.name == "compile-train-step" for t in threading.enumerate()):
      entered_while_tracing.append(sys._getframe(2).f_globals.get("__name__", "?"))
      go.set()
      traced.wait(timeout=300)  # The whole trace runs under this patched __import__.
    yield

epy.lazy_imports = held_lazy_imports
assert "seqio" not in sys.modules and "tensorflow_datasets" not in sys.modules
from train_helpers import tiny_config
from t5like.training import run, startup, trainer
real_compile, real_mark = trainer.lower_and_compile, startup.Timeline.mark

def compile_when_told(*args, **kwargs):
  go.wait(timeout=300)  # Tracing starts only once the main thread opened its data (or imports).
  try:
    return real_compile(*args, **kwargs)
  finally:
    traced.set()

def mark(self, what, *args, **kwargs):
  if what == "data pipeline ready":
    go.set()
  return real_mark(self, what, *args, **kwargs)

trainer.lower_and_compile, startup.Timeline.mark = compile_when_told, mark
cfg = tiny_config("decllm", steps=2)
cfg.model.vocab_size = 8192  # The embedded corpus through the real seqio pipeline.
cfg.train.eval_steps = 0
cfg.checkpoint.every = 0
cfg.checkpoint.save_at_end = False
result = run(cfg, "{workdir}")
print("RACE " + json.dumps({{"entered": entered_while_tracing, "step": result["step"]}}))
"""


def test_no_import_patching_while_the_train_step_traces(tmp_path):
  proc = run_script(_SCRIPT.format(workdir=tmp_path / "run"), timeout=600, check=False)
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RACE ")]
  errors = [ln for ln in proc.stderr.splitlines() if "Error" in ln]
  assert proc.returncode == 0 and lines, (errors[-3:], proc.stderr[-3000:])
  got = json.loads(lines[-1][len("RACE "):])
  assert got == {"entered": [], "step": 2}, got
