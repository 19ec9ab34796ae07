"""Downstream tasks in BIG-bench's JSON task format (and FLAN-layout records), zero- and few-shot.

A BIG-bench task file is a JSON object with ``examples`` (each with ``input`` and either
``target_scores`` — option -> score, partial credit allowed — or ``target``, a string or list of
acceptable strings) and optional ``task_prefix``, ``example_input_prefix`` (default
``"\\nQ: "``), ``example_output_prefix`` (default ``"\\nA: "``), ``choice_prefix`` (default
``"\\n  choice: "``), ``append_choices_to_input`` (default true), ``few_shot_example_separator``
(default ``"\\n"``), ``stop_string`` / ``output_regex`` (how a generation is cut before it is
compared), ``metrics`` (e.g. ``multiple_choice_grade``, ``exact_str_match``) and
``name`` / ``description``. FLAN-layout jsonl records (``inputs``, ``targets``) and registered
seqio tasks (``seqio:NAME[@split][#N]``) load as generative tasks.

Prompts, choice order and few-shot examples follow BIG-bench's JSON-task rules (docs/evaluation.md):
duplicate examples (identical JSON) are dropped when the file is read; a fresh
``numpy.random.RandomState(42)`` per example permutes its *sorted* choices when they are appended
to the input (``json_task.default_format_fn`` gets a new generator for every example); the k-shot
prompts draw k other examples and one answer of each from a second ``RandomState(42)`` of their
own, continued across the examples in order (``make_nshot_dataset``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Any, Sequence

import numpy as np
from etils import epath

DEFAULTS = {"task_prefix": "", "example_input_prefix": "\nQ: ", "example_output_prefix": "\nA: ",
            "choice_prefix": "\n  choice: ", "append_choices_to_input": True,
            "few_shot_example_separator": "\n", "stop_string": "", "output_regex": ""}
KNOWN_METRICS = ("multiple_choice_grade", "exact_str_match")


class TaskFormatError(ValueError):
  """A task file that cannot be used; the message names the file and the field."""


SEED = 42  # BIG-bench's random_seed for choice order and few-shot draws.


@dataclasses.dataclass(frozen=True)
class Example:
  input: str  # The question / context, without prefixes.
  choices: tuple[str, ...] = ()  # Options (multiple choice), in file order: scored in this order.
  scores: tuple[float, ...] = ()  # Their target_scores (the grade adds the chosen one's).
  targets: tuple[str, ...] = ()  # Generative: acceptable generations. Multiple choice: the
  # answers a few-shot example may show (the file's "target", else the first best option).

  @property
  def is_multiple_choice(self) -> bool:
    return bool(self.choices)

  def correct(self) -> set[int]:
    best = max(self.scores)
    return {i for i, s in enumerate(self.scores) if s == best}


@dataclasses.dataclass(frozen=True)
class Task:
  name: str  # Task name (file's "name", else the file stem).
  path: str  # Where it was read from.
  sha256: str  # Hash of the file's bytes (reports record it).
  examples: tuple[Example, ...]  # Distinct examples, in file order.
  metrics: tuple[str, ...]  # Metrics to report.
  fmt: dict[str, Any]  # Prompt-format fields (DEFAULTS overridden by the file).
  duplicates: int = 0  # Examples dropped as exact duplicates of an earlier one.

  def _formatted(self, seed: int) -> list[str]:
    """Each example as BIG-bench formats it: input prefix, input, the appended choices (a
    permutation of the sorted options by a fresh ``RandomState(seed)`` per example), output
    prefix."""
    f, out = self.fmt, []
    for ex in self.examples:
      text = f["example_input_prefix"] + ex.input
      if ex.is_multiple_choice and f["append_choices_to_input"]:
        rng = np.random.RandomState(seed)  # A new generator for each example, as BIG-bench.
        shown = [str(c) for c in rng.permutation(sorted(ex.choices))]
        text += "".join(f["choice_prefix"] + c for c in shown)
      out.append(text + f["example_output_prefix"])
    return out

  def prompts(self, k: int = 0, seed: int = SEED) -> list[str]:
    """The model's context for every example with ``k`` shots (its answer is scored or
    generated after it): ``task_prefix`` + [k shots joined and followed by the separator] +
    the formatted example. Each shot is another example (drawn without replacement) followed
    by one of its answers (drawn), from one ``RandomState(seed)`` continued over the examples
    (not the generators that ordered the choices)."""
    formatted = self._formatted(seed)
    prefix, sep = self.fmt["task_prefix"], self.fmt["few_shot_example_separator"]
    if k <= 0:
      return [prefix + q for q in formatted]
    n = len(self.examples)
    if n < k + 1:
      raise ValueError(f"task {self.name} has {n} distinct examples: too few for {k} shots")
    out, rng = [], np.random.RandomState(seed)  # make_nshot_dataset's own generator.
    for i in range(n):
      others = [j for j in range(n) if j != i]
      shots = []
      for pick in rng.choice(len(others), k, replace=False):
        j = others[int(pick)]
        answers = self.examples[j].targets
        shots.append(formatted[j] + answers[int(rng.choice(len(answers)))])
      out.append(prefix + sep.join(shots) + sep + formatted[i])
    return out

  def answer(self, generated: str) -> str:
    """A generation as exact match compares it: cut at ``stop_string`` (default: the few-shot
    separator, where a k-shot prompt's next example would start), the first ``output_regex``
    match if the task gives one, surrounding whitespace stripped."""
    f = self.fmt
    stop = f["stop_string"] or f["few_shot_example_separator"]
    if stop and stop in generated:
      generated = generated[:generated.index(stop)]
    if f["output_regex"]:
      m = re.search(f["output_regex"], generated)
      generated = m.group(0) if m else ""
    return generated.strip()


def argmax(values: Sequence[float]) -> int:
  """BIG-bench's argmax: among tied maxima, the one picked by the SHA-256 of the values' float64
  bytes (deterministic, and not always the first)."""
  a = np.asarray(values, np.float64)
  best = np.flatnonzero(a == a.max())
  return int(best[int(hashlib.sha256(a.tobytes()).hexdigest(), 16) % len(best)])


def grade(example: Example, values: Sequence[float]) -> float:
  """``multiple_choice_grade`` of one example: the target score of the option with the highest
  value (``values`` in ``example.choices`` order), ties broken as ``argmax``."""
  return float(example.scores[argmax(values)])


def _fail(path, msg: str):
  raise TaskFormatError(f"{path}: {msg}")


def _example(path, i: int, raw: Any) -> Example:
  where = f"examples[{i}]"
  if not isinstance(raw, dict) or not isinstance(raw.get("input"), str):
    _fail(path, f"{where}.input must be a string (BIG-bench JSON task format)")
  if "target_scores" in raw:
    ts = raw["target_scores"]
    if not isinstance(ts, dict) or not ts:
      _fail(path, f"{where}.target_scores must be a non-empty object option -> score "
            "(an example without options cannot be ranked)")
    try:
      scores = tuple(float(v) for v in ts.values())
    except (TypeError, ValueError):
      _fail(path, f"{where}.target_scores values must be numbers")
    choices = tuple(str(k) for k in ts)
    t = raw.get("target")  # What a few-shot example shows; by default the first best option.
    targets = ((t,) if isinstance(t, str) else tuple(t) if isinstance(t, list) and t else
               (choices[scores.index(max(scores))],))
    return Example(raw["input"], choices, scores, tuple(str(x) for x in targets))
  if "target" in raw:
    t = raw["target"]
    targets = (t,) if isinstance(t, str) else tuple(t) if isinstance(t, list) else None
    if not targets or not all(isinstance(x, str) for x in targets):
      _fail(path, f"{where}.target must be a string or a non-empty list of strings")
    return Example(raw["input"], targets=targets)
  _fail(path, f"{where} has neither target_scores nor target")
  raise AssertionError  # Unreachable.


def load_task(path: str) -> Task:
  """Reads one BIG-bench JSON task file, or a FLAN-layout ``.jsonl`` file, from a path or URI."""
  p = epath.Path(path)
  if not p.exists():
    raise FileNotFoundError(f"task file {path} does not exist")
  blob = p.read_bytes()
  digest = hashlib.sha256(blob).hexdigest()
  if p.name.endswith(".jsonl"):
    examples = []
    for n, line in enumerate(blob.decode().splitlines()):
      if not line.strip():
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        _fail(path, f"line {n + 1} is not JSON ({e})")
      if not isinstance(rec.get("inputs"), str) or not isinstance(rec.get("targets"), str):
        _fail(path, f"line {n + 1} needs string fields 'inputs' and 'targets' (FLAN layout)")
      examples.append(Example(rec["inputs"], targets=(rec["targets"],)))
    fmt = dict(DEFAULTS, example_input_prefix="", example_output_prefix="\n",
               few_shot_example_separator="\n\n")
    return Task(p.name[:-len(".jsonl")], str(path), digest, tuple(examples),
                ("exact_str_match",), fmt)
  try:
    raw = json.loads(blob)
  except json.JSONDecodeError as e:
    _fail(path, f"not valid JSON ({e})")
  if not isinstance(raw, dict) or not isinstance(raw.get("examples"), list) or not raw["examples"]:
    _fail(path, "field 'examples' must be a non-empty list (BIG-bench JSON task format)")
  fmt = dict(DEFAULTS)
  for key in DEFAULTS:
    if key in raw:
      want = bool if key == "append_choices_to_input" else str
      if not isinstance(raw[key], want):
        _fail(path, f"field {key!r} must be a {want.__name__}")
      fmt[key] = raw[key]
  seen, distinct = set(), []
  for i, e in enumerate(raw["examples"]):  # BIG-bench drops exact duplicates, keeping order.
    key = json.dumps(e)
    if key not in seen:
      seen.add(key)
      distinct.append(_example(path, i, e))
  examples = tuple(distinct)
  metrics = raw.get("metrics") or (["multiple_choice_grade"] if examples[0].is_multiple_choice
                                   else ["exact_str_match"])
  if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
    _fail(path, "field 'metrics' must be a list of strings")
  known = tuple(m for m in metrics if m in KNOWN_METRICS) or (
      ("multiple_choice_grade",) if examples[0].is_multiple_choice else ("exact_str_match",))
  name = raw.get("name") or p.name.rsplit(".", 1)[0]
  return Task(str(name), str(path), digest, examples, known, fmt,
              duplicates=len(raw["examples"]) - len(examples))


SEQIO_PREFIX = "seqio:"


def load_seqio_task(ref: str, cfg=None) -> Task:
  """``seqio:NAME[@split][#N]``: the first N (default all) examples of a registered seqio task's
  split (default ``validation``) as a generative task, from its ``inputs`` / ``targets`` text
  (the ``*_pretokenized`` copies seqio keeps). t5like corpora (e.g. ``embedded_flan.<task>``)
  are registered from ``cfg`` (the checkpoint's data settings) first."""
  import seqio
  body = ref[len(SEQIO_PREFIX):]
  body, _, limit = body.partition("#")
  name, _, split = body.partition("@")
  split = split or "validation"
  if cfg is not None:
    from t5like.data import pipeline
    try:
      name = pipeline.resolve_mixture(cfg, name)
    except ValueError as e:
      raise TaskFormatError(f"{ref}: {e}") from None
  task = seqio.TaskRegistry.get(name) if name in seqio.TaskRegistry.names() else None
  if task is None:
    raise TaskFormatError(f"{ref}: {name!r} is not a registered seqio task (mixtures: give one "
                          "of their tasks)")
  ds = task.get_dataset(sequence_length=None, split=split, shuffle=False, num_epochs=1)
  examples = []
  def text(rec, key: str) -> str:
    value = rec.get(f"{key}_pretokenized", rec.get(key))
    if isinstance(value, bytes):
      return value.decode()
    if value is None or key not in task.output_features:
      raise TaskFormatError(f"{ref}: records have no {key!r} (fields: {sorted(rec)}); "
                            "prompt/answer pairs are needed")
    return task.output_features[key].vocabulary.decode([int(t) for t in value])  # Token ids.

  for rec in ds.as_numpy_iterator():
    examples.append(Example(text(rec, "inputs"), targets=(text(rec, "targets"),)))
    if limit and len(examples) >= int(limit):
      break
  if not examples:
    raise TaskFormatError(f"{ref}: split {split!r} has no examples")
  fmt = dict(DEFAULTS, example_input_prefix="", example_output_prefix="\n",
             few_shot_example_separator="\n\n")
  digest = hashlib.sha256(json.dumps([dataclasses.astuple(e) for e in examples]).encode())
  return Task(name, ref, digest.hexdigest(), tuple(examples), ("exact_str_match",), fmt)


def load_tasks(paths: Sequence[str], cfg=None) -> tuple[list[Task], dict[str, str]]:
  """Tasks from files and directories (``*.json`` / ``*.jsonl``, sorted) and registered seqio
  tasks (``seqio:NAME[@split][#N]``, see ``load_seqio_task``); bad ones are reported in the
  second value (path -> error) and the others still load."""
  tasks, errors = [], {}
  for path in paths:
    if path.startswith(SEQIO_PREFIX):
      try:
        tasks.append(load_seqio_task(path, cfg))
      except (TaskFormatError, ValueError) as e:
        errors[path] = str(e)
      continue
    p = epath.Path(path)
    files = (sorted(f for f in p.iterdir() if f.name.endswith((".json", ".jsonl")))
             if p.is_dir() else [p])
    for f in files:
      try:
        tasks.append(load_task(str(f)))
      except (TaskFormatError, FileNotFoundError) as e:
        errors[str(f)] = str(e)
  return tasks, errors


def shipped_tasks_dir() -> str:
  """The small BIG-bench-format tasks written by this project (tests, demo)."""
  return str(epath.Path(__file__).parent / "tasks")
