"""Expected errors reach the user as one ``error: ...`` block and exit status 2, never as a
traceback, through each command line; ``--debug`` / ``T5LIKE_DEBUG=1`` add the traceback.

Each class of error is driven through the entry point's ``main()`` in-process (the scripts'
``__main__`` blocks only add the start-up re-exec); restore errors of a damaged workdir are in
tests/training/test_restore_policy.py and the fit check in tests/training/test_train_errors.py,
next to the runs they need; one subprocess (tests/test_quiet_startup.py) checks the whole stderr
of a real start.
"""
from __future__ import annotations

import argparse
import re

import pytest

from cli_scripts import load_script
from t5like import cli
from t5like.config import ConfigError
from t5like.training import state as state_lib


@pytest.fixture(scope="module")
def train_cli():
  return load_script("train.py")


@pytest.fixture
def no_compile(monkeypatch):
  """Fails the test if a run gets past its checks to building the model."""
  def boom(*args, **kwargs):
    raise AssertionError("the run got past its checks and started building the model")
  monkeypatch.setattr(state_lib, "build_setup", boom)


def clean_error(capsys) -> str:
  """The captured stderr, asserted to be one error block without a traceback (after the run's
  own log lines, e.g. its start-up milestones, where it got that far)."""
  err = re.sub(r"\A(\d\d:\d\d:\d\d (INFO|WARNING) [^\n]*\n)*", "", capsys.readouterr().err)
  assert err.startswith("error: "), err
  assert "Traceback" not in err, err
  return err


def test_config_error(train_cli, capsys):
  assert train_cli.main(["--config.train.nope=3"]) == 2
  assert "unknown config key 'train.nope'" in clean_error(capsys)
  assert train_cli.main(["--config", "no/such/config.py"]) == 2
  assert "config file 'no/such/config.py' does not exist" in clean_error(capsys)
  assert train_cli.main(["--topology", "v5p-8"]) == 2
  assert "--topology needs --compile_only" in clean_error(capsys)


def test_data_layout_error(train_cli, tmp_path, capsys, no_compile):
  code = train_cli.main(["--workdir", str(tmp_path / "run"), "--config.model.vocab_size=8192",
                         "--config.data.mixture=redpajama_v1",
                         f"--config.data.data_dir={tmp_path / 'no_such_corpus'}"])
  assert code == 2
  assert "no_such_corpus" in clean_error(capsys)


def test_vocabulary_error(train_cli, tmp_path, capsys, no_compile):
  code = train_cli.main(["--workdir", str(tmp_path / "run"),
                         f"--config.data.vocab_path={tmp_path / 'nope.model'}"])
  assert code == 2
  err = clean_error(capsys)
  assert "SentencePiece model not found" in err and "build_vocab" in err


def test_unreachable_storage_error(train_cli, tmp_path, capsys, no_compile):
  (tmp_path / "a_file").write_text("not a directory")
  assert train_cli.main(["--workdir", str(tmp_path / "a_file" / "run")]) == 2
  assert "cannot create or reach the workdir" in clean_error(capsys)


def test_eval_errors(capsys):
  eval_cli = load_script("eval.py")
  assert eval_cli.main(["--workdir", "/no/such/workdir", "--step", "3"]) == 2
  assert "no checkpoint for step 3" in clean_error(capsys)
  assert eval_cli.main(["--workdir", "w", "--suite", "ppl", "--config.data.seed=1"]) == 2
  assert "do not apply to --suite" in clean_error(capsys)


def test_eval_refuses_a_config_file_and_says_where_the_config_comes_from(capsys):
  eval_cli = load_script("eval.py")
  assert eval_cli.main(["--workdir", "w", "--config", "configs/tiny_redllm.py"]) == 2
  err = clean_error(capsys)
  assert "reads the config stored with the checkpoint in --workdir" in err
  assert "--config.key=value" in err


def test_an_unknown_key_suggests_the_nearest(train_cli, capsys):
  assert train_cli.main(["--config.train.stepz=3"]) == 2
  assert "Did you mean 'train.steps'?" in clean_error(capsys)


def test_a_missing_package_is_one_error_saying_how_to_install(capsys):
  def needs(argv):
    import t5like_no_such_dependency_xyz  # noqa: F401
  assert cli.guard(needs, []) == 2
  err = clean_error(capsys)
  assert "'t5like_no_such_dependency_xyz' is not installed" in err
  assert ".venv/bin/python" in err and "pip install -e ." in err

  def missing_own_module(argv):
    import t5like.no_such_module  # noqa: F401
  with pytest.raises(ModuleNotFoundError):  # A module of t5like itself: a bug.
    cli.guard(missing_own_module, [])


def test_ctrl_c_outside_the_training_loop_is_one_line(capsys):
  def interrupted(argv):
    raise KeyboardInterrupt
  assert cli.guard(interrupted, []) == cli.EXIT_INTERRUPTED
  assert capsys.readouterr().err == "interrupted (Ctrl-C)\n"


def test_experiments_error(capsys):
  from t5like.experiments.__main__ import main
  assert main(["no_such_experiment", "--output_dir", "unused"]) == 2
  assert "unknown experiment 'no_such_experiment'; available: " in clean_error(capsys)


def test_tool_error(tmp_path, capsys):
  from t5like.tools import build_vocab
  argv = ["--input", str(tmp_path / "missing" / "*.jsonl"), "--output_prefix",
          str(tmp_path / "spm")]
  assert cli.guard(build_vocab.main, argv) == 2
  assert "no file matches --input pattern" in clean_error(capsys)


def test_debug_flag_and_variable_show_the_traceback(train_cli, capsys, monkeypatch):
  assert train_cli.main(["--config.train.nope=3", "--debug"]) == 2
  err = capsys.readouterr().err
  assert "Traceback" in err and "ConfigError" in err
  assert err.rstrip().splitlines()[-1].startswith("error: unknown config key")
  monkeypatch.setenv(cli.DEBUG_ENV, "1")
  assert train_cli.main(["--config.train.nope=3"]) == 2
  assert "Traceback" in capsys.readouterr().err


def test_bugs_keep_their_traceback():
  def buggy(argv):
    raise KeyError("a bug, not the user's input")
  with pytest.raises(KeyError):
    cli.guard(buggy, [])


def test_multi_line_messages_stay_one_block(capsys):
  def fails(argv):
    raise ConfigError("first line\nsecond line")
  assert cli.guard(fails, []) == 2
  lines = capsys.readouterr().err.splitlines()
  assert lines[:2] == ["error: first line", "       second line"]


def test_overrides_parse_alike_everywhere():
  parser = argparse.ArgumentParser()
  cli.add_config_argument(parser, "c.py")
  args, overrides = cli.parse(parser, ["--config.a.b=1", "--config.c", "2", "--config", "x.py"])
  assert args.config == "x.py" and overrides == ["a.b=1", "c=2"]
  for bad in (["--bogus=1"], ["--config.a"], ["--config.a", "--config.b=1"]):
    with pytest.raises(SystemExit):
      cli.parse(parser, bad)
