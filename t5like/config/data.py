"""Data pipeline config (seqio tasks/mixtures, sources, lengths, objectives, packing)."""
from __future__ import annotations

import dataclasses
import math
import re

from t5like.config.schema import ConfigError, check_choice, check_positive

OBJECTIVES = ("auto", "causal", "prefix", "inputs_targets", "span_corruption", "ul2")
DENOISING_OBJECTIVES = ("span_corruption", "ul2")
UL2_MODES = ("r", "x", "s")
UL2_MODE_TOKENS = len(UL2_MODES)  # Reserved ids taken by the mode tokens (the lowest extra ids).


def _span(mode: str, density: float, mean_span: float, rate: float) -> dict:
  return {"mode": mode, "noise_density": density, "mean_noise_span_length": mean_span,
          "rate": rate}


# UL2's Mixture-of-Denoisers (Tay et al. 2022, arXiv 2205.05131, §3.1.2): R (mean span 3 and 8
# at 15 %), X (3 and 8 at 50 %, 64 at 15 % and 50 %) and S (prefix LM), each with its mode-switching
# paradigm token ([NLU] = R, [NLG] = X, [S2S] = S, as the released UL2 prompts use them; here the
# mode tokens r / x / s). Rates: the ablations of §4.5 settle on a small S share, about 20 %; the
# paper gives no per-denoiser rates for the rest, so R and X take 40 % each, split equally among
# their settings (R 20 % each, X 10 % each: the split public UL2 reproductions use). The paper's
# appendix code (`ul2_objective`) samples its denoisers uniformly when given no rates.
UL2_PRESETS: dict[str, dict[str, dict]] = {
    "ul2": {"r_3_15": _span("r", 0.15, 3.0, 0.2), "r_8_15": _span("r", 0.15, 8.0, 0.2),
            "x_3_50": _span("x", 0.5, 3.0, 0.1), "x_8_50": _span("x", 0.5, 8.0, 0.1),
            "x_64_15": _span("x", 0.15, 64.0, 0.1),
            "x_64_50": _span("x", 0.5, 64.0, 0.1), "s": {"mode": "s", "rate": 0.2}},
    # A three-denoiser reading (t5like's earlier default): R (3, 15 %), X (32, 50 %), S, 40/40/20.
    "three": {"r": _span("r", 0.15, 3.0, 0.4), "x": _span("x", 0.5, 32.0, 0.4),
              "s": {"mode": "s", "rate": 0.2}},
}


_DENOISER_KEYS = ("mode", "noise_density", "mean_noise_span_length", "rate")
PREFIX_SPLITS = ("middle", "random")
SOURCES = ("jsonl", "tfds")
BAD_RECORD_POLICIES = ("skip", "error")
PRETRAIN_CHUNKINGS = ("stream", "document")
FLAN_GROUPINGS = ("task", "submixture")
# Names that read a corpus from `data.data_dir` (the others are embedded or user-registered).
ON_DISK_CORPORA = ("redpajama_v1", "flan")
EMBEDDED_CORPORA = ("embedded_redpajama", "embedded_flan")
_NAME_RE = re.compile(r"^[\w.:#]+$")


def _corpus_of(name: str) -> str:
  """The corpus a mixture name belongs to ("" for a user-registered seqio name)."""
  base = name.split(":", 1)[0]
  root = base.split(".", 1)[0]
  return root if root in ON_DISK_CORPORA + EMBEDDED_CORPORA else ""


@dataclasses.dataclass
class DataConfig:
  """Which data to train on and how it is turned into packed arrays."""

  mixture: str = "embedded_redpajama"  # Task/mixture to train on: embedded_redpajama[.<subset>],
  #   embedded_flan[.<submixture>[.<task>]], redpajama_v1[...] / flan[...] (need data_dir), or
  #   any name already registered with seqio (used as is, no objective preprocessing added).
  eval_mixture: str = ""  # Task/mixture whose "validation" split gives held-out loss ("" = the
  #   validation split of `mixture`).
  data_dir: str = ""  # On-disk corpus root ("" for embedded names): RedPajama-V1 layout
  #   <root>/<subset>/*.jsonl[.zst] for redpajama_v1, FLAN layout
  #   <root>/<submixture>/<task>/<split>.jsonl[.zst] for flan.
  validation_dir: str = ""  # RedPajama layout root of held-out documents ("" = none; the embedded
  #   corpus always uses its own held-out root).
  source: str = "jsonl"  # "jsonl": read the shards directly (no preparation step); "tfds": convert
  #   them once into a TFDS dataset under tfds_data_dir and read that (fast, sharded TFRecords).
  tfds_data_dir: str = ""  # Where TFDS conversions live ("" = $T5LIKE_CACHE/tfds/<corpus>-<hash of
  #   its root>, T5LIKE_CACHE defaulting to ~/.cache/t5like).
  cache_dir: str = ""  # Read the corpus's tasks from the seqio cache built there by
  #   python -m t5like.tools.cache_data (any URI; tokenised once, docs/data.md); "" = tokenise
  #   on the fly. A missing or stale cache is an error naming the command that builds it.
  vocab_path: str = ""  # SentencePiece model file (path or gs:// URI) whose size must equal
  #   model.vocab_size; "" = the embedded 8,192-piece vocabulary, allowed only for the embedded
  #   corpora (build a corpus's 32,768-piece model with python -m t5like.tools.build_vocab).
  objective: str = "auto"  # "causal" (DecLLM LM on chunks of sequence_length), "prefix" (split
  #   each chunk of inputs_length+targets_length tokens into encoder input / decoder target, or
  #   DecLLM prefix LM), "inputs_targets" (instruction tuning on the records' inputs/targets), or
  #   "auto": inputs_targets for FLAN corpora; else causal for DecLLM with causal attention, prefix
  #   for DecLLM with decoder_attention="prefix" and for RedLLM; "span_corruption" (T5: spans of
  #   noise_density / mean_noise_span_length replaced by sentinels; needs data.extra_ids) or "ul2"
  #   (UL2's mixture of denoisers, data.ul2_denoisers). docs/objectives.md.
  extra_ids: int = 0  # Sentinel ids appended above the SentencePiece pieces (T5: 100), so
  #   model.vocab_size = pieces + extra_ids; sentinels count down from the top id. 0 = none (every
  #   non-denoising run); span_corruption / ul2 need enough for their spans (checked at start).
  noise_density: float = 0.15  # span_corruption: fraction of each chunk's tokens corrupted.
  mean_noise_span_length: float = 3.0  # span_corruption: mean length of a corrupted span.
  ul2_preset: str = "ul2"  # ul2: the denoisers when ul2_denoisers is empty: "ul2" (the paper's
  #   seven, docs/objectives.md) or "three" (R 3/15 %, X 32/50 %, S at 40/40/20).
  ul2_denoisers: dict[str, dict] = dataclasses.field(default_factory=dict)
  #   ul2: name -> {"mode": "r"|"x"|"s", "noise_density", "mean_noise_span_length", "rate"}; each
  #   becomes a seqio task with its mode token before the inputs, mixed by rate ({} = the preset).
  loss_on_inputs: bool = False  # DecLLM with causal attention on an inputs/targets objective
  #   (prefix, span_corruption, ul2): also train on the input tokens (Wang et al.'s full-sequence
  #   loss); False = loss on the targets only.
  pretrain_chunking: str = "stream"  # How pretraining text becomes sequences: "stream" (paper,
  #   T5): documents + EOS concatenated into one stream cut into full sequences of
  #   inputs_length+targets_length (prefix) or sequence_length (causal) tokens, so every RedLLM
  #   row is exactly inputs_length + targets_length and attention may cross a document boundary;
  #   "document": each document cut on its own (the last chunk shorter), chunks packed with
  #   segment isolation, never spanning documents.
  prefix_split: str = "middle"  # Where "prefix" splits a chunk of L tokens: "middle" puts
  #   floor(L*inputs_length/(inputs_length+targets_length)) tokens in the input (L/2 when the two
  #   lengths are equal, as in the paper); "random" splits chunks of min(I, T) + 1 tokens
  #   anywhere (uniform over the chunk; inputs and targets padded, as T5's prefix LM).
  sequence_length: int = 2048  # Decoder length of the "causal" objective (DecLLM pretraining).
  inputs_length: int = 1024  # Encoder input length (RedLLM) / prefix budget (DecLLM prefix LM).
  targets_length: int = 1024  # Decoder target length (RedLLM) / target budget.
  pack: bool = True  # Pack several examples per row with seqio's packing (segment ids 0 = padding).
  mixture_rates: dict[str, float] = dataclasses.field(default_factory=dict)  # Rate overrides by
  #   subset / sub-mixture / task name, e.g. {"common_crawl": 2.0, "book": 0}; 0 drops that part.
  #   Defaults: RedPajama subsets by token count (docs/paper.md §3), FLAN tasks by capped example count.
  flan_example_cap: int = 30_000  # Examples-proportional mixing cap per FLAN task (T5/FLAN style).
  flan_grouping: str = "task"  # FLAN pipelines: "task" = one per task (exact seqio mixing, any
  #   per-task rate; start-up ~0.5 s and ~15 MB per task), "submixture" = one per sub-mixture
  #   (jsonl or tfds), each task capped at flan_example_cap
  #   per epoch (same expected proportions; seconds to start with thousands; task rates only 0).
  shuffle_buffer_size: int = 1000  # Per-task example shuffle buffer (after preprocessing).
  bad_records: str = "skip"  # Invalid JSON / missing field / empty text / invalid UTF-8 records:
  #   "skip" (count them, see DataIterator.stats()) or "error" (fail naming the file and line).
  seed: int = 0  # Seed of file/example shuffles, mixing, random splits (same seed, same batches).
  validation_holdout: float = 0.0  # Fraction of documents held out for validation, by a hash of
  #   the document's text (FLAN: of its inputs), from every part that has no validation files
  #   (RedPajama without validation_dir, FLAN tasks without validation.jsonl); training never
  #   reads them. 0 = no hold-out: a run that evaluates such a part is refused at start-up.
  extra_eval: dict[str, str] = dataclasses.field(default_factory=dict)  # Extra held-out sets
  #   (Paloma style), name -> directory of *.jsonl[.zst] records with a 'text' field, each scored
  #   with the pretraining objective at every eval (metrics eval/<name>/loss).

  def validate(self) -> "DataConfig":
    check_choice("data.objective", self.objective, OBJECTIVES)
    check_choice("data.prefix_split", self.prefix_split, PREFIX_SPLITS)
    check_choice("data.source", self.source, SOURCES)
    check_choice("data.bad_records", self.bad_records, BAD_RECORD_POLICIES)
    check_choice("data.pretrain_chunking", self.pretrain_chunking, PRETRAIN_CHUNKINGS)
    check_choice("data.flan_grouping", self.flan_grouping, FLAN_GROUPINGS)
    if not 0.0 <= self.validation_holdout < 0.5:
      raise ConfigError(f"data.validation_holdout={self.validation_holdout} must be in [0, 0.5) "
                        "(a fraction of documents, e.g. 0.001)")
    for name, directory in self.extra_eval.items():
      if not isinstance(name, str) or not re.match(r"^\w+$", name) or not directory:
        raise ConfigError(f"data.extra_eval entries must be name -> directory with a name of "
                          f"letters, digits and '_', got {name!r}: {directory!r}")
    for name in ("sequence_length", "inputs_length", "targets_length", "flan_example_cap",
                 "shuffle_buffer_size"):
      check_positive(f"data.{name}", getattr(self, name))
    for field in ("mixture", "eval_mixture"):
      name = getattr(self, field)
      if field == "mixture" and not name:
        raise ConfigError("data.mixture must name a registered seqio task or mixture, e.g. "
                          "embedded_redpajama or embedded_flan")
      if name and not _NAME_RE.match(name):
        raise ConfigError(f"data.{field}={name!r} is not a valid seqio name (letters, digits, "
                          "'_', '.', ':', '#')")
      corpus = _corpus_of(name) if name else ""
      if corpus in ON_DISK_CORPORA and not self.data_dir:
        layout = ("<root>/<subset>/*.jsonl[.zst]" if corpus == "redpajama_v1"
                  else "<root>/<submixture>/<task>/<split>.jsonl[.zst]")
        raise ConfigError(
            f"data.{field}={name!r} reads a corpus on disk: set data.data_dir to its root "
            f"({layout})")
      if corpus in EMBEDDED_CORPORA and field == "mixture" and (
          self.data_dir or self.validation_dir):
        raise ConfigError(
            f"data.mixture={name!r} reads the embedded corpus, so data.data_dir / "
            "data.validation_dir would be ignored; use redpajama_v1 or flan to read a corpus on "
            "disk")
    if (self.objective in ("causal", "prefix") + DENOISING_OBJECTIVES
        and _corpus_of(self.mixture).endswith("flan")):
      raise ConfigError(
          f"data.objective={self.objective!r} needs plain text, but {self.mixture!r} is an "
          "instruction corpus (inputs/targets); use data.objective='inputs_targets' or 'auto'")
    if self.objective == "inputs_targets" and "redpajama" in _corpus_of(self.mixture):
      raise ConfigError(
          f"data.objective='inputs_targets' needs inputs/targets records, but {self.mixture!r} "
          "is plain text; use 'causal', 'prefix' or 'auto'")
    self._check_denoising()
    for key, rate in self.mixture_rates.items():
      if not isinstance(key, str) or not key:
        raise ConfigError(f"data.mixture_rates keys must be non-empty names, got {key!r}")
      if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not math.isfinite(rate):
        raise ConfigError(f"data.mixture_rates[{key!r}] must be a finite number, got {rate!r}")
      if rate < 0:
        raise ConfigError(f"data.mixture_rates[{key!r}] must be >= 0 (0 drops it), got {rate}")
    return self

  def denoisers(self) -> dict[str, dict]:
    """The objective's span/prefix denoisers: name -> settings ({} for other objectives)."""
    if self.objective == "span_corruption":
      return {"span": {"mode": "", "noise_density": self.noise_density,
                       "mean_noise_span_length": self.mean_noise_span_length, "rate": 1.0}}
    if self.objective == "ul2":
      chosen = self.ul2_denoisers or UL2_PRESETS.get(self.ul2_preset, {})
      return {name: {"noise_density": 0.15, "mean_noise_span_length": 3.0, "rate": 1.0, **d}
              for name, d in sorted(chosen.items())}
    return {}

  def sentinels_needed(self) -> int:
    """Reserved ids the objective needs: the most spans of one example (+ UL2's mode tokens)."""
    from t5like.config.spans import max_sentinels  # pylint: disable=g-import-not-at-top

    need = 0
    for d in self.denoisers().values():
      if d["mode"] != "s":
        lengths = (self.inputs_length - (1 if d["mode"] else 0), self.targets_length)
        need = max(need, max_sentinels(*lengths, d["noise_density"],
                                       d["mean_noise_span_length"]))
    return need + (UL2_MODE_TOKENS if self.objective == "ul2" else 0)

  def _check_denoising(self) -> None:
    check_positive("data.extra_ids", self.extra_ids, allow_zero=True)
    if self.objective == "ul2":
      check_choice("data.ul2_preset", self.ul2_preset, tuple(UL2_PRESETS))
      for name, d in self.ul2_denoisers.items():
        if not re.match(r"^\w+$", str(name)) or not isinstance(d, dict) or (
            set(d) - set(_DENOISER_KEYS)) or d.get("mode") not in UL2_MODES:
          raise ConfigError(
              f"data.ul2_denoisers[{name!r}]={d!r}: expected a name of letters/digits/'_' -> "
              f"{{\"mode\": one of {UL2_MODES}, \"noise_density\", \"mean_noise_span_length\", "
              "\"rate\"}")
    for name, d in self.denoisers().items():
      where = f"data.ul2_denoisers[{name!r}]" if self.objective == "ul2" else "data"
      if not 0.0 < d["noise_density"] < 1.0:
        raise ConfigError(f"{where} noise_density={d['noise_density']} must be in (0, 1)")
      if d["mean_noise_span_length"] < 1.0:
        raise ConfigError(f"{where} mean_noise_span_length={d['mean_noise_span_length']} "
                          "must be >= 1")
      if not d["rate"] >= 0:
        raise ConfigError(f"{where} rate={d['rate']} must be >= 0")
    if self.objective not in DENOISING_OBJECTIVES:
      return
    try:
      need = self.sentinels_needed()
    except ValueError as e:
      raise ConfigError(f"data.objective={self.objective!r}: {e}") from None
    if need > self.extra_ids:
      raise ConfigError(
          f"data.objective={self.objective!r} with inputs_length={self.inputs_length}, "
          f"targets_length={self.targets_length} needs {need} reserved ids (sentinels"
          f"{' + 3 mode tokens' if self.objective == 'ul2' else ''}) but the vocabulary has "
          f"data.extra_ids={self.extra_ids}. Set --config.data.extra_ids={max(100, need)}"
          f"{' (T5)' if need <= 100 else ''} or more and model.vocab_size to the pieces + "
          f"extra_ids (the embedded vocabulary: 8192 + {max(100, need)} = "
          f"{8192 + max(100, need)}), or lower data.inputs_length")
