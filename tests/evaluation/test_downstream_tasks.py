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
  assert ex.choices == ("yes", "no") and ex.correct() == {0} and ex.targets == ("yes",)
  # Two choices: a fresh RandomState(42) per example permutes the sorted ["no", "yes"].
  orders = [list(np.random.RandomState(42).permutation(["no", "yes"])) for _ in range(6)]
  zero = task.prompts(0)
  assert zero[1] == "Answer.\n\nIn: q1" + "".join("\n - " + c for c in orders[1]) + "\nOut: "
  hidden = bigbench.load_task(_write(tmp_path, "h.json", {**TASK, "append_choices_to_input": False}))
  assert hidden.prompts(0)[0] == "Answer.\n\nIn: q0\nOut: "
  defaults = bigbench.load_task(_write(tmp_path, "d.json", {"examples": [
      {"input": "2+2", "target": ["4", "four"]}]}))
  assert defaults.prompts(0) == ["\nQ: 2+2\nA: "]
  assert defaults.metrics == ("exact_str_match",) and defaults.examples[0].targets == ("4", "four")
  flan = bigbench.load_task(_write(tmp_path, "f.jsonl", '{"inputs": "hi", "targets": "yo"}\n'))
  assert flan.examples[0].targets == ("yo",) and flan.prompts(0) == ["hi\n"]


def test_appended_choices_are_a_seeded_permutation_of_the_sorted_choices(tmp_path):
  """BIG-bench (json_task.default_format_fn): a fresh RandomState(42) for each example permutes
  its sorted options, so examples with the same options show them in the same order; the file
  order of ``target_scores`` plays no part (it is only the scoring order)."""
  files = [["delta", "alpha", "charlie", "bravo"], ["z", "y", "x"], ["p", "q", "r", "s", "t"],
           ["bravo", "charlie", "alpha", "delta"], ["x", "z", "y"]]
  task = bigbench.load_task(_write(tmp_path, "p.json", {"examples": [
      {"input": f"e{i}", "target_scores": {c: float(j == 0) for j, c in enumerate(ch)}}
      for i, ch in enumerate(files)]}))
  want = [list(np.random.RandomState(42).permutation(sorted(ch))) for ch in files]
  assert want[3] == want[0] and want[4] == want[1]  # Same options: same order, every example.
  continued = np.random.RandomState(42)  # One generator across the examples would differ.
  assert [list(continued.permutation(sorted(ch))) for ch in files] != want
  for i, prompt in enumerate(task.prompts(0)):
    assert prompt == f"\nQ: e{i}" + "".join("\n  choice: " + c for c in want[i]) + "\nA: "
  assert [list(e.choices) for e in task.examples] == files  # Scored (and graded) in file order.
  assert any(w != f for w, f in zip(want, files))  # The file order would have differed.
  reordered = bigbench.load_task(_write(tmp_path, "r.json", {"examples": [
      {"input": f"e{i}", "target_scores": {c: float(j == 0) for j, c in
                                           reversed(list(enumerate(ch)))}}
      for i, ch in enumerate(files)]}))
  assert reordered.prompts(0) == task.prompts(0)  # Same options, other file order: same prompt.


def test_k_shot_prompts_follow_bigbench_draws(tmp_path):
  """k-shot (json_task.make_nshot_dataset): a RandomState(42) of its own (not the per-example
  generators that ordered the choices) draws, for each example in order, k others without
  replacement and one answer of each; shots are joined by the separator and the task prefix
  comes once, first."""
  examples = [{"input": f"q{i}", "target_scores": {"yes": i % 2, "no": 1 - i % 2}}
              for i in range(5)]
  examples[3]["target"] = ["no", "nope"]  # An explicit target: the answers a shot may show.
  task = bigbench.load_task(_write(tmp_path, "toy.json", {**TASK, "examples": examples}))
  order = np.random.RandomState(42).permutation(["no", "yes"])  # Every example's choices.
  fmt = [f"\nIn: q{i}" + "".join("\n - " + c for c in order) + "\nOut: " for i in range(5)]
  rng = np.random.RandomState(42)  # The shots' generator, continued across the examples.
  answers = [("no",), ("yes",), ("no",), ("no", "nope"), ("no",)]
  want = []
  for i in range(5):
    others = [j for j in range(5) if j != i]
    shots = [others[p] for p in rng.choice(4, 2, replace=False)]
    assert i not in shots
    ctx = "\n##\n".join(fmt[j] + answers[j][rng.choice(len(answers[j]))] for j in shots)
    want.append("Answer.\n" + ctx + "\n##\n" + fmt[i])
  assert task.prompts(2) == want
  assert task.prompts(2) == want  # Deterministic.
  assert task.prompts(2, seed=7) != want
  with pytest.raises(ValueError, match="5 distinct examples: too few for 5 shots"):
    task.prompts(5)


def test_duplicate_examples_are_dropped(tmp_path):
  ex = {"input": "q", "target_scores": {"a": 1, "b": 0}}
  task = bigbench.load_task(_write(tmp_path, "d.json", {"examples": [
      ex, {"input": "r", "target": "x"}, ex, dict(ex), {**ex, "comment": "other"}]}))
  assert len(task.examples) == 3 and task.duplicates == 2


def test_ties_are_broken_by_the_hash_of_the_scores():
  """BIG-bench's argmax: among tied maxima, index sha256(float64 bytes) mod their number."""
  import hashlib
  picks = []
  for k in range(8):
    values = [-1.0 - k, -3.0 - k, -1.0 - k, -2.0 - k, -1.0 - k]
    tied = [0, 2, 4]
    h = int(hashlib.sha256(np.asarray(values, np.float64).tobytes()).hexdigest(), 16)
    assert bigbench.argmax(values) == tied[h % 3]
    picks.append(bigbench.argmax(values))
  assert set(picks) != {0}  # Not simply the first maximum (np.argmax).
  assert bigbench.argmax([0.0, -1.0, -2.0]) == 0


class _Chars:
  """A vocabulary of one id per character (enough for the grading tests)."""
  eos_id = 1

  def encode(self, text):
    return [ord(c) for c in text]


def test_multiple_choice_grade_gives_partial_credit_and_ignores_duplicates(tmp_path, monkeypatch):
  """The issue's case: the chosen options carry target scores 1 and 0.5 and one example is
  repeated 5 times: BIG-bench's grade is (1 + 0.5) / 2 = 0.75 — not the share of examples whose
  choice has the top score, counted with the duplicates (1/6 here)."""
  from t5like.evaluation import downstream
  preferred = {"good": 0.0, "half": -0.1, "best": -5.0, "bad": -9.0}
  monkeypatch.setattr(downstream, "option_loglikelihoods", lambda model, pairs: [
      preferred["".join(map(chr, option))] for _, option in pairs])
  one = {"input": "a", "target_scores": {"bad": 0, "good": 1}}
  half = {"input": "b", "target_scores": {"best": 1, "half": 0.5, "bad": 0}}
  task = bigbench.load_task(_write(tmp_path, "g.json", {"examples": [one] + [half] * 5}))
  out = downstream.score_tasks(None, _Chars(), [task], shots=(0, 1))["tasks"]["g"]
  assert out["duplicates"] == 4 and out["examples"] == 2
  assert out["0-shot"]["multiple_choice_grade"] == pytest.approx(0.75)
  assert out["0-shot"]["multiple_choice_grade_stderr"] == pytest.approx(0.25)  # std 0.354/sqrt 2
  assert out["1-shot"]["multiple_choice_grade"] == pytest.approx(0.75)


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
  prompt = list(vocab.encode(probe.prompts(0)[0]))
  out = generate(model, [prompt], max_new_tokens=5, eos_id=vocab.eos_id)[0]
  said = probe.answer(vocab.decode(out))
  task = bigbench.load_task(_write(tmp_path, "gen.json", {"examples": [
      {"input": "3 plus 4", "target": [said, "seven"]},
      {"input": "1 plus 1", "target": "certainly not generated"}]}))
  result = score_tasks(model, vocab, [task], shots=(0, 1), max_new_tokens=5)  # As the probe.
  assert result["tasks"]["gen"]["0-shot"]["exact_str_match"] == 0.5
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
