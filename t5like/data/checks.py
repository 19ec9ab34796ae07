"""Start-up checks of the data settings: everything a run would trip on later fails here, before
a model is built or compiled, with the path, what was expected and the flag that fixes it.

`check_data(cfg)` checks, in order:
  1. the corpus layout under ``data.data_dir`` (and ``data.validation_dir``): root present, at
     least one subset / task, no subset whose shards are all empty; with ``data.source="tfds"``
     on several hosts, a conversion already made once in a shared ``data.tfds_data_dir``;
  2. the vocabulary: an on-disk corpus needs ``data.vocab_path``, and its size plus
     ``data.extra_ids`` must equal ``model.vocab_size`` (smaller included); a vocabulary whose
     ``build_vocab`` record names its sentinel count must be used with that ``data.extra_ids``;
  3. validation, when the run evaluates (``train.eval_steps > 0``): every evaluated mixture needs
     a task with a ``validation`` split (validation files, or ``data.validation_holdout``), and
     every ``data.extra_eval`` directory must hold jsonl shards.
"""
from __future__ import annotations

import logging
import os

from etils import epy

from t5like.config import ConfigError
from t5like.config.data import ON_DISK_CORPORA, _corpus_of
from t5like.data import sources

with epy.lazy_imports():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

log = logging.getLogger("t5like.data")


def check_data(cfg, *, evaluate: bool | None = None) -> None:
  """Raises `ConfigError` for data settings that cannot work (see the module docstring)."""
  names = [cfg.data.mixture] + ([cfg.data.eval_mixture] if cfg.data.eval_mixture else [])
  for name in names:
    _check_layout(cfg, name)
    _check_tfds_shared(cfg, name)
  _check_vocab(cfg)
  if evaluate is None:
    evaluate = cfg.train.eval_steps > 0
  if evaluate:
    _check_validation(cfg)


def _check_layout(cfg, name: str) -> None:
  corpus = _corpus_of(name)
  data = cfg.data
  if corpus not in ON_DISK_CORPORA or (data.source == "tfds" and not data.data_dir):
    return
  try:
    if corpus == "flan":
      sources.flan_tasks(data.data_dir)
      return
    subsets = sources.redpajama_subsets(data.data_dir)
  except sources.LayoutError as e:
    raise ConfigError(f"data.data_dir={data.data_dir!r} (data.mixture={name!r}): {e}") from None
  for subset, files in subsets.items():
    if data.mixture_rates.get(subset, 1) != 0 and all(
        tf.io.gfile.stat(f).length == 0 for f in files):
      raise ConfigError(
          f"subset {os.path.join(data.data_dir, subset)} holds only empty shards; expected "
          f"non-empty *.jsonl[.zst] files. Add its data or drop it with "
          f"--config.data.mixture_rates='{{\"{subset}\": 0}}'")


def _check_tfds_shared(cfg, name: str, process_count: int | None = None) -> None:
  """Several hosts must not each convert the corpus: it is converted once, beforehand."""
  corpus, data = _corpus_of(name), cfg.data
  if data.source != "tfds" or corpus not in ON_DISK_CORPORA:
    return
  if process_count is None:
    import jax  # pylint: disable=g-import-not-at-top
    process_count = jax.process_count()
  if process_count == 1:
    return
  from t5like.data import tfds_builder  # pylint: disable=g-import-not-at-top

  fix = (f"convert it once for all hosts: python -m t5like.tools.prepare_data --data_dir "
         f"{data.data_dir or '<corpus root>'} --corpus "
         f"{'flan' if corpus == 'flan' else 'redpajama'} --tfds_data_dir <shared dir or bucket>"
         ", then set --config.data.tfds_data_dir to it")
  if not data.tfds_data_dir:
    raise ConfigError(f"data.source='tfds' on {process_count} hosts needs a shared "
                      f"data.tfds_data_dir (the default is a per-machine cache); {fix}")
  if corpus == "flan":
    infos = [os.path.join(data.tfds_data_dir, tfds_builder.FLAN_NAME, p, tfds_builder.VERSION)
             for p in tfds_builder.FLAN_PART_NAMES]
  else:
    subsets = [s for s in sources.REDPAJAMA_SUBSETS if data.mixture_rates.get(s, 1) != 0]
    infos = [os.path.join(data.tfds_data_dir, tfds_builder.REDPAJAMA_NAME, s,
                          tfds_builder.VERSION) for s in subsets]
  missing = [d for d in infos if not tf.io.gfile.exists(os.path.join(d, "dataset_info.json"))]
  if missing:
    raise ConfigError(f"no TFDS conversion at {missing[0]} (expected dataset_info.json there; "
                      f"{len(missing)} missing) for data.source='tfds' on {process_count} hosts; "
                      f"{fix}")


def _check_vocab(cfg) -> None:
  from t5like.data import pipeline, vocab  # pylint: disable=g-import-not-at-top

  data = cfg.data
  on_disk = [n for n in (data.mixture, data.eval_mixture) if _corpus_of(n) in ON_DISK_CORPORA]
  if (on_disk or data.extra_eval) and not data.vocab_path:
    kind = "flan" if any(_corpus_of(n) == "flan" for n in on_disk) else "redpajama"
    raise ConfigError(
        f"data.mixture={data.mixture!r} reads a corpus on disk but data.vocab_path is empty, which "
        f"selects the embedded {vocab.EMBEDDED_VOCAB_SIZE}-piece vocabulary (built from a 7 MB "
        "sample). Build the corpus's vocabulary once: python -m t5like.tools.build_vocab "
        f"--data_dir {data.data_dir or '<corpus root>'} --corpus {kind} --vocab_size "
        f"{cfg.model.vocab_size} --output_prefix <dir or gs://bucket/dir>/spm, then set "
        "--config.data.vocab_path=<that prefix>.model (or the embedded one, "
        f"{vocab.EMBEDDED_VOCAB}, for a toy run with model.vocab_size={vocab.EMBEDDED_VOCAB_SIZE})")
  if not (on_disk or _corpus_of(data.mixture)):
    return  # A user-registered seqio name: its own vocabulary is checked when it is built.
  try:
    size = vocab.vocab_size(data.vocab_path) + data.extra_ids
  except FileNotFoundError as e:
    raise ConfigError(str(e)) from None
  recorded = vocab.recorded_extra_ids(data.vocab_path)
  if recorded is not None and recorded != data.extra_ids:
    raise ConfigError(
        f"the vocabulary {data.vocab_path} was built with --extra_ids {recorded} (its .json "
        f"record) but data.extra_ids={data.extra_ids}; set --config.data.extra_ids={recorded} "
        f"and model.vocab_size={size - data.extra_ids + recorded}")
  if size != cfg.model.vocab_size:
    raise ConfigError(pipeline.vocab_mismatch_message(size, cfg))


def _check_validation(cfg) -> None:
  import seqio  # pylint: disable=g-import-not-at-top

  from t5like.data import pipeline  # pylint: disable=g-import-not-at-top

  data = cfg.data
  name = data.eval_mixture or data.mixture
  try:
    provider = seqio.get_mixture_or_task(pipeline.resolve_mixture(cfg, name))
  except (sources.LayoutError, ValueError) as e:
    raise ConfigError(f"cannot set up the validation data of {name!r} "
                      f"(data.validation_dir={data.validation_dir!r}): {e}") from None
  parts = list(getattr(provider, "tasks", [provider]))
  missing = [t.name for t in parts if "validation" not in t.splits]
  if len(missing) == len(parts):
    raise ConfigError(
        f"{name!r} has no validation data ({_where(cfg, name)}) but the run evaluates every "
        f"train.eval_every={cfg.train.eval_every} steps. Set --config.data.validation_holdout="
        "0.001 (hold out 0.1% of documents by hash; training never sees them)"
        + (", or --config.data.validation_dir=<held-out root in the same layout>"
           if _corpus_of(name) == "redpajama_v1" else "")
        + ", or --config.data.eval_mixture=<a mixture with a validation split>, or "
        "--config.train.eval_steps=0 (no held-out loss)")
  if missing:
    log.warning("%d of %d tasks of %s have no validation split and are not evaluated (e.g. %s); "
                "data.validation_holdout > 0 holds out documents of those tasks",
                len(missing), len(parts), name, missing[0])
  for extra, directory in sorted(data.extra_eval.items()):
    try:
      sources.list_shards(directory, "expected *.jsonl[.zst] records with a 'text' field")
    except sources.LayoutError as e:
      raise ConfigError(f"data.extra_eval[{extra!r}]={directory!r}: {e}") from None


def _where(cfg, name: str) -> str:
  corpus = _corpus_of(name)
  if corpus == "redpajama_v1":
    return "data.validation_dir is empty and data.validation_holdout=0"
  if corpus == "flan":
    return (f"no task under {cfg.data.data_dir} has a validation.jsonl[.zst] and "
            "data.validation_holdout=0")
  return "none of its tasks has a 'validation' split"
