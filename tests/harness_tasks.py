"""Local lm-evaluation-harness tasks (YAML over jsonl, no hub download) and tiny checkpoints for
tests/harness (lm-eval core) and tests/hf (the export route)."""
from __future__ import annotations

import json
import os

from hf_helpers import random_params, tiny_config
from t5like.tools import import_hf

MC_DOCS = [
    {"question": "The capital of France is", "choices": ["Paris", "Rome", "a small dog"],
     "answer": 0},
    {"question": "Water freezes at zero degrees", "choices": ["Celsius", "Fahrenheit"],
     "answer": 0},
    {"question": "Ünïcödé and 中文: which one is a colour?", "choices": ["blue", "seven", "run"],
     "answer": 0},
]
TEXTS = [  # Rolling log-likelihood documents: several windows of 16 tokens each.
    "The history of the city goes back to a small settlement on the river, where traders met "
    "every spring to exchange salt, wool and news from the valleys beyond the mountains.",
    "Once upon a time there lived a king who had three daughters.",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25",
]
GEN_DOCS = [{"prompt": "Q: What is two plus two?\nA:", "answer": "four"},
            {"prompt": "The quick brown fox", "answer": "jumps"},
            {"prompt": "Once upon a time, in a land far away", "answer": "there"}]
TASKS = {
    "t5like_mc": """task: t5like_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {dir}/mc.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
  - metric: acc_norm
""",
    "t5like_rolling": """task: t5like_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: {dir}/rolling.jsonl
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
""",
    "t5like_gen": """task: t5like_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {dir}/gen.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["{stop}"]
  max_gen_toks: 10
  do_sample: false
metric_list:
  - metric: exact_match
""",
}
NAMES = list(TASKS)


def write_tasks(directory: str, stop: str = " ") -> str:
  """The three tasks' YAML and data under ``directory`` (their ``--include_path``)."""
  os.makedirs(directory, exist_ok=True)
  for name, docs in (("mc", MC_DOCS), ("rolling", [{"text": t} for t in TEXTS]),
                     ("gen", GEN_DOCS)):
    with open(os.path.join(directory, f"{name}.jsonl"), "w", encoding="utf-8") as f:
      f.write("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
  for name, text in TASKS.items():
    with open(os.path.join(directory, f"{name}.yaml"), "w", encoding="utf-8") as f:
      f.write(text.format(dir=directory, stop=stop))
  return directory


def make_checkpoint(tmp: str, family: str, *, seed: int = 0, **overrides) -> str:
  """A tiny random checkpoint (float32; lengths 16 + 16, DecLLM 32) in ``tmp``; its workdir."""
  cfg = tiny_config(family, **overrides)
  cfg.data.sequence_length, cfg.data.inputs_length, cfg.data.targets_length = 32, 16, 16
  workdir = os.path.join(tmp, "workdir")
  import_hf.write_checkpoint(cfg.validate(), random_params(cfg, seed), workdir, step=7)
  return workdir


def per_request(results, task: str):
  """[(arguments, response)] of every request of ``task`` in a ``log_samples`` run."""
  rows = []
  for sample in results["samples"][task]:
    for args, resp in zip(sample["arguments"], sample["resps"]):
      rows.append((tuple(args), resp[0]))
  return rows
