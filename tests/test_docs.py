"""The user documentation stays true to the code: README.md and docs/*.md.

Checks: the README's length; every relative link (and its #anchor) resolves; every
``--config.<key>`` named is a field of the config dataclasses; every ``make <target>`` named exists
in the Makefile; the quickstart's two commands are the ones the Makefile documents and ``.ci/run``
runs; and the README's commands marked ``<!-- runs-on-cpu -->`` parse.

Commands are checked parse-only, nothing runs: each flag of a command must be one its CLI lists
in ``--help`` (so the check survives a move of the argument parsing), and each ``train.py``
command (the launchers' too) also has its config file and overrides resolved by
``t5like.config.load_config``, as ``train.py`` does (values and cross-field checks included). Checked: every command of the README, whatever its CLI, those of
docs/*.md for train.py, eval.py and the experiments, and the README's commands marked
``<!-- runs-on-cpu -->`` must be of those. A few subprocesses, ~10-20 s on 2 cores.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import shlex
import subprocess
import sys
import typing

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
PAGES = [README] + sorted(os.path.join(DOCS, p) for p in os.listdir(DOCS) if p.endswith(".md"))
PLACEHOLDER_KEYS = {"key"}  # `--config.key=value`, the syntax itself.
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CPU_MARK = "<!-- runs-on-cpu -->"


def _read(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def _rel(path: str) -> str:
  return os.path.relpath(path, ROOT)


def _slug(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces '-'."""
  text = re.sub(r"[`*]", "", heading.strip().lower())
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def _anchors(path: str) -> set[str]:
  seen: dict[str, int] = {}
  out = set()
  for line in FENCE.sub("", _read(path)).splitlines():
    m = re.match(r"#{1,6}\s+(.*)", line)
    if m:
      slug = _slug(m.group(1))
      n = seen.get(slug, 0)
      seen[slug] = n + 1
      out.add(slug if n == 0 else f"{slug}-{n}")
  return out


def _code(text: str) -> list[str]:
  """Fenced blocks and inline code spans: where commands are written."""
  fences = FENCE.findall(text)
  return fences + re.findall(r"`([^`\n]+)`", FENCE.sub("", text))


def _config_fields(cls) -> dict[str, typing.Any]:
  hints = typing.get_type_hints(cls)
  return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _is_config_key(key: str) -> bool:
  from t5like.config import Config
  cls = Config
  for part in key.split("."):
    if not (dataclasses.is_dataclass(cls) and part in _config_fields(cls)):
      return False
    cls = _config_fields(cls)[part]
  return not dataclasses.is_dataclass(cls)  # A leaf, not a whole sub-config.


def _make_targets() -> set[str]:
  return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", _read(os.path.join(ROOT, "Makefile")),
                        re.M))


def test_readme_is_a_short_guide_and_performance_page_stays_small():
  assert len(_read(README).splitlines()) <= 300
  assert len(_read(os.path.join(DOCS, "performance.md")).splitlines()) <= 400


def test_every_relative_link_and_anchor_resolves():
  bad = []
  for page in PAGES + [os.path.join(ROOT, "t5like", "data", "README.md")]:
    for target in LINK.findall(FENCE.sub("", _read(page))):
      if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
        continue
      path, _, anchor = target.partition("#")
      dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
      if not os.path.exists(dest):
        bad.append(f"{_rel(page)}: {target} (no such file)")
      elif anchor and dest.endswith(".md") and anchor not in _anchors(dest):
        bad.append(f"{_rel(page)}: {target} (no heading #{anchor} in {_rel(dest)})")
  assert not bad, "\n".join(bad)


def test_the_docs_index_lists_every_page():
  index = _read(os.path.join(DOCS, "README.md"))
  missing = [p for p in os.listdir(DOCS)
             if p.endswith(".md") and p != "README.md" and f"]({p})" not in index]
  assert not missing, f"docs/README.md does not link {missing}"


def test_every_config_key_named_is_a_real_one():
  bad = []
  for page in PAGES:
    for key in re.findall(r"--config\.([A-Za-z_][\w.]*\w)", _read(page)):
      if key not in PLACEHOLDER_KEYS and not _is_config_key(key):
        bad.append(f"{_rel(page)}: --config.{key}")
  assert not bad, "not fields of t5like.config.Config:\n" + "\n".join(bad)


def test_config_key_check_rejects_a_misspelt_key():
  assert _is_config_key("model.num_kv_heads") and _is_config_key("train.init_from")
  assert not _is_config_key("model.d_modle") and not _is_config_key("model")


def test_every_make_target_named_exists():
  targets = _make_targets()
  bad = []
  for page in PAGES:
    for code in _code(_read(page)):
      for target in re.findall(r"(?:^|[\s;&(])make ([a-z][\w-]*\w)", code):
        if target not in targets:
          bad.append(f"{_rel(page)}: make {target}")
  assert not bad, "not targets of the Makefile:\n" + "\n".join(bad)


def _quickstart_commands() -> list[str]:
  section = _read(README).split("## Quickstart", 1)[1].split("\n## ", 1)[0]
  block = FENCE.search(section).group(0)
  return [line.split("#", 1)[0].strip() for line in block.splitlines()[1:-1]
          if line.split("#", 1)[0].strip()]


def test_quickstart_commands_are_the_ones_ci_and_the_makefile_run():
  commands = _quickstart_commands()
  assert commands == ["make demo", "make test"]
  makefile = _read(os.path.join(ROOT, "Makefile"))
  header = "\n".join(line for line in makefile.splitlines()[:5] if line.startswith("#"))
  for command in commands:  # Documented at the Makefile's top, and each does its own set-up.
    target = command.split()[1]
    assert f"#   {command}" in header
    prerequisites = re.search(rf"^{target}:(.*)$", makefile, re.M).group(1)
    assert "$(STAMP)" in prerequisites, f"{command} does not install first"
  ci = [line.strip() for line in _read(os.path.join(ROOT, ".ci", "run")).splitlines()
        if line.strip() and not line.lstrip().startswith("#")]
  assert [line for line in ci if line.startswith("make")] == ["make test"]


def _commands(text: str) -> list[list[str]]:
  """The shell commands of a page's bash code blocks, continuation lines joined."""
  commands = []
  for block in FENCE.findall(text):
    if not block.startswith("```bash"):
      continue
    joined = re.sub(r"\\\n\s*", " ", "\n".join(block.splitlines()[1:-1]))
    for line in joined.splitlines():
      words = shlex.split(line, comments=True)
      if words:
        commands.append(words)
  return commands


def _cpu_commands() -> list[list[str]]:
  parts = _read(README).split(CPU_MARK)[1:]
  assert all(p.lstrip().startswith("```bash") for p in parts), f"{CPU_MARK} must sit on a block"
  return [words for part in parts for words in _commands(FENCE.search(part).group(0))]


LAUNCHERS = ("docker/launch_tpu.sh", "docker/launch_gpu.sh",  # Their arguments go to train.py.
             "docker/launch_tpu_multislice.sh")
CHEAP_CLIS = {("train.py",), ("eval.py",), ("-m", "t5like.experiments")}  # --help in ~1 s.


def _python_command(words: list[str]) -> tuple[tuple[str, ...], list[str]] | None:
  """(the interpreter arguments naming the CLI, its arguments) of a command running one."""
  for i, word in enumerate(words):
    if word in LAUNCHERS:
      return ("train.py",), words[i + 1:]
    if word == "python" or word.endswith("/bin/python"):
      n = i + 3 if words[i + 1] == "-m" else i + 2
      return tuple(words[i + 1:n]), words[n:]
  return None


def _documented_commands() -> list[tuple[str, tuple[str, ...], list[str]]]:
  """Every CLI command of the README (any CLI) and of docs/*.md (the CLIs quick to ask)."""
  out = []
  for page in PAGES:
    for words in _commands(_read(page)):
      found = _python_command(words)
      if found and (page == README or found[0] in CHEAP_CLIS):
        out.append((_rel(page), *found))
  return out


@functools.lru_cache(maxsize=None)
def _help_flags(cli: tuple[str, ...]) -> frozenset[str]:
  out = subprocess.run([sys.executable, *cli, "--help"], cwd=ROOT, capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=300, check=False)
  assert out.returncode == 0, f"{' '.join(cli)} --help failed:\n{out.stderr[-2000:]}"
  return frozenset(re.findall(r"(--[A-Za-z][\w-]*)", out.stdout))


def test_the_readme_marks_its_cpu_commands():
  clis = {_python_command(words)[0] for words in _cpu_commands()}
  assert CHEAP_CLIS <= clis


def _check_command(page: str, cli: tuple[str, ...], args: list[str]) -> None:
  flags = {a.split("=", 1)[0] for a in args if a.startswith("--") and
           not a.startswith("--config.")}
  unknown = flags - _help_flags(cli)
  assert not unknown, f"{page}: {' '.join(cli)} has no {sorted(unknown)}"
  if cli == ("train.py",):  # The config file, the overrides and their values, resolved.
    from t5like.config import ConfigError, load_config
    path = args[args.index("--config") + 1] if "--config" in args else "configs/tiny_decllm.py"
    overrides = [a[len("--config."):] for a in args if a.startswith("--config.")]
    try:
      load_config(os.path.join(ROOT, path), overrides)
    except ConfigError as e:
      pytest.fail(f"{page}: {shlex.join(args)}: {e}")


@pytest.mark.parametrize("page, cli, args", _documented_commands(),
                         ids=lambda x: x if isinstance(x, str) else shlex.join(x))
def test_documented_command_parses(page, cli, args):
  _check_command(page, cli, args)


@pytest.mark.parametrize("words", _cpu_commands(), ids=shlex.join)
def test_readme_cpu_command_parses(words):
  cli, args = _python_command(words)
  assert cli in CHEAP_CLIS, f"a CPU command of an unchecked CLI: {shlex.join(words)}"
  _check_command("README.md", cli, args)
