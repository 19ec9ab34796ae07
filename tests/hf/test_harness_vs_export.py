"""The ``t5like`` harness model equals the export route: on the same tiny checkpoints and local
tasks (multiple choice, rolling log-likelihood, generation with a stop sequence), its per-request
log-likelihoods, greedy flags and generations equal the exported PyTorch model's under
``lm_eval --model hf`` (float32), DecLLM and RedLLM (``rolling=harness``: the harness's own
windows, which the HF model uses)."""
from __future__ import annotations

import numpy as np
import pytest

from harness_tasks import NAMES, make_checkpoint, per_request, write_tasks
from t5like.tools import export_hf

MAX_LENGTH = 24  # One length for both routes (the HF model reads none from the config).


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_t5like_model_equals_the_exported_model_under_lm_eval(family, tmp_path):
  import lm_eval
  from lm_eval.tasks import TaskManager
  from t5like.evaluation import harness
  workdir = make_checkpoint(str(tmp_path / "model"), family, seed=6)
  hf_dir = str(tmp_path / "hf")
  export_hf.export_checkpoint(workdir, hf_dir)
  tasks = write_tasks(str(tmp_path / "tasks"))
  common = dict(tasks=NAMES, log_samples=True, batch_size=4,
                task_manager=TaskManager(include_path=tasks))
  args = f"pretrained={hf_dir},trust_remote_code=True,dtype=float32,max_length={MAX_LENGTH}"
  if family == "redllm":
    args += ",backend=seq2seq"
  want = lm_eval.simple_evaluate(model="hf", model_args=args, device="cpu", **common)
  lm = harness.T5LikeLM(workdir=workdir, max_length=MAX_LENGTH, rolling="harness",
                        batch_size=4)
  got = lm_eval.simple_evaluate(model=lm, **common)
  for task in NAMES:
    a, b = per_request(want, task), per_request(got, task)
    assert [x for x, _ in a] == [x for x, _ in b] and a, task  # The same requests.
    if task == "t5like_gen":
      assert [r for _, r in b] == [r for _, r in a]
      assert any(r for _, r in a)  # Not all empty: the stop sequence cuts real text.
      continue
    ll_a = np.asarray([float(r[0]) if isinstance(r, (list, tuple)) else float(r) for _, r in a])
    ll_b = np.asarray([float(r[0]) if isinstance(r, (list, tuple)) else float(r) for _, r in b])
    assert np.abs(ll_a - ll_b).max() <= 1e-4 * np.abs(ll_a).max(), (task, ll_a, ll_b)
    if task == "t5like_mc":
      assert [bool(r[1]) for _, r in a] == [bool(r[1]) for _, r in b]
