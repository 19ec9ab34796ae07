r"""Generates corpora shaped like the paper's (RedPajama V1, FLAN) for benchmarks and tests.

  python -m t5like.tools.make_paper_corpus --out /tmp/paper_corpus            # paper shape
  python -m t5like.tools.make_paper_corpus --out /tmp/c --scale 0.01 --flan_tasks 40

Writes ``<out>/redpajama/<subset>/<subset>-NNNNN-of-MMMMM.jsonl.zst`` (7 subsets; shard counts and
document lengths per subset follow RedPajama V1's shape: long arXiv and book documents, short c4
and StackExchange ones) and ``<out>/flan/<submixture>/<task>/train.jsonl.zst`` (``--flan_tasks``
tasks, default 1,600, with log-uniform example counts in [10, 10,000]; every 4th task also gets a
``validation.jsonl.zst``, the rest rely on ``data.validation_holdout``). The text is words drawn
from the embedded vocabulary's word pieces with a Zipf law, so tokenisation costs what real
English text costs. Output is deterministic for the same arguments. Local paths or ``gs://``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import Sequence

import numpy as np
import zstandard
from etils import epath

from t5like import cli
from t5like.data import sources, vocab


@dataclasses.dataclass(frozen=True)
class SubsetShape:
  shards: int  # Shards at scale 1.
  docs_per_shard: int  # Documents per shard at scale 1.
  median_words: int  # Median document length (log-normal, sigma 1).


# Shards: RedPajama V1 has thousands per subset; these keep "hundreds" at scale 1 with small files.
REDPAJAMA_SHAPE = {
    "arxiv": SubsetShape(100, 20, 6000), "book": SubsetShape(50, 4, 60000),
    "c4": SubsetShape(200, 300, 400), "common_crawl": SubsetShape(400, 150, 900),
    "github": SubsetShape(100, 120, 700), "stackexchange": SubsetShape(100, 300, 300),
    "wikipedia": SubsetShape(100, 200, 500),
}
FLAN_SUBMIXTURES = ("flan2021", "t0", "niv2", "cot", "dialog")


def _words() -> tuple[list[str], np.ndarray]:
  """Word pieces of the embedded vocabulary and Zipf probabilities over them."""
  words = []
  for line in epath.Path(str(vocab.EMBEDDED_DIR / "spm.vocab")).read_text().splitlines():
    piece = line.split("\t", 1)[0]
    if piece.startswith("\u2581") and piece[1:].isalpha():
      words.append(piece[1:])
  p = 1.0 / np.arange(1, len(words) + 1)
  return words, p / p.sum()


class TextMaker:
  """Seeded Zipf-distributed text."""

  def __init__(self, seed: int) -> None:
    self.words, self.p = _words()
    self.rng = np.random.default_rng(seed)

  def text(self, n_words: int) -> str:
    ids = self.rng.choice(len(self.words), size=max(n_words, 1), p=self.p)
    out = [self.words[i] for i in ids]
    for i in range(12, len(out), 13):  # Sentence ends.
      out[i] += "."
    return " ".join(out)

  def lognormal(self, median: float, sigma: float = 1.0) -> int:
    return max(1, int(self.rng.lognormal(math.log(median), sigma)))


def _write_zst(path: epath.Path, records: Sequence[dict]) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  data = "".join(json.dumps(r) + "\n" for r in records).encode()
  path.write_bytes(zstandard.ZstdCompressor(level=3).compress(data))


def write_redpajama(root: str, *, scale: float = 1.0, seed: int = 0,
                    subsets: Sequence[str] = sources.REDPAJAMA_SUBSETS,
                    max_words: int = 200_000) -> dict[str, int]:
  """RedPajama-V1-shaped corpus under ``root``; returns documents written per subset."""
  out = {}
  for k, subset in enumerate(subsets):
    shape = REDPAJAMA_SHAPE[subset]
    maker = TextMaker(seed * 1000 + k)
    shards = max(1, round(shape.shards * math.sqrt(scale)))
    docs = max(1, round(shape.docs_per_shard * math.sqrt(scale)))
    for s in range(shards):
      records = [{"text": maker.text(min(maker.lognormal(shape.median_words), max_words)),
                  "meta": {"source": subset, "id": f"{subset}-{s}-{i}"}} for i in range(docs)]
      _write_zst(epath.Path(root) / subset / f"{subset}-{s:05d}-of-{shards:05d}.jsonl.zst",
                 records)
    out[subset] = shards * docs
  return out


def write_flan(root: str, *, tasks: int = 1600, min_examples: int = 10,
               max_examples: int = 10_000, seed: int = 0, validation_every: int = 4
               ) -> dict[str, int]:
  """FLAN-shaped corpus under ``root``; returns train examples per task."""
  maker = TextMaker(seed + 99)
  out = {}
  lo, hi = math.log(min_examples), math.log(max_examples)
  for t in range(tasks):
    sub = FLAN_SUBMIXTURES[t % len(FLAN_SUBMIXTURES)]
    name = f"task{t:04d}"
    n = int(round(math.exp(maker.rng.uniform(lo, hi))))
    median_in = maker.lognormal(120, 0.5)  # Each task has its own template length.
    splits = {"train": n}
    if validation_every and t % validation_every == 0:
      splits["validation"] = max(1, min(n // 10, 200))
    for split, count in splits.items():
      records = [{"inputs": f"{name} " + maker.text(maker.lognormal(median_in, 0.6)),
                  "targets": maker.text(maker.lognormal(15, 0.8)), "task_name": name,
                  "task_source": sub, "template_type": "zs_opt"} for _ in range(count)]
      _write_zst(epath.Path(root) / sub / name / f"{split}.jsonl.zst", records)
    out[f"{sub}/{name}"] = n
  return out


def main(argv: Sequence[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", required=True, help="output root (local or gs://)")
  p.add_argument("--scale", type=float, default=1.0, help="RedPajama size factor (shards and "
                 "documents per shard each scale with its square root)")
  p.add_argument("--flan_tasks", type=int, default=1600)
  p.add_argument("--flan_max_examples", type=int, default=10_000)
  p.add_argument("--seed", type=int, default=0)
  cli.add_debug_argument(p)
  args = p.parse_args(argv)
  rp = write_redpajama(f"{args.out}/redpajama", scale=args.scale, seed=args.seed)
  flan = write_flan(f"{args.out}/flan", tasks=args.flan_tasks,
                    max_examples=args.flan_max_examples, seed=args.seed)
  print(json.dumps({"redpajama_documents": rp, "flan_tasks": len(flan),
                    "flan_examples": sum(flan.values())}))


if __name__ == "__main__":
  sys.exit(cli.guard(main))
