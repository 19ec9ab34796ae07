"""distributed.mode=auto: flags/env give explicit coordinates; a SLURM job or multi-host TPU slice
is left to JAX's own cluster detection (initialize() without coordinates), named in the log."""
from __future__ import annotations

import logging

import jax
import pytest

from t5like.config import ConfigError, DistributedConfig
from t5like.training import distributed


@pytest.fixture
def calls(monkeypatch):
  seen = []
  monkeypatch.setattr(distributed, "_already_initialized", lambda: False)
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: seen.append(kw))
  monkeypatch.setattr(jax.config, "update", lambda *a: None)
  for var in ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_NPROCS", "TPU_WORKER_HOSTNAMES",
              "MEGASCALE_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
              "JAX_PROCESS_ID"):
    monkeypatch.delenv(var, raising=False)
  return seen


def test_single_process_by_default(calls):
  assert distributed.initialize(DistributedConfig()) is False and calls == []


def test_slurm_job_is_detected_and_left_to_jax(calls, monkeypatch, caplog):
  monkeypatch.setenv("SLURM_JOB_ID", "4242")
  monkeypatch.setenv("SLURM_NTASKS", "4")
  with caplog.at_level(logging.INFO, logger="t5like.training"):
    assert distributed.initialize(DistributedConfig()) is True
  (kw,) = calls
  assert "coordinator_address" not in kw and "process_id" not in kw  # JAX reads SLURM_*.
  assert any("detected cluster: SLURM job 4242 (4 tasks)" in r.getMessage()
             for r in caplog.records)


def test_one_task_slurm_job_stays_single_process(calls, monkeypatch):
  monkeypatch.setenv("SLURM_JOB_ID", "1")
  monkeypatch.setenv("SLURM_NTASKS", "1")
  assert distributed.initialize(DistributedConfig()) is False and calls == []


def test_tpu_pod_slice_is_detected(calls, monkeypatch):
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "w0,w1,w2,w3")
  assert distributed.initialize(DistributedConfig()) is True
  assert "coordinator_address" not in calls[0]


def test_partial_coordinates_are_a_clear_error(calls, monkeypatch):
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
  with pytest.raises(ConfigError, match="needs all of distributed.coordinator_address"):
    distributed.initialize(DistributedConfig())


def test_multislice_job_gets_timeouts_above_the_longest_compile(calls, monkeypatch):
  """Several slices (libtpu's MEGASCALE_* variables): JAX detects the job; its coordination
  service's heartbeat / shutdown timeouts come from distributed.* (JAX's 100 s heartbeat kills
  jobs whose hosts are still compiling)."""
  monkeypatch.setenv("MEGASCALE_COORDINATOR_ADDRESS", "10.0.0.2:8080")
  assert distributed.initialize(DistributedConfig()) is True
  assert calls[0]["heartbeat_timeout_seconds"] == 900
  assert calls[0]["shutdown_timeout_seconds"] == 900
  calls.clear()
  distributed.initialize(DistributedConfig(heartbeat_timeout_s=1800))
  assert calls[0]["heartbeat_timeout_seconds"] == 1800


def test_this_jax_takes_the_timeouts():
  """Unpatched: the installed JAX accepts both (else ``timeouts`` would silently drop them)."""
  assert set(distributed.timeouts(DistributedConfig())) == {
      "heartbeat_timeout_seconds", "shutdown_timeout_seconds"}
