"""User paths may be URIs. Without a bucket: an unreachable ``gs://`` workdir fails at once with
the path (no local ``gs:`` directory appears), and every epath-based writer and reader of
the project (train.log, metrics.jsonl, config lookups, step discovery, eval reports) is run on
``gs://`` paths with etils' own epath mock redirecting them to a local directory. Orbax's
array files go through TensorStore's GCS driver, which this test does not reach (docs/checkpoints.md)."""
from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from etils import epath
from etils.epath import testing as epath_testing

from t5like import paths
from t5like.config import ConfigError
from t5like.training import run, step_dirs
from t5like.training.data import SyntheticData
from train_helpers import tiny_config


def test_uris_are_never_made_local():
  assert paths.resolve("gs://b/run") == "gs://b/run"
  assert paths.join("gs://b/run", "checkpoints", "8") == "gs://b/run/checkpoints/8"
  assert paths.parent("gs://b/run/checkpoints") == "gs://b/run"
  assert paths.resolve("runs/x") == os.path.join(os.getcwd(), "runs", "x")


def test_unreachable_bucket_is_a_clear_error_and_creates_nothing_locally(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  cfg = tiny_config("decllm", steps=2)
  t0 = time.time()
  with pytest.raises(ConfigError, match="gs://t5like-no-such-bucket-x/run"):
    run(cfg, "gs://t5like-no-such-bucket-x/run", data=SyntheticData(cfg))
  assert time.time() - t0 < 120
  assert not os.path.exists(tmp_path / "gs:") and os.listdir(tmp_path) == []


@pytest.fixture
def fake_bucket(tmp_path, monkeypatch):
  """gs://bucket/... -> <tmp>/bucket/... for every epath operation (etils' epath mock; epath
  would otherwise bypass its mock for gs:// whenever TensorFlow is installed)."""
  from etils.epath import gpath
  monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)
  root = tmp_path / "gcs"

  def local(p):
    p = os.fspath(p)
    return os.fspath(root / p[len("gs://"):]) if p.startswith("gs://") else p

  def redirect(fn, path, *args, **kwargs):
    return fn(local(path), *args, **kwargs)

  def redirect2(fn, src, dst, *args, **kwargs):
    return fn(local(src), local(dst), *args, **kwargs)

  def glob(fn, path):
    return [p.replace(os.fspath(root) + "/", "gs://") for p in fn(local(path))]

  one = {k: redirect for k in ("exists", "isdir", "listdir", "makedirs", "mkdir", "open",
                               "remove", "rmtree", "stat", "walk")}
  with epath_testing.mock_epath(**one, copy=redirect2, rename=redirect2, replace=redirect2,
                                glob=glob):
    yield root


def test_logs_metrics_and_config_lookups_on_a_bucket(fake_bucket, tmp_path):
  from t5like.training.metrics import MetricsWriter
  epath.Path("gs://bucket/run").mkdir(parents=True)  # What the trainer does first.
  w = MetricsWriter("gs://bucket/run", total_steps=2, start_step=0, progress_bar=False)
  w.write(1, {"loss": 2.5})
  w.close()
  again = MetricsWriter("gs://bucket/run", total_steps=2, start_step=1, progress_bar=False)
  again.write(2, {"loss": 2.0})  # A resumed run appends to the same file.
  again.close()
  lines = (fake_bucket / "bucket" / "run" / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(x)["step"] for x in lines] == [1, 2]
  # TensorBoard event files go through epath too (one per writer), with the logged scalars.
  events = sorted((fake_bucket / "bucket" / "run" / "tensorboard").glob("events.out.tfevents.*"))
  assert len(events) == 2 and all(b"loss" in e.read_bytes() for e in events)

  train_log = fake_bucket / "bucket" / "run" / "train.log"
  log = paths.AppendFile("gs://bucket/run/train.log", every_s=3600)
  log.write("one\n")
  log.flush()  # The first line goes out at once (a run's log shows up as it starts) ...
  assert train_log.read_text() == "one\n"
  log.write("two\n")
  log.flush()  # ... the next ones are rate-limited on a URI ...
  assert train_log.read_text() == "one\n"
  log.close()  # ... and everything is written at close.
  assert train_log.read_text() == "one\ntwo\n"
  quiet = paths.AppendFile("gs://bucket/run/quiet.log", every_s=2.0)
  quiet.write("first\n")
  quiet.flush()
  quiet.write("last line before a long quiet spell\n")
  quiet.flush()  # Pending: the timer writes it even though nothing else is logged.
  deadline = time.monotonic() + 120
  while "quiet spell" not in (fake_bucket / "bucket" / "run" / "quiet.log").read_text():
    assert time.monotonic() < deadline, "a pending line was never written out"
    time.sleep(0.1)
  quiet.close()

  # A real checkpoint's metadata under gs://: step discovery, config and integrity checks.
  cfg = tiny_config("decllm", steps=2)
  cfg.checkpoint.every = 0
  local_run = tmp_path / "local"
  run(cfg, str(local_run), data=SyntheticData(cfg))
  shutil.copytree(local_run / "checkpoints", fake_bucket / "bucket" / "run" / "checkpoints")
  step_dir = step_dirs.resolve_step_dir("gs://bucket/run")
  assert step_dir == "gs://bucket/run/checkpoints/2"
  step_dirs.check_metadata(step_dir)
  assert step_dirs.read_step_config(step_dir)["model"]["family"] == "decllm"
  from t5like.training.restore import find_step_dir
  assert find_step_dir("gs://bucket/run", step=2) == step_dir
  (fake_bucket / "bucket" / "run" / "checkpoints" / "2" / "config" / "metadata").write_text("{")
  with pytest.raises(json.JSONDecodeError, match="config/metadata is not valid JSON"):
    step_dirs.check_metadata(step_dir)
  assert epath.Path("gs://bucket/run/checkpoints").is_dir()
