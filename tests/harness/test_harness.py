"""The ``t5like`` model of lm-evaluation-harness (``t5like/evaluation/harness.py``) on local
tasks: multiple choice equals t5like's own rank classification, RedLLM's rolling windows score
every token once with the encoder / decoder split of training, generations are t5like's greedy
tokens cut at the stop sequence, 8 fake devices give the scores of one, two processes on
localhost (jax.distributed) the responses of one with the reports written once, ``eval.py
--harness`` writes its reports (a task without data, an unknown task: one error each), and the
paper's downstream group is the documented 13 harness tasks."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

from cli_scripts import load_script
from harness_tasks import (GEN_DOCS, NAMES, TEXTS, make_checkpoint, per_request,
                           write_tasks)
from t5like.data.vocab import get_vocabulary
from t5like.evaluation import harness, harness_run
from t5like.evaluation.scoring import option_loglikelihoods
from t5like.inference import generate

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "training"))
from train_helpers import run_script, subprocess_env  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
  return write_tasks(str(tmp_path_factory.mktemp("tasks")))


@pytest.fixture(scope="module", params=["decllm", "redllm"])
def run(request, tmp_path_factory, tasks_dir):
  """(T5LikeLM, the harness's results with samples) of one tiny checkpoint on the local tasks."""
  workdir = make_checkpoint(str(tmp_path_factory.mktemp(request.param)), request.param, seed=3)
  lm = harness.T5LikeLM(workdir=workdir, batch_size="4")
  manager, _ = harness_run.load_tasks(NAMES, [tasks_dir])
  return lm, harness_run.evaluate(lm, NAMES, manager, log_samples=True)


def test_multiple_choice_equals_t5like_rank_classification(run):
  lm, results = run
  rows = per_request(results, "t5like_mc")
  assert len(rows) == 8 and results["results"]["t5like_mc"]["acc,none"] in (0, 1 / 3, 2 / 3, 1)
  vocab = get_vocabulary("")
  pairs = []
  for (ctx, cont), _ in rows:  # The harness's split: the context's trailing space moves.
    assert ctx.endswith("Answer:") and cont.startswith(" ")
    c = vocab.encode(ctx)
    o = vocab.encode(ctx + cont)[len(c):] if lm.family == "decllm" else vocab.encode(cont)
    pairs.append((list(c), list(o)))
  # Longer rows are cut from the left as the harness's HF model cuts them: DecLLM to 32 tokens
  # (data.sequence_length), RedLLM's encoder to 16 (data.inputs_length).
  if lm.family == "decllm":
    cut = [([0] + c + o)[-33:] for c, o in pairs]
    want = np.asarray([_causal_loglikelihood(lm.model, s[:len(s) - len(o)], o)
                       for s, (_, o) in zip(cut, pairs)])
    assert any(len(c) + len(o) + 1 > 33 for c, o in pairs)
  else:
    want = np.asarray(option_loglikelihoods(lm.model, [(c[-16:], o) for c, o in pairs]))
    assert any(len(c) > 16 for c, _ in pairs)
  got = np.asarray([float(resp[0]) for _, resp in rows])
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), (got, want)
  # is_greedy is the argmax: a continuation made of the model's own greedy tokens is greedy.
  ctx = list(vocab.encode("The capital of France is"))
  own = generate(lm.model, [ctx], max_new_tokens=3, eos_id=-1)[0]
  prefix = [0] if lm.family == "decllm" else []
  assert lm.score_tokens([(prefix + ctx, own)])[0][1]
  assert not lm.score_tokens([(prefix + ctx, own[:2] + [(own[2] + 1) % 8000 + 3])])[0][1]


def _causal_loglikelihood(model, ctx, cont):
  """log p(cont | ctx) from one DecLLM forward over ``(ctx + cont)[:-1]`` (no BOS added)."""
  import jax
  import jax.numpy as jnp
  seq = ctx + cont
  logits = model({"decoder_input_tokens": jnp.asarray([seq[:-1]], jnp.int32)})
  logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), -1), np.float64)[0]
  return float(sum(logp[i, seq[i + 1]] for i in range(len(ctx) - 1, len(seq) - 1)))


def test_rolling_scores_every_token_once(run):
  lm, results = run
  rows = per_request(results, "t5like_rolling")
  vocab = get_vocabulary("")
  for (text,), got in rows:
    tokens = list(vocab.encode(text))
    windows = lm.rolling_windows(text)
    assert [t for _, cont in windows for t in cont] == tokens  # Each token once, in order.
    if lm.family == "redllm":  # Decoder blocks of targets_length after inputs_length tokens.
      assert windows[0][0] == [1] and len(windows) == -(-len(tokens) // 16)
      for i, (ctx, cont) in enumerate(windows[1:], 1):
        assert ctx == tokens[max(0, 16 * i - 16):16 * i] and len(cont) <= 16
      want = sum(option_loglikelihoods(lm.model, windows))
    else:  # The harness's windows of 32 tokens, the first after the BOS.
      assert windows[0][0] == [0] and len(windows) == -(-len(tokens) // 32)
      assert all(len(c) + len(o) == 33 for c, o in windows[1:])
      want = sum(_causal_loglikelihood(lm.model, c, o) for c, o in windows)
    assert abs(float(got) - want) <= 1e-5 * abs(want)
  assert len(lm.rolling_windows(TEXTS[0])) > 1 and len(rows) == len(TEXTS)
  assert results["results"]["t5like_rolling"]["word_perplexity,none"] > 1


def test_generation_is_t5likes_greedy_cut_at_the_stop_sequence(run):
  lm, results = run
  rows = per_request(results, "t5like_gen")
  vocab = get_vocabulary("")
  prompts = [list(vocab.encode(d["prompt"])) for d in GEN_DOCS]
  want = [vocab.decode(o).split(" ")[0]
          for o in generate(lm.model, prompts, max_new_tokens=10, eos_id=1)]
  got = {args[0]: text for args, text in rows}
  assert [got[d["prompt"]] for d in GEN_DOCS] == want
  assert all(args[1]["until"] == [" "] and args[1]["max_gen_toks"] == 10 for args, _ in rows)


SCRIPT = """
import json, sys
sys.path.insert(0, "tests")
import jax
from t5like.evaluation import harness, harness_run
from harness_tasks import NAMES, per_request
out = {{"devices": jax.device_count()}}
for family, workdir in {workdirs!r}.items():
  lm = harness.T5LikeLM(workdir=workdir, batch_size="4")
  manager, _ = harness_run.load_tasks(NAMES, [{tasks!r}])
  res = harness_run.evaluate(lm, NAMES, manager, log_samples=True)
  out[family] = {{t: [r for _, r in per_request(res, t)] for t in NAMES}}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.timeout(1500)
def test_eight_devices_score_as_one(tmp_path, tasks_dir):
  workdirs = {f: make_checkpoint(str(tmp_path / f), f, seed=5) for f in ("decllm", "redllm")}
  code = SCRIPT.format(workdirs=workdirs, tasks=tasks_dir)
  got = {}
  for devices in (1, 8):
    proc = run_script(code, devices=devices, timeout=600)
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    got[devices] = json.loads(line[len("RESULT"):])
    assert got[devices].pop("devices") == devices
  for family in workdirs:
    one, eight = got[1][family], got[8][family]
    assert eight["t5like_gen"] == one["t5like_gen"]
    for task in ("t5like_mc", "t5like_rolling"):
      a = np.asarray([r[0] if isinstance(r, list) else r for r in one[task]], np.float64)
      b = np.asarray([r[0] if isinstance(r, list) else r for r in eight[task]], np.float64)
      assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max(), (task, a, b)
    assert [r[1] for r in eight["t5like_mc"]] == [r[1] for r in one["t5like_mc"]]


@pytest.mark.timeout(1200)  # Three task-registry scans (lm-eval's thousands of YAMLs).
def test_eval_py_writes_reports_and_names_a_task_without_data(tmp_path, tasks_dir, capsys):
  dec = make_checkpoint(str(tmp_path / "dec"), "decllm", seed=1)
  red = make_checkpoint(str(tmp_path / "red"), "redllm", seed=2)
  out = tmp_path / "report"
  eval_cli = load_script("eval.py")
  assert eval_cli.main(["--workdir", dec, "--workdir", red, "--harness", "t5like_mc,t5like_gen",
                        "--include_path", tasks_dir, "--limit", "2",
                        "--output_dir", str(out)]) == 0
  files = sorted(os.listdir(out))
  assert files == ["harness.png", "harness_workdir_2_step7.json", "harness_workdir_step7.json",
                   "report.md"]
  results = json.loads((out / "harness_workdir_step7.json").read_text())
  assert set(results["results"]) == {"t5like_mc", "t5like_gen"}
  assert results["t5like"]["family"] == "decllm"
  report = (out / "report.md").read_text()
  assert "| t5like_mc | acc,none |" in report and "workdir_2" in report
  # A task whose data file is missing: one error naming it; an unknown task likewise.
  broken = tmp_path / "broken"
  broken.mkdir()
  (broken / "gone.yaml").write_text((open(os.path.join(tasks_dir, "t5like_mc.yaml")).read()
                                     .replace("t5like_mc", "t5like_gone")
                                     .replace("mc.jsonl", "missing.jsonl")))
  (broken / "group.yaml").write_text("group: t5like_group\ntask:\n  - t5like_gone\n")
  capsys.readouterr()
  assert eval_cli.main(["--workdir", dec, "--harness", "t5like_group", "--include_path",
                        str(broken), "--output_dir", str(out)]) == 2
  err = capsys.readouterr().err  # A group: the member task whose data is missing.
  assert "harness task t5like_gone (of group t5like_group): its data could not be read" in err
  assert "data_files" in err and "Traceback" not in err and err.count("error:") == 1, err


PROCESS_SCRIPT = r"""
import json, sys
pid, nproc, address, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
workdirs, tasks = json.loads(sys.argv[5]), sys.argv[6]
import jax
if nproc > 1:
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=address, num_processes=nproc, process_id=pid)
from etils import epath
from t5like.evaluation import harness, harness_run

responses = []  # Every request's arguments and response, in the harness's order.
for kind in ("loglikelihood", "loglikelihood_rolling", "generate_until"):
  def recorded(self, requests, disable_tqdm=False, _serve=getattr(harness.T5LikeLM, kind)):
    out = _serve(self, requests, disable_tqdm)
    responses.extend([self.family, list(r.args), o] for r, o in zip(requests, out))
    return out
  setattr(harness.T5LikeLM, kind, recorded)

writes = []  # What this process writes under out_dir.
path_type = type(epath.Path(out_dir))
for name in ("write_text", "write_bytes", "mkdir", "open"):
  def watched(self, *args, _inner=getattr(path_type, name), _name=name, **kwargs):
    mode = (args[0] if args else kwargs.get("mode", "r")) if _name == "open" else "w"
    if str(self).startswith(out_dir) and any(c in mode for c in "wax+"):
      writes.append(str(self))
    return _inner(self, *args, **kwargs)
  setattr(path_type, name, watched)

runs = harness_run.run_harness(workdirs, ",".join(json.loads(sys.argv[7])), output_dir=out_dir,
                               include_path=[tasks], model_args={"batch_size": "4"})
print("RESULT" + json.dumps({
    "devices": jax.device_count(), "responses": responses, "writes": writes,
    "metrics": {n: r["results"]["results"] for n, r in runs.items()}}, default=str), flush=True)
"""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_processes(nproc: int, out_dir: str, workdirs: list[str], tasks_dir: str) -> list[dict]:
  address = f"127.0.0.1:{_free_port()}"
  args = [out_dir, json.dumps(workdirs), tasks_dir, json.dumps(NAMES)]
  procs = [subprocess.Popen([sys.executable, "-c", PROCESS_SCRIPT, str(pid), str(nproc), address,
                             *args], cwd=ROOT, env=subprocess_env(devices=1),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for pid in range(nproc)]
  results = []
  for p in procs:
    try:
      out, err = p.communicate(timeout=900)
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      pytest.fail("the harness hung across processes")
    assert p.returncode == 0, err[-4000:]
    results.append(json.loads(out.split("RESULT", 1)[1]))
  return results


@pytest.mark.timeout(2400)
def test_two_processes_serve_as_one_and_process_zero_writes(tmp_path, tasks_dir):
  """Two processes on localhost (one CPU device each, one mesh of two): every host gets every
  request in lock-step and takes the same decisions — the same responses, bit for bit, equal to
  one process's — and only process 0 writes the reports."""
  workdirs = [make_checkpoint(str(tmp_path / f), f, seed=5) for f in ("decllm", "redllm")]
  two = _run_processes(2, str(tmp_path / "two"), workdirs, tasks_dir)
  (one,) = _run_processes(1, str(tmp_path / "one"), workdirs, tasks_dir)
  assert [r["devices"] for r in two] == [2, 2] and one["devices"] == 1
  assert two[0]["responses"] == two[1]["responses"]  # The same decisions on both hosts.
  assert two[0]["metrics"] == two[1]["metrics"]
  got, want = two[0]["responses"], one["responses"]
  assert len(got) == len(want) == 2 * (8 + len(TEXTS) + len(GEN_DOCS))
  for (fam, args, resp), (fam1, args1, resp1) in zip(got, want):
    assert (fam, args) == (fam1, args1)
    if isinstance(resp, str):  # generate_until: the same text.
      assert resp == resp1, (args, resp, resp1)
    else:  # (log-likelihood, is_greedy), or a rolling log-likelihood.
      a, b = (resp, resp1) if isinstance(resp, list) else ([resp], [resp1])
      assert abs(a[0] - b[0]) <= 1e-5 * abs(b[0]), (args, a, b)
      assert a[1:] == b[1:]
  # Written once, by process 0; process 1 wrote nothing there.
  assert two[1]["writes"] == [] and two[0]["writes"]
  assert sorted(os.listdir(tmp_path / "two")) == sorted(os.listdir(tmp_path / "one")) == [
      "harness.png", "harness_workdir_2_step7.json", "harness_workdir_step7.json", "report.md"]


def test_paper_group_is_the_documented_thirteen_harness_tasks():
  from lm_eval.tasks import TaskManager
  manager = TaskManager(include_path=harness_run.include_paths())
  entry = manager.task_index[harness_run.PAPER_GROUP]
  assert entry.kind.name == "GROUP" and harness_run.PAPER_GROUP in manager.all_groups
  members = entry.cfg["task"]
  assert len(members) == len(set(members)) == 13
  # Every member is lm-eval's own task or group (its prompts and metrics), none of t5like's.
  import lm_eval.tasks
  own = os.path.dirname(lm_eval.tasks.__file__)
  assert all(str(manager.task_index[m].yaml_path).startswith(own + os.sep) for m in members)
  # docs/evaluation.md lists the same names, in the same order.
  with open(os.path.join(ROOT, "docs", "evaluation.md"), encoding="utf-8") as f:
    doc = f.read()
  table = doc.split("<!-- paper_downstream -->")[1]
  assert re.findall(r"^\| `(\w+)` \|", table, re.M) == members


def test_unknown_task_is_one_error_naming_it_and_the_fix(tmp_path, tasks_dir, capsys):
  dec = make_checkpoint(str(tmp_path / "dec"), "decllm", seed=1)
  out = tmp_path / "report"
  eval_cli = load_script("eval.py")
  capsys.readouterr()
  assert eval_cli.main(["--workdir", dec, "--harness", "t5like_mc,arc_easyy", "--include_path",
                        tasks_dir, "--output_dir", str(out)]) == 2
  err = capsys.readouterr().err
  assert "Traceback" not in err and err.count("error:") == 1, err
  assert "unknown harness task(s) arc_easyy" in err and "did you mean arc_easy" in err
  assert "harness_cli ls tasks" in err and "--include_path" in err and "t5like_mc" not in err
  assert not out.exists()  # Nothing ran, nothing was written.
  # lm-eval's own command line (harness_cli): the same one error, exit status 2.
  proc = subprocess.run(
      [sys.executable, "-m", "t5like.evaluation.harness_cli", "--model", "t5like",
       "--model_args", f"workdir={dec}", "--tasks", "arc_easyy", "--include_path", tasks_dir],
      cwd=ROOT, env=subprocess_env(devices=1), capture_output=True, text=True, timeout=900)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr and "error: unknown harness task(s) arc_easyy" in \
      proc.stderr and "did you mean arc_easy" in proc.stderr, proc.stderr[-3000:]
  assert f"or in {tasks_dir}" in proc.stderr
