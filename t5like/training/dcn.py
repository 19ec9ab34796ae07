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


def megascale_bytes(hlo_text: str) -> dict[str, int]:
  """Bytes one device sends and receives over DCN per step (``send`` / ``recv`` ops carrying
  ``_xla_megascale_*`` attributes), and how many such ops the program has."""
  out = {"send": 0, "recv": 0, "ops": 0}
  for line in hlo_text.splitlines():
    if "_xla_megascale" not in line:
      continue
    m = _OP.search(line)
    if m:
      out[m.group(2)] += _array_bytes(m.group(1))
      out["ops"] += 1
  return out


def dcn_seconds(traffic: dict[str, int], chip_name: str) -> float | None:
  """The step's DCN time at the chip's DCN bandwidth (full duplex: the larger direction), or
  None when the generation publishes no figure."""
  bw = DCN_BW.get(chip_name, 0.0)
  if not bw:
    return None
  return max(traffic["send"], traffic["recv"]) / bw
