"""BIG-bench parsing, k-shot prompts, and rank-classification log-likelihoods by hand."""
from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "models"))
from helpers import tiny_model  # noqa: E402
from t5like.evaluation import bigbench, scoring  # noqa: E402

TASK = {
    "name": "toy", "task_prefix": "Answer.\n", "example_input_prefix": "\nIn: ",
    "example_output_prefix": "\nOut: ", "choice_prefix": "\n - ", "append_choices_to_input": True,
    "few_shot_example_separator": "\n##\n", "metrics": ["multiple_choice_grade", "bleu"],
    "examples": [{"input": f"q{i}", "target_scores": {"yes": i % 2, "no": 1 - i % 2}}
                 for i in range(6)]}


def _write(tmp_path, name, blob):
  p = tmp_path / name
  p.write_text(blob if isinstance(blob, str) else json.dumps(blob))
  return str(p)


def test_bigbench_fields_shape_the_prompt(tmp_path):
  task = bigbench.load_task(_write(tmp_path, "toy.json", TASK))
  assert task.name == "toy" and task.metrics == ("multiple_choice_grade",)  # bleu: unknown.
  ex = task.examples[1]
  assert ex.choices == ("yes", "no") and ex.correct() == {0}
  shot = task.examples[2]
  assert task.prompt(ex, [shot]) == ("Answer.\n\nIn: q2\n - yes\n - no\nOut: no\n##\n"
                                     "\nIn: q1\n - yes\n - no\nOut: ")
  hidden = bigbench.load_task(_write(tmp_path, "h.json", {**TASK, "append_choices_to_input": False}))
  assert hidden.prompt(hidden.examples[0]) == "Answer.\n\nIn: q0\nOut: "
  defaults = bigbench.load_task(_write(tmp_path, "d.json", {"examples": [
      {"input": "2+2", "target": ["4", "four"]}]}))
  assert defaults.prompt(defaults.examples[0]) == "\nQ: 2+2\nA: "
  assert defaults.metrics == ("exact_str_match",) and defaults.examples[0].targets == ("4", "four")
  flan = bigbench.load_task(_write(tmp_path, "f.jsonl", '{"inputs": "hi", "targets": "yo"}\n'))
  assert flan.examples[0].targets == ("yo",) and flan.prompt(flan.examples[0]) == "hi\n"


def test_k_shot_is_deterministic_and_never_the_scored_example(tmp_path):
  task = bigbench.load_task(_write(tmp_path, "toy.json", TASK))
  for i in range(6):
    shots = task.shots_for(i, 3, seed=7)
    assert len(shots) == 3 and task.examples[i] not in shots
    assert shots == task.shots_for(i, 3, seed=7)
  assert any(task.shots_for(i, 3, 7) != task.shots_for(i, 3, 8) for i in range(6))
  assert len(task.shots_for(0, 10, 0)) == 5  # Capped at the other examples.


@pytest.mark.parametrize("blob,field", [
    ("{not json", "not valid JSON"), ({"examples": []}, "'examples'"),
    ({"examples": [{"input": 3, "target": "x"}]}, "examples[0].input"),
    ({"examples": [{"input": "a", "target_scores": {}}]}, "examples[0].target_scores"),
    ({"examples": [{"input": "a"}]}, "neither target_scores nor target"),
    ({**TASK, "append_choices_to_input": "yes"}, "append_choices_to_input")])
def test_bad_task_files_name_the_file_and_field(tmp_path, blob, field):
  path = _write(tmp_path, "bad.json", blob)
  with pytest.raises(bigbench.TaskFormatError, match="bad.json") as e:
    bigbench.load_task(path)
  assert field in str(e.value)
  good = _write(tmp_path, "good.json", TASK)
  tasks, errors = bigbench.load_tasks([str(tmp_path)])
  assert [t.name for t in tasks] == ["toy"] and list(errors) == [path] and good


def test_shipped_tasks_load():
  tasks, errors = bigbench.load_tasks([bigbench.shipped_tasks_dir()])
  assert not errors and {t.name for t in tasks} >= {"antonyms", "famous_lines", "small_sums"}


def _by_hand_decllm(model, ctx, opt, prefix):
  seq = ctx + opt
  batch = {"decoder_input_tokens": jnp.asarray([[0] + seq[:-1]])}
  if prefix:
    batch["decoder_causal_attention"] = jnp.asarray([[1] * (len(ctx) + 1) + [0] * (len(opt) - 1)])
  logp = np.asarray(jax.nn.log_softmax(model(batch)[0].astype(jnp.float32)), np.float64)
  return sum(logp[len(ctx) + j, seq[len(ctx) + j]] for j in range(len(opt)))  # Next token.


@pytest.mark.parametrize("family,attention", [("decllm", "causal"), ("decllm", "prefix"),
                                              ("redllm", "causal")])
def test_option_loglikelihoods_equal_a_hand_computation(family, attention):
  model = tiny_model(family, decoder_attention=attention)
  pairs = [([5, 6, 7], [8, 9]), ([11, 12, 13, 14, 15], [16]), ([20], [21, 22, 23])]
  got = scoring.option_loglikelihoods(model, pairs, batch_size=2)  # Batched and padded.
  for (ctx, opt), value in zip(pairs, got):
    if family == "redllm":  # Context -> encoder; option scored with continuous positions.
      batch = {"encoder_input_tokens": jnp.asarray([ctx]),
               "decoder_input_tokens": jnp.asarray([[0] + opt[:-1]])}
      logp = np.asarray(jax.nn.log_softmax(model(batch)[0].astype(jnp.float32)), np.float64)
      want = sum(logp[j, opt[j]] for j in range(len(opt)))
    else:
      want = _by_hand_decllm(model, ctx, opt, attention == "prefix")
    assert value == pytest.approx(want, rel=1e-4, abs=1e-4)


def test_long_contexts_are_cut_from_the_left_or_rejected():
  trunc = scoring.Truncation(max_context=4)
  assert scoring.fit_context([1, 2, 3, 4, 5, 6], trunc, "truncate") == [3, 4, 5, 6]
  assert trunc.truncated == 1
  with pytest.raises(scoring.ContextTooLong, match="longer than the model's 4"):
    scoring.fit_context([1, 2, 3, 4, 5], trunc, "error")


def test_generations_are_cut_at_the_stop_string_and_regex(tmp_path):
  task = bigbench.load_task(_write(tmp_path, "g.json", {"examples": [
      {"input": "2+2", "target": "4"}]}))
  assert task.answer(" 4\nQ: 3+3\nA: 6") == "4"  # Default stop: the few-shot separator.
  cut = bigbench.load_task(_write(tmp_path, "c.json", {
      "stop_string": ".", "output_regex": r"\d+", "examples": [{"input": "x", "target": "4"}]}))
  assert cut.answer("the answer is 42. Next") == "42"
  assert cut.answer("no digits. 7") == ""


def test_generative_tasks_score_greedy_generations_by_exact_match(tmp_path):
  """Targets set to what the model generates greedily (one row) and to something else (the
  other): exact match is 1/2 — the decoding, cutting and comparing are the task's own."""
  from t5like.data.vocab import get_vocabulary
  from t5like.evaluation.downstream import score_tasks
  from t5like.inference import generate
  vocab = get_vocabulary("")
  model = tiny_model("decllm", seed=5, vocab_size=vocab.vocab_size)
  base = {"examples": [{"input": "3 plus 4", "target": "?"}, {"input": "1 plus 1", "target": "?"}]}
  probe = bigbench.load_task(_write(tmp_path, "probe.json", base))
  prompt = list(vocab.encode(probe.prompt(probe.examples[0])))
  out = generate(model, [prompt], max_new_tokens=5, eos_id=vocab.eos_id)[0]
  said = probe.answer(vocab.decode(out))
  task = bigbench.load_task(_write(tmp_path, "gen.json", {"examples": [
      {"input": "3 plus 4", "target": [said, "seven"]},
      {"input": "1 plus 1", "target": "certainly not generated"}]}))
  result = score_tasks(model, vocab, [task], shots=(0, 1), max_new_tokens=5)  # As the probe.
  assert result["tasks"]["gen"]["0-shot"] == {"exact_str_match": 0.5}
  assert "exact_str_match" in result["tasks"]["gen"]["1-shot"]


def test_registered_seqio_tasks_load_as_generative_tasks():
  """``seqio:NAME[@split][#N]``: the first N validation records of a registered task, in file
  order, as prompt/answer pairs (token ids decoded back to the source text)."""
  import io

  import zstandard

  from t5like.config import load_config
  from t5like.data import tasks as data_tasks
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  cfg = load_config(os.path.join(root, "configs", "tiny_decllm_flan.py"), [])
  name = "embedded_flan.definitions.devils_dictionary_define"
  loaded, errors = bigbench.load_tasks([f"seqio:{name}#3", "seqio:no_such_task"], cfg)
  assert len(loaded) == 1 and list(errors) == ["seqio:no_such_task"]
  task = loaded[0]
  raw = os.path.join(data_tasks.EMBEDDED_DIR, "flan", "definitions", "devils_dictionary_define",
                     "validation.jsonl.zst")
  with open(raw, "rb") as f:
    text = zstandard.ZstdDecompressor().stream_reader(f).read().decode()
  records = [json.loads(line) for line in io.StringIO(text) if line.strip()][:3]
  # Same tokens as the source text (the vocabulary folds newlines into spaces, so compare ids).
  from t5like.data.vocab import get_vocabulary
  vocab = get_vocabulary(cfg.data.vocab_path)
  assert [vocab.encode(e.input) for e in task.examples] == [vocab.encode(r["inputs"])
                                                            for r in records]
  assert [vocab.encode(e.targets[0]) for e in task.examples] == [vocab.encode(r["targets"])
                                                                 for r in records]
  assert task.metrics == ("exact_str_match",) and task.path == f"seqio:{name}#3"
