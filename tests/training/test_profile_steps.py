"""``train.profile_steps``: a window of steps traced by ``jax.profiler`` under the workdir."""
from __future__ import annotations

import pytest
from etils import epath

from t5like.config import ConfigError
from t5like.training import loop
from t5like.training.data import SyntheticData
from train_helpers import tiny_config


def test_a_one_step_window_leaves_a_trace_under_the_workdir(tmp_path):
  cfg = tiny_config(steps=3, batch_size=2, length=16)
  cfg.train.profile_steps = "1:2"
  cfg.checkpoint.save_at_end = False
  cfg.validate()
  loop.run(cfg, str(tmp_path), data=SyntheticData(cfg))
  runs = list((epath.Path(tmp_path) / "profile" / "plugins" / "profile").iterdir())
  assert len(runs) == 1, runs  # One window, one trace.
  names = [p.name for p in runs[0].iterdir()]
  assert any(n.endswith(".xplane.pb") for n in names), names  # TensorBoard's profile tab.
  assert "perfetto_trace.json.gz" in names, names  # ui.perfetto.dev.
  assert (runs[0] / [n for n in names if n.endswith(".xplane.pb")][0]).stat().length > 0


def test_profiling_is_off_by_default(tmp_path):
  cfg = tiny_config(steps=1, batch_size=2, length=16)
  assert cfg.train.profile_steps == "" and cfg.train.profile_window() is None


@pytest.mark.parametrize("window, match", [("3", "not START:STOP"), ("a:b", "not START:STOP"),
                                           ("5:5", "START < STOP"), ("-1:2", "0 <= START")])
def test_a_bad_window_is_a_config_error(window, match):
  cfg = tiny_config(steps=1)
  cfg.train.profile_steps = window
  with pytest.raises(ConfigError, match=match):
    cfg.validate()
