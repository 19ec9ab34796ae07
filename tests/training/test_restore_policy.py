"""Restore policy, as a fault-injection matrix on a real run's checkpoints (steps 4 and 8).

For each kind of file in the newest step directory, truncated / zeroed / deleted, the restart
either restores step 8 *exactly* (the file was not needed) or sets step 8 aside on the same
storage and restores step 4 exactly, with one message — never garbage, never step 0. When no
checkpoint is good, or storage errors persist, it stops with a clear error and moves nothing;
a transient storage error is retried and sets nothing aside.
"""
from __future__ import annotations

import gc
import logging
import shutil

import jax
import numpy as np
import pytest

from t5like import partitioning
from t5like.training import checkpointing, run, state as state_lib
from t5like.training.data import SyntheticData
from train_helpers import tiny_config

# A damaged file fails Orbax's reads inside its async loop; the coroutines dropped then (and the
# closed loop they call back into) are reported as unraisable, with a RuntimeWarning, whenever
# they are collected.
pytestmark = [pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
              pytest.mark.filterwarnings("ignore:coroutine '_read_array_index_and_device_put' "
                                         "was never awaited:RuntimeWarning")]


@pytest.fixture(scope="module", autouse=True)
def _collect_dropped_reads():
  """Collects them before the module ends, under its filter: left for pytest's collection at the
  end of the session (or the next module's tests), each printed a traceback there."""
  yield
  gc.collect()


FILES = {  # kind -> path inside checkpoints/8 (a glob picks the largest match)
    "array data": "state/ocdbt.process_0/d/*",
    "OCDBT manifest": "state/ocdbt.process_0/manifest.ocdbt",
    "root OCDBT manifest": "state/manifest.ocdbt",
    "_METADATA": "state/_METADATA",
    "_sharding": "state/_sharding",
    "array metadata": "state/array_metadatas/process_0",
    "_CHECKPOINT_METADATA": "_CHECKPOINT_METADATA",
    "config/metadata": "config/metadata",
    "data iterator": "data/process_0/synthetic_iterator.json",
    "commit marker": "commit_success.txt",
}
DAMAGE = ("truncated", "zeroed", "deleted")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  cfg = tiny_config("decllm", steps=8)
  cfg.checkpoint.every, cfg.checkpoint.async_save = 4, False
  workdir = tmp_path_factory.mktemp("trained")
  run(cfg, str(workdir), data=SyntheticData(cfg))
  setup = state_lib.build_setup(cfg, partitioning.make_mesh(cfg.mesh))
  pristine = {}
  ckpt = checkpointing.Checkpointer(str(workdir / "checkpoints"), cfg.checkpoint)
  for step in (4, 8):
    restored = ckpt.manager.restore(step, args=checkpointing.ocp.args.Composite(
        state=checkpointing.ocp.args.StandardRestore(
            checkpointing.saved_tree(setup.abstract_state))))["state"]
    state = checkpointing.from_saved(restored, setup.abstract_state)
    pristine[step] = [np.asarray(x) for x in jax.tree.leaves(state)]
  ckpt.close()
  return cfg, workdir, setup, pristine


def _restore(cfg, setup, workdir, **kw):
  ckpt = checkpointing.Checkpointer(str(workdir / "checkpoints"), cfg.checkpoint,
                                    backoff_s=0.01, **kw)
  try:
    it = SyntheticData(cfg).train(cfg.train.batch_size, 0, 1)
    return ckpt.restore(setup.abstract_state, it), ckpt
  finally:
    ckpt.close()


def _damage(path, how):
  if how == "deleted":
    path.unlink()
  else:
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:size // 2] if how == "truncated" else b"\0" * size)


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("kind", list(FILES))
def test_fault_matrix(trained, tmp_path, caplog, kind, how):
  cfg, source, setup, pristine = trained
  workdir = tmp_path / "run"
  shutil.copytree(source, workdir)
  matches = sorted((workdir / "checkpoints" / "8").glob(FILES[kind]),
                   key=lambda p: p.stat().st_size)
  assert matches, f"{FILES[kind]} not found in the checkpoint (Orbax layout changed?)"
  _damage(matches[-1], how)
  with caplog.at_level(logging.WARNING, logger="t5like.training"):
    restored, _ = _restore(cfg, setup, workdir)
  got = [np.asarray(x) for x in jax.tree.leaves(restored.state)]
  for a, b in zip(got, pristine[restored.step]):
    np.testing.assert_array_equal(a, b)  # Exactly the saved state: never garbage.
  aside = list((workdir / "corrupt_checkpoints").glob("8-*"))
  if restored.step == 8:
    assert not aside, "an intact checkpoint must not be set aside"
  else:
    assert restored.step == 4 and len(aside) == 1
    assert not (workdir / "checkpoints" / "8").exists()
    msgs = [r.getMessage() for r in caplog.records]
    assert any("checkpoints/8 cannot be restored" in m for m in msgs)
    assert any("previous good checkpoint (step 4)" in m for m in msgs)


def test_payload_damage_is_detected(trained, tmp_path):
  """The files that hold the numbers are never silently accepted when damaged."""
  cfg, source, setup, _ = trained
  for kind in ("array data", "config/metadata"):
    workdir = tmp_path / kind.replace("/", "_").replace(" ", "_")
    shutil.copytree(source, workdir)
    path = max((workdir / "checkpoints" / "8").glob(FILES[kind]), key=lambda p: p.stat().st_size)
    _damage(path, "truncated")
    restored, _ = _restore(cfg, setup, workdir)
    assert restored.step == 4, kind


def test_no_good_checkpoint_stops_and_moves_nothing(trained, tmp_path):
  cfg, source, setup, _ = trained
  workdir = tmp_path / "run"
  shutil.copytree(source, workdir)
  for step in (4, 8):
    _damage(workdir / "checkpoints" / str(step) / "config" / "metadata", "truncated")
  with pytest.raises(checkpointing.RestoreError, match="none of the 2 checkpoints") as e:
    _restore(cfg, setup, workdir)
  assert "refusing to start from step 0" in str(e.value)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == [
      "4", "8"]
  assert not (workdir / "corrupt_checkpoints").exists()


def test_transient_errors_are_retried_and_set_nothing_aside(trained, tmp_path, monkeypatch,
                                                           caplog):
  cfg, source, setup, pristine = trained
  workdir = tmp_path / "run"
  shutil.copytree(source, workdir)
  real = checkpointing.ocp.CheckpointManager.restore
  failures = {"left": 2}

  def flaky(self, step, *a, **kw):
    if failures["left"] > 0:
      failures["left"] -= 1
      raise TimeoutError("GCS read timed out (injected)")
    return real(self, step, *a, **kw)

  monkeypatch.setattr(checkpointing.ocp.CheckpointManager, "restore", flaky)
  with caplog.at_level(logging.WARNING, logger="t5like.training"):
    restored, _ = _restore(cfg, setup, workdir, retries=3)
  assert restored.step == 8 and failures["left"] == 0
  assert sum("retrying" in r.getMessage() for r in caplog.records) == 2
  assert not (workdir / "corrupt_checkpoints").exists()

  failures["left"] = 100  # Storage down for good: a clear error, nothing moved, no step 0.
  with pytest.raises(checkpointing.RestoreError, match="storage error persisted after 3"):
    _restore(cfg, setup, workdir, retries=2)
  assert (workdir / "checkpoints" / "8").exists()
  assert not (workdir / "corrupt_checkpoints").exists()


def test_out_of_memory_is_not_corruption():
  oom = ValueError("RESOURCE_EXHAUSTED: Out of memory allocating 11902311768920 bytes")
  assert checkpointing.classify(oom) == "fatal"
  assert checkpointing.classify(TimeoutError("x")) == "transient"
  assert checkpointing.classify(ValueError("DATA_LOSS: Error reading chunk")) == "corrupt"


def _orbax_read_error(uuid: str, path: str) -> Exception:
  """The shape of Orbax's error for a truncated array file: a TensorStore spec dump (with the
  OCDBT uuid and paths) wrapped around TensorStore's own status."""
  cause = ValueError(f'OUT_OF_RANGE: Error reading "params.wo/0.0" in OCDBT database at local '
                     f'file "{path}": Requested byte range [60767, 68377) is not valid')
  outer = Exception("Encountered error while reading array index: (slice(0, 2, 1),). See full "
                    "TensorStore details: <bound method spec of TensorStore({'config': "
                    f"{{'uuid': '{uuid}'}}, 'path': '{path}'}})>.")
  outer.__cause__ = cause
  return outer


@pytest.mark.parametrize("uuid,path", [
    ("9d7d7255a7625b7429cb3d32c7373857", "/run/checkpoints/12/state/"),  # "429" in the uuid.
    ("0123456789abcdef0123456789abcdef", "/run/checkpoints/503/state/"),  # Step 503.
    ("0123456789abcdef0123456789abcdef", "/runs/timed out/checkpoints/8/state/"),
])
def test_numbers_and_words_in_uuids_and_paths_do_not_make_a_damaged_file_transient(uuid, path):
  assert checkpointing.classify(_orbax_read_error(uuid, path)) == "corrupt"


@pytest.mark.parametrize("message", [
    "Error executing an HTTP request: HTTP response code 503 with body 'Backend Error'",
    "GET https://storage.googleapis.com/b/o: status: 429",
    "429 Too Many Requests",
])
def test_http_retry_codes_are_transient(message):
  assert checkpointing.classify(RuntimeError(message)) == "transient"


def test_train_py_says_so_in_one_error_block(trained, tmp_path, monkeypatch, capsys):
  """The same damaged workdir through train.py: the RestoreError's message, no traceback."""
  import t5like.training
  from cli_scripts import load_script
  _, source, _, _ = trained
  workdir = tmp_path / "run"
  shutil.copytree(source, workdir)
  for step in (4, 8):
    _damage(workdir / "checkpoints" / str(step) / "config" / "metadata", "truncated")
  config = tmp_path / "tiny.py"
  config.write_text("from train_helpers import tiny_config\n\n\ndef get_config():\n"
                    "  return tiny_config('decllm', steps=8)\n")
  real_run = t5like.training.run
  monkeypatch.setattr(t5like.training, "run",
                      lambda cfg, workdir: real_run(cfg, workdir, data=SyntheticData(cfg)))
  assert load_script("train.py").main(["--config", str(config), "--workdir", str(workdir)]) == 2
  err = capsys.readouterr().err  # The run's log lines, then the error block.
  assert "\nerror: none of the 2 checkpoints" in "\n" + err and "Traceback" not in err
  assert "refusing to start from step 0" in err
