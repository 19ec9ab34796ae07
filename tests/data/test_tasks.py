"""Task/mixture registry: names, idempotent registration, mixing rates (given and measured)."""
import collections
import json

import numpy as np
import pytest
import seqio
import sentencepiece as spm

from data_helpers import FLAN_SIZES, MARKERS
from t5like.data import pipeline, sources, tasks

ONLY = ('{"c4": 0, "common_crawl": 0, "github": 0, "stackexchange": 0, '
        '"arxiv": %s, "book": %s, "wikipedia": %s}')


def _rp_cfg(make_cfg, root, rates=(3, 1, 0), **kw):
  return make_cfg(**{"data.mixture": "redpajama_v1", "data.data_dir": root[0],
                     "data.validation_dir": root[1], "data.mixture_rates": ONLY % rates,
                     "data.sequence_length": 128, **kw})


def test_names_registration_is_idempotent_and_redone_on_change(make_cfg, redpajama_root):
  cfg = _rp_cfg(make_cfg, redpajama_root)
  name = pipeline.resolve_mixture(cfg)
  assert name == "redpajama_v1:lm"
  mixture = seqio.get_mixture_or_task(name)
  assert pipeline.resolve_mixture(cfg) == name
  assert seqio.get_mixture_or_task(name) is mixture  # Same spec: nothing re-registered.
  assert {"redpajama_v1", "redpajama_v1.arxiv", "redpajama_v1.book"} <= set(
      pipeline.list_task_names())
  assert "redpajama_v1.wikipedia:lm" not in seqio.TaskRegistry.names()  # Rate 0: skipped.
  assert {"embedded_redpajama", "embedded_flan"} <= set(pipeline.list_task_names())
  # A RedLLM config registers the prefix variant beside the causal one.
  red = _rp_cfg(make_cfg, redpajama_root, **{"model.family": "redllm"})
  assert pipeline.resolve_mixture(red) == "redpajama_v1:prefix_middle"
  assert name in seqio.MixtureRegistry.names()
  # Changed rates: the same name is registered again with the new rates.
  cfg2 = _rp_cfg(make_cfg, redpajama_root, rates=(1, 1, 1))
  assert pipeline.resolve_mixture(cfg2) == name
  new = seqio.get_mixture_or_task(name)
  assert new is not mixture and len(new.tasks) == 3
  assert pipeline.resolve_mixture(cfg2, "redpajama_v1.book") == "redpajama_v1.book:lm"
  with pytest.raises(ValueError, match="not a part of redpajama_v1; available"):
    pipeline.resolve_mixture(cfg2, "redpajama_v1.nonsense")


def test_paper_token_counts_are_default_rates(make_cfg, redpajama_root):
  cfg = make_cfg(**{"data.mixture": "redpajama_v1", "data.data_dir": redpajama_root[0],
                    "data.mixture_rates": '{"c4": 0, "common_crawl": 0, "github": 0, '
                                          '"stackexchange": 0, "wikipedia": 7.5}'})
  mixture = seqio.get_mixture_or_task(pipeline.resolve_mixture(cfg))
  rates = {t.name.split(".")[1].split(":")[0]: mixture.get_rate(t) for t in mixture.tasks}
  assert rates == {"arxiv": 28.0, "book": 26.0, "wikipedia": 7.5}


def test_unknown_rate_key_is_rejected(make_cfg, redpajama_root):
  cfg = _rp_cfg(make_cfg, redpajama_root)
  cfg.data.mixture_rates = {**cfg.data.mixture_rates, "bookz": 1.0}
  with pytest.raises(ValueError, match=r"\['bookz'\] that are not parts of redpajama_v1"):
    pipeline.resolve_mixture(cfg)


def _marker_ids(spm_path):
  sp = spm.SentencePieceProcessor(model_file=spm_path)
  return {subset: sp.encode(word)[-1] for subset, word in MARKERS.items()}


def test_redpajama_mixture_rates_hold_on_sampled_examples(make_cfg, redpajama_root, spm_path):
  cfg = _rp_cfg(make_cfg, redpajama_root, **{"data.pack": "false"})
  ds = pipeline.make_dataset(cfg, batch_size=1, batched=False).take(3000)
  markers = _marker_ids(spm_path)
  counts = collections.Counter()
  for row in ds.as_numpy_iterator():
    toks = set(row["decoder_target_tokens"].tolist())
    (subset,) = [s for s, m in markers.items() if m in toks]
    counts[subset] += 1
  assert counts["wikipedia"] == 0
  assert abs(counts["arxiv"] / 3000 - 0.75) < 0.03, counts


def test_token_count_rates_match_the_tokens_on_disk(redpajama_root, spm_path):
  spec = tasks.CorpusSpec(kind="redpajama", name="tok_rp", root=redpajama_root[0],
                          rate_by_tokens=True, vocab_path=spm_path)
  mixture = seqio.get_mixture_or_task(tasks.register(spec))
  sp = spm.SentencePieceProcessor(model_file=spm_path)
  for task in mixture.tasks:
    subset = task.name.split(".")[1].split(":")[0]
    files = sources.redpajama_subsets(redpajama_root[0])[subset]
    texts = [r["text"].decode() for f in files for _, r in sources.iter_records(
        f, sources.TEXT_SCHEMA)]
    exact = sum(len(ids) for ids in sp.encode(texts))
    assert mixture.get_rate(task) == pytest.approx(exact, rel=1e-9)  # Sample = whole subset.


def _flan_cfg(make_cfg, flan_root, rates="{}", cap=20):
  return make_cfg(**{"data.mixture": "flan", "data.data_dir": flan_root,
                     "data.flan_example_cap": cap, "data.mixture_rates": rates,
                     "model.family": "redllm", "data.inputs_length": 64, "data.pack": "false"})


def test_flan_examples_proportional_with_cap(make_cfg, flan_root, spm_path):
  cfg = _flan_cfg(make_cfg, flan_root)
  mixture = seqio.get_mixture_or_task(pipeline.resolve_mixture(cfg))
  rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
  assert rates == {"flan.sub_a.continue": 20.0, "flan.sub_a.define": 20.0, "flan.sub_b.qa": 10.0}
  sub = seqio.get_mixture_or_task("flan.sub_a")
  assert sorted(t.name for t in sub.tasks) == ["flan.sub_a.continue", "flan.sub_a.define"]
  sp = spm.SentencePieceProcessor(model_file=spm_path)
  counts = collections.Counter()
  for row in pipeline.make_dataset(cfg, batch_size=1, batched=False).take(2500).as_numpy_iterator():
    toks = row["encoder_input_tokens"]
    counts[sp.decode(toks[toks > 1].tolist()).split()[0]] += 1
  total = sum(counts.values())
  assert set(counts) == {t for _, t in FLAN_SIZES}
  for task, expected in (("define", 0.4), ("continue", 0.4), ("qa", 0.2)):
    assert abs(counts[task] / total - expected) < 0.03, counts


def test_flan_submixture_and_task_overrides(make_cfg, flan_root):
  cfg = _flan_cfg(make_cfg, flan_root, rates=json.dumps({"sub_a": 1, "sub_b": 1}), cap=40)
  mixture = seqio.get_mixture_or_task(pipeline.resolve_mixture(cfg))
  rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
  # sub_a's total of 1 is shared by capped counts 40 (define) and 30 (continue).
  assert rates == pytest.approx({"flan.sub_a.define": 4 / 7, "flan.sub_a.continue": 3 / 7,
                                 "flan.sub_b.qa": 1.0})
  cfg = _flan_cfg(make_cfg, flan_root, rates=json.dumps({"define": 0, "qa": 5}))
  mixture = seqio.get_mixture_or_task(pipeline.resolve_mixture(cfg))
  assert {t.name: mixture.get_rate(t) for t in mixture.tasks} == {
      "flan.sub_a.continue": 20.0, "flan.sub_b.qa": 5.0}
  assert np.isclose(seqio.get_mixture_or_task("flan.sub_b").get_rate(
      seqio.get_mixture_or_task("flan.sub_b.qa")), 5.0)


def test_failed_registration_leaves_nothing_behind(make_cfg, flan_root):
  cfg = _flan_cfg(make_cfg, flan_root, rates=json.dumps({"sub_a": 0, "qa": 0}))
  before = set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names())
  for _ in range(2):  # The retry fails the same way (no "duplicate provider").
    with pytest.raises(ValueError, match="every task of flan has rate 0"):
      pipeline.resolve_mixture(cfg)
  assert set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names()) <= before
  assert pipeline.resolve_mixture(_flan_cfg(make_cfg, flan_root)) == "flan"
