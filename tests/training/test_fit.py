"""``train.fit`` on CPU with a small memory budget the trainer is told to respect
(``train.fit_budget_gib``): ``auto`` takes the first candidate remat/microbatch setting that leaves
20 % free and trains with it, ``check`` fails naming that setting, ``off`` trusts the config. On a
TPU the candidates go in order of predicted step time (checked with a chip's figures on fake
devices)."""
from __future__ import annotations

import copy
import json

import pytest

from t5like.config import ConfigError
from t5like.training import aot, checkpointing, fit, loop
from t5like.training.data import SyntheticData
from train_helpers import run_script, tiny_config

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


def test_tpu_device_kinds_map_to_their_chips():
  """A real run's devices give the search its chip's figures by ``device_kind``."""
  class Device:  # pylint: disable=too-few-public-methods
    def __init__(self, platform, kind):
      self.platform, self.device_kind = platform, kind
  kinds = {"TPU v5 lite": "v5e", "TPU v5": "v5p", "TPU v5p": "v5p", "TPU v6 lite": "v6e",
           "TPU v4": "v4"}
  assert {k: fit.chip_of(Device("tpu", k)).name for k in kinds} == kinds
  assert fit.chip_of(Device("gpu", "NVIDIA H200")) is None
  assert fit.chip_of(Device("tpu", "TPU v99")) is None


ORDER = """
import json
from t5like import partitioning
from t5like.training import aot, fit
from t5like.training import state as state_lib
from train_helpers import tiny_config

cfg = tiny_config("decllm", batch_size=32, length=64)
compiled = []

def compile_report(cfg, devices, chip=None, eval_step=True, hbm_bytes=0.0):
  setting = (cfg.model.remat_policy, cfg.train.microbatches)
  compiled.append("%s/%d" % setting)  # Fits: full remat, or dots_no_batch from 4 microbatches.
  return {"fits": setting[0] == "full" or setting[1] >= 4, "train": {"peak": 1.0},
          "mesh": {"fsdp": 4}, "headroom": 0.5}
aot.compile_report = compile_report

def chip(peak, ici):  # hbm_bw: the state's traffic is the same for every candidate anyway.
  return aot.Chip("test", 2.0**40, peak, 1e30, ici, 1, 2)

out = {}
for name, c in [("compute_bound", chip(1e9, 1e30)), ("gather_bound", chip(1e30, 1.0)),
                ("no_chip", None)]:
  compiled.clear()
  _, chosen = fit.search(cfg, c, aot.jax.devices(), log=lambda s: None, splits=(1,),
                         hbm_bytes=2.0**40, max_compiles=20)
  out[name] = {"compiled": list(compiled),
               "chosen": "%s/%d" % (chosen.model.remat_policy, chosen.train.microbatches)}
  configured = fit.candidate(cfg, "full", 1)  # Fits: train.fit=auto looks for a faster one.
  compiled.clear()
  taken, decided = fit.choose(configured, aot.jax.devices(), chip=c, mode="auto",
                              own={"fits": True, "train": {"peak": 1.0}, "headroom": 0.5},
                              say=lambda s: None)
  out[name]["auto"] = {"taken": "%s/%d" % (taken.model.remat_policy, taken.train.microbatches),
                       "compiled": list(compiled), "faster": decided.get("faster", False)}
  if c is not None:
    out[name]["predicted"] = {
        "%s/%d" % k: fit.predicted_step_s(v, state_lib.build_setup(
            v, partitioning.make_mesh(v.mesh, aot.jax.devices())), c)
        for k in fit.CANDIDATES if (v := fit.candidate(cfg, *k)) is not None}
# One gather pass a fifth of the step's compute: only dots_no_batch/1 and /2 beat full/1.
per_pass = out["gather_bound"]["predicted"]["dots_no_batch/1"] / 3  # Seconds at 1 byte/s.
balanced = chip(1e9, per_pass / (0.2 * out["compute_bound"]["predicted"]["dots_no_batch/1"]))
compiled.clear()
taken, decided = fit.choose(configured, aot.jax.devices(), chip=balanced, mode="auto",
                            own={"fits": True, "train": {"peak": 1.0}, "headroom": 0.5},
                            say=lambda s: None)
out["balanced"] = {"auto": {"taken": "%s/%d" % (taken.model.remat_policy,
                                                taken.train.microbatches),
                            "compiled": list(compiled), "faster": decided.get("faster", False)}}
print("RESULT " + json.dumps(out))
"""


def test_on_a_tpu_candidates_go_in_order_of_predicted_step_time():
  """With the chip's figures, the search compiles the candidates fastest-predicted first and takes
  the first that fits, so the fastest that fits by the roofline: compute-bound, ``dots_no_batch``
  at 4 microbatches (no recomputed forward pass) before ``full`` at 1, which is never compiled;
  bound by the FSDP gathers (fewest microbatches first), ``full/1`` before ``dots_no_batch/2``.
  Without figures (GPU, CPU): ``CANDIDATES``' own order. 4 fake devices: FSDP gathers exist."""
  proc = run_script(ORDER, devices=4)
  out = json.loads(proc.stdout.split("RESULT ")[1])
  for name in ("compute_bound", "gather_bound"):
    predicted = out[name]["predicted"]
    assert out[name]["compiled"] == sorted(out[name]["compiled"], key=predicted.get)
  assert out["compute_bound"]["compiled"] == ["dots_no_batch/1", "dots_no_batch/2",
                                              "dots_no_batch/4"]
  assert out["compute_bound"]["chosen"] == "dots_no_batch/4"
  assert out["gather_bound"]["compiled"] == ["dots_no_batch/1", "full/1"]
  assert out["gather_bound"]["chosen"] == "full/1"
  assert out["no_chip"]["compiled"] == ["dots_no_batch/1", "dots_no_batch/2", "full/1"]
  assert out["no_chip"]["chosen"] == "full/1"


def test_on_a_tpu_auto_takes_a_faster_setting_than_a_configured_one_that_fits():
  """The shipped paper configs configure ``full`` remat at one microbatch. Where that fits on a
  TPU, ``train.fit=auto`` compiles only the candidates predicted faster and takes the first that
  fits (compute-bound: ``dots_no_batch/4``), so a run gets the TPU table's setting. Where none of
  those fits (a gather pass a fifth of the compute: ``dots_no_batch/1`` and ``/2``), where none
  is faster (bound by the gathers: ``dots_no_batch/1`` only ties) and without a chip's figures,
  the configured setting is kept."""
  out = json.loads(run_script(ORDER, devices=4).stdout.split("RESULT ")[1])
  assert out["compute_bound"]["auto"] == {
      "taken": "dots_no_batch/4", "faster": True,
      "compiled": ["dots_no_batch/1", "dots_no_batch/2", "dots_no_batch/4"]}
  assert out["balanced"]["auto"] == {"taken": "full/1", "faster": False,
                                     "compiled": ["dots_no_batch/1", "dots_no_batch/2"]}
  assert out["gather_bound"]["auto"] == {"taken": "full/1", "faster": False, "compiled": []}
  assert out["no_chip"]["auto"] == {"taken": "full/1", "faster": False, "compiled": []}
