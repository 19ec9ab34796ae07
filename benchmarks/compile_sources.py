"""Backend compile time by the model's source lines, for ``compile_time.py --by_source``.

libtpu's log times each kernel its backend compiles (an instruction of the optimised program:
a fusion, a collective, a sort); the optimised program's text (``Compiled.as_text()``) gives
each instruction the JAX op it came from (``op_name``) and the Python stack that traced it
(``stack_frame_id`` into the ``FileNames`` / ``FunctionNames`` / ``FileLocations`` /
``StackFrames`` tables at its top). Joining the two says which line of the model the backend's
seconds are spent on. Hand-written: neither JAX nor XLA attributes backend compile time to
source (XLA's timers stop at a pass, libtpu's log at a kernel).
"""
from __future__ import annotations

import collections
import functools
import os
import re
from typing import Callable, NamedTuple

Frame = tuple[str, str, int]  # (file, function, line)
# The repository's package: the frames a kernel is attributed to by default.
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "t5like")


class Kernel(NamedTuple):
  """One kernel the backend compiled: its HLO instruction name, seconds on its thread, and the
  non-empty VLIW bundles it came to."""
  name: str
  seconds: float
  bundles: int


class Source(NamedTuple):
  """Where an HLO instruction came from: JAX's op name (``jit(f)/transpose(jvp(...))/dot_general``)
  and the Python stack that traced it, innermost frame first."""
  op_name: str
  frames: tuple[Frame, ...]


def kernel_kind(name: str) -> str:
  """A kernel's kind from its HLO name: ``all-reduce.194`` -> ``all-reduce``,
  ``xor_convert_fusion.15`` -> ``xor_convert_fusion`` (a fusion is named by its leading ops)."""
  return re.sub(r"(\.\d+|\.clone)+$", "", name)


def add_up(kernels: list[Kernel], key: Callable[[Kernel], str]) -> dict:
  """{key: {"seconds", "kernels", "bundles"}} over ``kernels``, largest seconds first: the one
  aggregation both the split by kind and the split by source use."""
  out = collections.defaultdict(lambda: {"seconds": 0.0, "kernels": 0, "bundles": 0})
  for k in kernels:
    g = out[key(k)]
    g["seconds"] += k.seconds
    g["kernels"] += 1
    g["bundles"] += k.bundles
  return dict(sorted(out.items(), key=lambda kv: -kv[1]["seconds"]))


_TABLE_ROW = re.compile(r"^(\d+) (.*)$")
_FIELD = re.compile(r"(\w+)=(\d+)")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = ", re.M)
_OP_NAME = re.compile(r'\bop_name="((?:[^"\\]|\\.)*)"')
_FRAME_ID = re.compile(r"\bstack_frame_id=(\d+)")


def _table(hlo: str, title: str) -> dict[int, str]:
  """Rows ``ID rest`` of one of the tables at the top of an HLO module's text, up to the blank
  line that ends it; {} if the module has none (e.g. a backend that drops the stack index)."""
  start = hlo.find(f"\n{title}\n")
  if start < 0:
    return {}
  end = hlo.find("\n\n", start + len(title) + 2)
  rows = hlo[start + len(title) + 2:end if end >= 0 else len(hlo)].splitlines()
  return {int(m.group(1)): m.group(2) for m in map(_TABLE_ROW.match, rows) if m}


def stack_frames(hlo: str) -> dict[int, tuple[Frame, ...]]:
  """Each stack frame id of an HLO module's text -> its stack, innermost frame first.

  The text writes each frame's parent id plus one (jax 0.10.2's XLA: a root's parent reads 1,
  so frame 1, always a root, reads as its own parent), so the offset is read off the table: a
  frame cannot be its own parent, as parents are indexed before their children."""
  files = {i: v.strip('"') for i, v in _table(hlo, "FileNames").items()}
  functions = {i: v.strip('"') for i, v in _table(hlo, "FunctionNames").items()}
  locations = {}
  for i, v in _table(hlo, "FileLocations").items():
    f = dict(_FIELD.findall(v))
    locations[i] = (files.get(int(f.get("file_name_id", 0)), "?"),
                    functions.get(int(f.get("function_name_id", 0)), "?"), int(f.get("line", 0)))
  raw = {i: dict(_FIELD.findall(v)) for i, v in _table(hlo, "StackFrames").items()}
  parent = {i: int(f.get("parent_frame_id", 0)) for i, f in raw.items()}
  offset = 1 if any(p == i for i, p in parent.items()) else 0
  out: dict[int, tuple[Frame, ...]] = {}
  for i in sorted(raw):  # Parents first: each stack is its frame + its parent's stack.
    here = locations.get(int(raw[i].get("file_location_id", 0)), ("?", "?", 0))
    p = parent[i] - offset
    out[i] = (here,) + (out.get(p, ()) if 0 < p < i else ())
  return out


def instruction_sources(hlo: str, names: set[str]) -> dict[str, Source]:
  """``names``' op names and stacks, from their lines in the module's text (instructions are
  named with or without ``%``; one without metadata gets an empty op name and stack)."""
  frames = stack_frames(hlo)
  out = {}
  for m in _INSTRUCTION.finditer(hlo):
    if m.group(1) not in names:
      continue
    end = hlo.find("\n", m.end())
    line = hlo[m.end():end if end >= 0 else len(hlo)]
    meta = line.find("metadata={")
    op = _OP_NAME.search(line, meta) if meta >= 0 else None
    fid = _FRAME_ID.search(line, meta) if meta >= 0 else None
    out[m.group(1)] = Source(re.sub(r"\\(.)", r"\1", op.group(1)) if op else "",
                             frames.get(int(fid.group(1)), ()) if fid else ())
  return out


@functools.lru_cache(maxsize=None)
def _below(file: str, inside: str) -> str | None:
  """``file``'s path below the absolute directory ``inside`` (the package: ``models/mlp.py``),
  its base name if ``inside`` is that file itself; None if ``file`` is elsewhere."""
  path = os.path.abspath(file)
  if path == inside:
    return os.path.basename(path)
  return path[len(inside) + 1:] if path.startswith(inside + os.sep) else None


def _frame_text(function: str, file: str, line: int) -> str:
  """``function@file.py:line``, the function without its enclosing ``f.<locals>.`` scopes."""
  return f"{function.rsplit('.<locals>.', 1)[-1]}@{file}:{line}"


def source_group(kernel: Kernel, source: Source | None, inside: str = PACKAGE,
                 depth: int = 3) -> str:
  """A kernel's group: ``bwd`` (its op is under a ``transpose(``) or ``fwd``, then its
  ``depth`` innermost frames in the directory or file ``inside``, innermost first. Without such
  a frame the op name's last component stands in (``all-reduce``, ``sort``; one numbered as XLA
  numbers instructions, ``broadcast.86``, by its kind), and without an op name or an
  instruction of that name in the program, the kernel's kind."""
  if source is None or not source.op_name:
    return kernel_kind(kernel.name)
  phase = "bwd" if "transpose(" in source.op_name else "fwd"
  ours = [_frame_text(function, below, line) for file, function, line in source.frames
          if (below := _below(file, os.path.abspath(inside))) is not None][:depth]
  return f"{phase} {' < '.join(ours) or kernel_kind(source.op_name.rsplit('/', 1)[-1])}"


def by_source(kernels: list[Kernel], hlo: str, inside: str = PACKAGE,
              depth: int = 3) -> dict:
  """``kernels``' seconds, count and bundles added up by ``source_group``, largest first. A
  kernel's instruction is looked up by its exact name, then without ``.clone`` suffixes."""
  bare = {k.name: re.sub(r"(\.clone(\.\d+)?)+$", "", k.name) for k in kernels}
  sources = instruction_sources(hlo, set(bare) | set(bare.values()))
  return add_up(kernels, lambda k: source_group(
      k, sources.get(k.name) or sources.get(bare[k.name]), inside, depth))


def source_summary(groups: dict, top: int) -> list[str]:
  """Table lines: the ``top`` groups' thread-seconds, share, kernels and bundles, one a line,
  then the rest together, so the shares shown add up to all the kernels' seconds."""
  total = sum(g["seconds"] for g in groups.values())
  share = lambda s: 100 * s / (total or 1.0)  # noqa: E731
  lines = [f"|   | by source ({total:.1f} thread-s in {len(groups)} groups): |"]
  for key, g in list(groups.items())[:top]:
    lines.append(f"|   | {g['seconds']:8.1f} s {share(g['seconds']):3.0f} % {g['kernels']:5d} "
                 f"kernels {g['bundles']:>10,} bundles  {key} |")
  rest = list(groups.values())[top:]
  if rest:
    s = sum(g["seconds"] for g in rest)
    lines.append(f"|   | {s:8.1f} s {share(s):3.0f} % {sum(g['kernels'] for g in rest):5d} "
                 f"kernels {sum(g['bundles'] for g in rest):>10,} bundles  "
                 f"({len(rest)} more groups) |")
  return lines
