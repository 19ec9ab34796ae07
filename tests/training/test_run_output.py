"""What a run prints and logs, in-process: the imports milestone per run, seqio's packing warning
once, per-step lines in train.log but not through the progress bar, metrics.jsonl rows past a
restored step dropped, one metric name in metrics.jsonl and TensorBoard."""
from __future__ import annotations

import json
import logging
import time

from t5like.training import loop, metrics, startup


def test_the_imports_milestone_of_a_later_run_in_the_process_starts_at_that_run():
  startup.run_start_time()  # The process's first run (here or in an earlier test): its start.
  before = time.time()
  assert before <= startup.run_start_time() <= time.time()


def test_the_packing_warning_once_and_per_step_lines_only_in_train_log(tmp_path, capsys, caplog):
  from absl import logging as absl_logging
  handler = loop._setup_logging(str(tmp_path))
  try:
    for _ in range(3):
      absl_logging.warning("Features not in `features_length` will be removed during packing: "
                           "%s", {"x"})
    loop.log.info("step 7: loss=1.5", extra={"file_only": True})
    loop.log.info("a console line")
  finally:
    loop.log.removeHandler(handler)
    handler.close()
    handler.stream.close()
  err = capsys.readouterr().err
  packing = [r for r in caplog.records if "will be removed during packing" in r.getMessage()]
  assert len(packing) <= 1  # Once per process (none if an earlier test's run showed it).
  absl_logging.warning("another absl warning")
  assert any(r.getMessage() == "another absl warning" for r in caplog.records)
  assert "a console line" in err and "step 7" not in err
  text = (tmp_path / "train.log").read_text()
  assert "step 7: loss=1.5" in text and "a console line" in text


def test_rows_past_the_restored_step_are_dropped(tmp_path):
  path = tmp_path / "metrics.jsonl"
  rows = [{"step": s, "loss": float(s)} for s in (1, 2, 3, 4, 3, 4, 5)]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]) + '{"step": 5, "lo')
  assert metrics.drop_rows_after(str(path), 2) == 3  # Steps 3, 4 and the torn line.
  assert [json.loads(ln)["step"] for ln in path.read_text().splitlines()] == [1, 2]


def test_one_metric_name_in_metrics_jsonl_and_tensorboard():
  for key in ("loss", "eval_loss", "eval/book/loss", "tokens_per_sec", "mfu"):
    assert metrics._tb_name(key) == key
  assert logging.getLogger("absl").filters.count(loop._PACKING_WARNING) <= 1
