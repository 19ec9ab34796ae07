"""What every command line shares: ``--config FILE`` with ``--config.key=value`` overrides, and
expected errors printed as one ``error: ...`` block without a traceback.

``train.py``, ``eval.py``, ``python -m t5like.experiments`` and the tools parse their config flags
with ``parse`` and run their work under ``guard``. An expected error (``t5like.errors.UserError``:
config, restore, data layout, vocabulary, storage; or a class the entry point names) prints its
message and the entry point returns 2; ``--debug`` or ``T5LIKE_DEBUG=1`` prints the traceback too.
Any other exception is a bug and propagates with its traceback. This module imports only
``t5like.config`` and ``t5like.errors``, so every layer's entry point may use it.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Callable, Sequence

from t5like.errors import UserError

DEBUG_ENV = "T5LIKE_DEBUG"
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report it (128 + SIGINT).
OVERRIDE_FORM = "--config.key=value, e.g. --config.train.steps=10"


def add_config_argument(parser: argparse.ArgumentParser, default: str | None = None,
                        help: str = "config file defining get_config()") -> None:  # noqa: A002
  """``--config FILE`` (the overrides ``--config.key=value`` are collected by ``parse``)."""
  parser.add_argument("--config", default=default, required=default is None, help=help)


def add_debug_argument(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--debug", action="store_true",
                      help=f"on an expected error, print the traceback too (or {DEBUG_ENV}=1)")


def split_overrides(parser: argparse.ArgumentParser, rest: Sequence[str]) -> list[str]:
  """``--config.a.b=v`` (or ``--config.a.b v``) -> ``["a.b=v"]``; anything else is a usage
  error naming the argument."""
  overrides, i = [], 0
  while i < len(rest):
    item = rest[i]
    if not item.startswith("--config.") or item == "--config.":
      parser.error(f"unrecognised argument {item!r}; overrides look like {OVERRIDE_FORM}")
    item = item[len("--config."):]
    if "=" not in item:  # "--config.key value"
      if i + 1 >= len(rest) or rest[i + 1].startswith("--"):
        parser.error(f"--config.{item} needs a value: {OVERRIDE_FORM}")
      item, i = f"{item}={rest[i + 1]}", i + 1
    overrides.append(item)
    i += 1
  return overrides


def parse(parser: argparse.ArgumentParser,
          argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
  """The parser's own flags and the ``--config.key=value`` overrides, in order."""
  args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else list(argv))
  return args, split_overrides(parser, rest)


def load(path: str, overrides: Sequence[str] = ()):
  """The validated config of ``path`` with ``overrides`` (a ``ConfigError`` if either is bad)."""
  from t5like.config import load_config
  return load_config(path, overrides)


def debugging(argv: Sequence[str] | None = None) -> bool:
  argv = sys.argv[1:] if argv is None else argv
  return "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def print_error(error: BaseException, debug: bool = False) -> None:
  """``error: <message>`` (continuation lines indented), after the traceback when debugging."""
  if debug:
    traceback.print_exception(error)
  lines = (str(error) or type(error).__name__).splitlines() or [type(error).__name__]
  text = "\n".join(["error: " + lines[0]] + ["       " + line for line in lines[1:]])
  hint = "" if debug else f"\n(the traceback: add --debug or set {DEBUG_ENV}=1)"
  sys.stdout.flush()
  print(text + hint, file=sys.stderr, flush=True)


class MissingDependency(UserError):
  """A third-party package the command needs is not installed in this interpreter."""

  def __init__(self, error: ModuleNotFoundError):
    root = (error.name or "?").split(".")[0]
    super().__init__(
        f"the Python package {root!r} is not installed for {sys.executable}. Run t5like with "
        "the environment `make install` builds: .venv/bin/python (or `source "
        ".venv/bin/activate` first); or install it into this interpreter: pip install -e .")


def guard(main: Callable[[list[str]], object], argv: Sequence[str] | None = None, *,
          expected: tuple[type[BaseException], ...] = ()) -> int:
  """Runs ``main(argv)``; a ``UserError`` (or one of ``expected``, or a ``SystemExit`` carrying
  a message, or a missing third-party package) becomes ``error: ...`` and exit status 2; Ctrl-C
  one line and status 130. An int
  returned is the exit status; anything else (None, a report) is success."""
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    code = main(argv)
  except (UserError, *expected) as e:
    print_error(e, debugging(argv))
    return EXIT_USER_ERROR
  except ModuleNotFoundError as e:
    if (e.name or "t5like").split(".")[0] == "t5like":
      raise  # A module of this project missing: a bug, with its traceback.
    print_error(MissingDependency(e), debugging(argv))
    return EXIT_USER_ERROR
  except KeyboardInterrupt:
    sys.stdout.flush()
    print("interrupted (Ctrl-C)", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED
  except SystemExit as e:
    if not isinstance(e.code, str):  # argparse's usage errors and --help: already printed.
      raise
    print_error(e, debugging(argv))
    return EXIT_USER_ERROR
  return code if isinstance(code, int) and not isinstance(code, bool) else 0
