"""XLA:CPU compiling fast for the whole suite (set up by tests/conftest.py).

Compilation dominates this suite (a tiny train step takes seconds to compile and milliseconds to
run), so every test process, and every subprocess it starts (which inherits the environment),
compiles with LLVM's cheap pipeline and XLA:CPU's older fusion code generators (the newer MLIR
fusion emitters took a third of a tiny train step's compile time; the whole suite ran 9:22
instead of 13:03 on a 2-core AMD EPYC, 2026-11-25): the same programs, less optimised machine
code. The numerics tests compare against float64 or to the scale of each quantity, which holds
for any code generation. Runs of hundreds of steps go to a subprocess without these flags
(``train_helpers.subprocess_env(optimize=True)``). ``T5LIKE_TEST_XLA_OPT=1`` runs the whole
suite with XLA's default optimisation.

The test run also shares one persistent compilation cache (JAX's ``JAX_COMPILATION_CACHE_DIR``,
a fresh temporary directory removed when the run ends) between the pytest workers and every
subprocess: many tests compile the same tiny programs in several processes (a SIGKILLed run and
its restart, both hosts of a two-process run, a trainer and the evaluation of its checkpoint).
JAX keys each entry by the program, the devices and XLA_FLAGS, so optimised and fast-compiled
programs never mix. ``T5LIKE_TEST_XLA_CACHE=0`` turns it off.
"""
import importlib.metadata
import os
import tempfile


def _jaxlib_before(major: int, minor: int) -> bool:
  version = importlib.metadata.version("jaxlib").split(".")
  return (int(version[0]), int(version[1])) < (major, minor)


# jaxlib 0.11 (seen: 0.11.2 on a GPU machine's own image) no longer knows the fusion-emitter
# switch, and XLA aborts every process on an unknown flag in XLA_FLAGS.
FLAGS = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true") + (
    ("--xla_cpu_use_fusion_emitters=false",) if _jaxlib_before(0, 11) else ())


def apply() -> None:
  """Adds `FLAGS` to XLA_FLAGS (read when JAX starts its CPU backend, so before any test runs)."""
  if os.environ.get("T5LIKE_TEST_XLA_OPT", "0") == "1":
    return
  flags = os.environ.get("XLA_FLAGS", "").split()
  have = {f.split("=")[0] for f in flags}
  os.environ["XLA_FLAGS"] = " ".join(flags + [f for f in FLAGS if f.split("=")[0] not in have])


CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def cache_dir() -> str | None:
  """Sets up the run's compilation cache before JAX is imported (pytest workers inherit the
  variable from the controller); returns the directory if this process created it."""
  if os.environ.get("T5LIKE_TEST_XLA_CACHE", "1") != "1" or os.environ.get(CACHE_ENV):
    return None
  path = tempfile.mkdtemp(prefix="t5like-test-xla-cache-")
  os.environ[CACHE_ENV] = path
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # Every program,
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")  # however small.
  return path
