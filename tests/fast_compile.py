"""XLA:CPU compiling fast for the whole suite (set up by tests/conftest.py).

Compilation dominates this suite (a tiny train step takes seconds to compile and milliseconds to
run), so every test process, and every subprocess it starts (which inherits the environment),
compiles with LLVM's cheap pipeline: the same programs, less optimised machine code. The
numerics tests compare against float64 or to the scale of each quantity, which holds for any
code generation. Runs of hundreds of steps go to a subprocess without these flags
(``train_helpers.subprocess_env(optimize=True)``). ``T5LIKE_TEST_XLA_OPT=1`` runs the whole
suite with XLA's default optimisation.
"""
import os

FLAGS = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")


def apply() -> None:
  """Adds `FLAGS` to XLA_FLAGS (read when JAX starts its CPU backend, so before any test runs)."""
  if os.environ.get("T5LIKE_TEST_XLA_OPT", "0") == "1":
    return
  flags = os.environ.get("XLA_FLAGS", "").split()
  have = {f.split("=")[0] for f in flags}
  os.environ["XLA_FLAGS"] = " ".join(flags + [f for f in FLAGS if f.split("=")[0] not in have])
