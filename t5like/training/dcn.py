"""Traffic between slices over the data-center network (DCN), read from a compiled TPU program.

On several slices (``mesh.slices``), XLA does not emit a collective over the ``dcn`` mesh axis
as an ``all-reduce``: libtpu's multi-slice runtime (Megascale) moves those bytes with
host-transfer ``send`` / ``recv`` ops whose frontend attributes name ``_xla_megascale_*``. A
roofline that counts collectives by name misses them, so ``megascale_bytes`` reads them from the
HLO text, and the roofline charges them to DCN bandwidth, apart from ICI (``aot.roofline``).

DCN bandwidth per chip (``DCN_BW``), the Cloud TPU system-architecture pages' figures:
v5p "Data center network (DCN) bandwidth per chip: 50 Gbps"; v5e "data center network bandwidth
per Pod 6.4 Tbps" (2 x 100 Gbps NICs per 8-chip host): 25 Gbps a chip; v6e "Data center network
bandwidth per Pod 25.6 Tbps" (4 x 200 Gbps NICs per 8-chip host): 100 Gbps a chip. v4 publishes
no per-chip figure: no DCN term there (reported as unknown). They are link rates: a measured
step sees less.
"""
from __future__ import annotations

import math
import re

GBIT = 1e9 / 8  # Bytes/s of one Gbit/s.
DCN_BW = {"v5p": 50 * GBIT, "v5e": 25 * GBIT, "v6e": 100 * GBIT, "v4": 0.0}

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "f8e4m3fn": 1, "f8e5m2": 1}
_OP = re.compile(r"=\s*(.*?)\s(send|recv)\(")
_ARRAY = re.compile(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]")


def _array_bytes(shape_text: str) -> int:
  """Bytes of the first (data) array of an op's result shape, e.g. ``(bf16[64,512], u32[],
  token[])`` -> 64 * 512 * 2 (a send's result carries its buffer, a context and a token)."""
  for dtype, dims in _ARRAY.findall(shape_text):
    if dtype in _DTYPE_BYTES:
      return _DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
  return 0


_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_DEF = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_WHILE = re.compile(r"\swhile\(%([\w.\-]+)\),\s*condition=%([\w.\-]+),\s*body=%([\w.\-]+)")
_CALLS = re.compile(r"(?:calls|to_apply|branch_computations)=\{?([%\w.\-, ]+)\}?")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"([0-9]+)"')


def _computations(hlo_text: str) -> tuple[dict[str, dict[str, str]], str]:
  """The program's computations (name -> {instruction name -> its text}) and the entry's name."""
  comps: dict[str, dict[str, str]] = {"": {}}  # "": instructions before any header (a snippet).
  entry, current = "", comps[""]
  for line in hlo_text.splitlines():
    head = _HEADER.match(line) if line and not line[0].isspace() else None
    if head:
      current = comps.setdefault(head.group(2), {})
      entry = head.group(2) if head.group(1) else entry
    elif m := _DEF.match(line):
      current[m.group(1)] = m.group(2)
  return comps, entry


def _constant(defs: dict[str, str], name: str) -> int | None:
  """The integer an instruction holds, through copies and bitcasts (a loop counter's start)."""
  for _ in range(8):
    text = defs.get(name, "")
    if m := re.search(r"\sconstant\((-?[0-9]+)\)", text):
      return int(m.group(1))
    if not (m := re.search(r"\s(?:copy|bitcast|convert)\(%([\w.\-]+)\)", text)):
      return None
    name = m.group(1)
  return None


def _trip_count(comps, parent: dict[str, str], line: str, init: str, cond: str) -> int | None:
  """How often a ``while`` runs: XLA's ``known_trip_count``, else its condition's ``i < N``
  against the counter's start in the loop's initial tuple (a peeled layer scan starts at 1)."""
  if m := _TRIPS.search(line):
    return int(m.group(1))
  defs = comps.get(cond, {})
  for text in defs.values():
    m = re.search(r"\scompare\(%([\w.\-]+),\s*%([\w.\-]+)\),\s*direction=(LT|LE|GT|GE)", text)
    if not m:
      continue
    a, b, direction = m.groups()
    if direction in ("GT", "GE"):  # N > i is i < N.
      a, b, direction = b, a, "LT" if direction == "GT" else "LE"
    index = re.search(r"get-tuple-element\(.*\),\s*index=([0-9]+)", defs.get(a, ""))
    limit = _constant(defs, b)
    start = parent.get(init, "")
    operands = re.search(r"\stuple\(([^)]*)\)", start)
    if index is None or limit is None or operands is None:
      return None
    names = [o.strip().lstrip("%") for o in operands.group(1).split(",")]
    first = _constant(parent, names[int(index.group(1))])
    return None if first is None else max(limit - first + (direction == "LE"), 0)
  return None


def megascale_bytes(hlo_text: str) -> dict[str, int]:
  """Bytes one device sends and receives over DCN per step (``send`` / ``recv`` ops carrying
  ``_xla_megascale_*`` attributes), and how many such ops the program has. An op inside a
  ``while`` body counts once per iteration: XLA reduces a scanned layer's gradients over DCN
  inside the backward loop. ``loops_uncounted``: loops holding such ops whose trip count the
  text does not tell (counted once)."""
  comps, entry = _computations(hlo_text)
  out = {"send": 0, "recv": 0, "ops": 0, "loops_uncounted": 0}
  seen: set[str] = set()

  def visit(name: str, times: int) -> None:
    if name in seen or name not in comps:  # A computation called from two places: once.
      return
    seen.add(name)
    defs = comps[name]
    for text in defs.values():
      if "_xla_megascale" in text and (m := _OP.search(" = " + text)):
        out[m.group(2)] += _array_bytes(m.group(1)) * times
        out["ops"] += 1
      if w := _WHILE.search(text):
        trips = _trip_count(comps, defs, text, *w.groups()[:2])
        if trips is None and _holds_megascale(comps, w.group(3)):
          out["loops_uncounted"] += 1
        visit(w.group(3), times * (1 if trips is None else trips))
      for called in _CALLS.findall(text):
        for c in called.split(","):
          visit(c.strip().lstrip("%"), times)

  visit(entry, 1)
  return out


def _holds_megascale(comps, name: str) -> bool:
  return any("_xla_megascale" in t for t in comps.get(name, {}).values())


def dcn_seconds(traffic: dict[str, int], chip_name: str) -> float | None:
  """The step's DCN time at the chip's DCN bandwidth (full duplex: the larger direction), or
  None when the generation publishes no figure."""
  bw = DCN_BW.get(chip_name, 0.0)
  if not bw:
    return None
  return max(traffic["send"], traffic["recv"]) / bw
