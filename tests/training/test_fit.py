"""``train.fit`` on CPU with a small memory budget the trainer is told to respect
(``train.fit_budget_gib``): ``auto`` takes the first candidate remat/microbatch setting that leaves
20 % free and trains with it, ``check`` fails naming that setting, ``off`` trusts the config."""
from __future__ import annotations

import copy

import pytest

from t5like.config import ConfigError
from t5like.training import aot, checkpointing, fit, loop
from t5like.training.data import SyntheticData
from train_helpers import tiny_config

BUDGET_GIB = 9 * 2**20 / 2**30  # 9 MiB a device: the configured step needs about twice that.


def _config(mode: str):
  cfg = tiny_config("decllm", steps=2, batch_size=32, length=64)
  cfg.model.remat_policy, cfg.train.microbatches = "none", 1
  cfg.train.fit, cfg.train.fit_budget_gib = mode, BUDGET_GIB
  cfg.checkpoint.every = 0
  return cfg


@pytest.fixture(scope="module")
def decision():
  cfg = _config("auto")
  chosen, decided = fit.choose(cfg)
  return cfg, chosen, decided


def test_auto_takes_the_first_candidate_that_fits(decision):
  cfg, chosen, d = decision
  budget = BUDGET_GIB * aot.GiB
  assert d["configured_peak"] > (1 - aot.HEADROOM) * budget and not d["fits"]
  setting = (chosen.model.remat_policy, chosen.train.microbatches)
  assert setting != ("none", 1) and setting in fit.CANDIDATES
  # Every candidate before it was compiled and rejected, in the table's order.
  earlier = fit.CANDIDATES[:fit.CANDIDATES.index(setting)]
  assert [r.split()[0] for r in d["rejected"]] == [f"{r}/mb{m}" for r, m in earlier]
  report = aot.compile_report(chosen, eval_step=False, hbm_bytes=budget)
  assert report["fits"] and report["train"]["peak"] <= (1 - aot.HEADROOM) * budget
  assert cfg.train.microbatches == 1  # The caller's config is left alone.


@pytest.mark.slow  # Trains (one more compile): the choice itself is checked above in make test.
def test_the_trainer_runs_with_the_setting_auto_took(decision, tmp_path, capfd):
  _, chosen, d = decision
  cfg = _config("auto")
  result = loop.run(cfg, str(tmp_path), data=SyntheticData(cfg))
  assert result["step"] == 2
  logged = capfd.readouterr().err  # The run's log: the choice and what it rejected.
  assert f"taking {d['setting']}" in logged
  assert all(r.split()[0] in logged.split("rejected: ")[1] for r in d["rejected"])
  saved = checkpointing.Checkpointer(str(tmp_path / "checkpoints"), cfg.checkpoint)
  try:
    trained = saved.saved_config(2)
  finally:
    saved.close()
  assert trained["model"]["remat_policy"] == chosen.model.remat_policy
  assert trained["train"]["microbatches"] == chosen.train.microbatches


@pytest.mark.slow
def test_check_names_the_setting_and_off_trusts_the_config(decision, tmp_path):
  _, _, d = decision
  with pytest.raises(ConfigError, match="pass " + d["setting"].replace("-", r"\-")):
    loop.run(_config("check"), str(tmp_path / "check"), data=SyntheticData(_config("check")))
  cfg = _config("off")  # Host memory is plenty: the configured step runs.
  assert loop.run(cfg, str(tmp_path / "off"), data=SyntheticData(cfg))["step"] == 2
  with pytest.raises(ConfigError, match="train.fit"):
    copy.deepcopy(cfg).train.__class__(fit="sometimes").validate()
