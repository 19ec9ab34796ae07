"""lm-evaluation-harness on exported models: its log-likelihoods on a local multiple-choice task
(task YAML over a jsonl, no hub download) equal t5like's own rank-classification scores
(``t5like.evaluation.scoring.option_loglikelihoods``) for the same prompts, both families."""
from __future__ import annotations

import json

import numpy as np
import pytest

from hf_helpers import make_export
from t5like.data.vocab import get_vocabulary
from t5like.training.restore import restore_model
from t5like.evaluation.scoring import option_loglikelihoods

BATCH = 4
DOCS = [
    {"question": "The capital of France is", "choices": ["Paris", "Rome", "a small dog"],
     "answer": 0},
    {"question": "Water freezes at zero degrees", "choices": ["Celsius", "Fahrenheit"],
     "answer": 0},
    {"question": "Ünïcödé and 中文: which one is a colour?", "choices": ["blue", "seven", "run"],
     "answer": 0},
]
TASK = """task: t5like_local_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


def lm_eval_loglikelihoods(hf_dir: str, tasks_dir, backend: str):
  """[(context, continuation, log-likelihood)] of every request lm-eval made."""
  import lm_eval
  from lm_eval.tasks import TaskManager
  args = f"pretrained={hf_dir},trust_remote_code=True,dtype=float32"
  if backend == "seq2seq":
    args += ",backend=seq2seq"
  out = lm_eval.simple_evaluate(model="hf", model_args=args, tasks=["t5like_local_mc"],
                                task_manager=TaskManager(include_path=str(tasks_dir)),
                                batch_size=BATCH, device="cpu", log_samples=True)
  rows = []
  for sample in out["samples"]["t5like_local_mc"]:
    for (ctx, cont), resp in zip(sample["arguments"], sample["resps"]):
      rows.append((ctx, cont, float(resp[0][0])))
  return rows


def t5like_pairs(family: str, rows):
  """The token ids lm-eval scores for each (context, continuation): as its HF model wrapper
  splits them (trailing spaces of the context go to the continuation; a causal model's
  continuation is the whole text's tokens after the context's)."""
  vocab = get_vocabulary("")
  pairs = []
  for ctx, cont, _ in rows:
    n = len(ctx) - len(ctx.rstrip())
    ctx, cont = ctx[:len(ctx) - n], ctx[len(ctx) - n:] + cont
    c = vocab.encode(ctx)
    o = vocab.encode(ctx + cont)[len(c):] if family == "decllm" else vocab.encode(cont)
    pairs.append((c, o))
  return pairs


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_lm_eval_scores_equal_t5like_rank_classification(family, tmp_path):
  workdir, hf_dir, _, _ = make_export(str(tmp_path / "model"), family, seed=4)
  data = tmp_path / "tasks" / "docs.jsonl"
  data.parent.mkdir()
  data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
  (tmp_path / "tasks" / "t5like_local_mc.yaml").write_text(TASK.format(data=data))
  rows = lm_eval_loglikelihoods(hf_dir, tmp_path / "tasks",
                                "causal" if family == "decllm" else "seq2seq")
  assert len(rows) == sum(len(d["choices"]) for d in DOCS)
  model, _, _ = restore_model(workdir)
  want = np.asarray(option_loglikelihoods(model, t5like_pairs(family, rows)))
  got = np.asarray([r[2] for r in rows])
  assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), (got, want)
