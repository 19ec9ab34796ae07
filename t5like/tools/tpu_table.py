"""The paper table for TPU slices: every paper config compiled ahead of time (``aot.py``) for the
slices a user would rent, with the microbatches / remat policy / mesh that make it fit.

Usage (needs libtpu: ``pip install -e '.[tpu]'``, or ``make tpu-table``)::

  python -m t5like.tools.tpu_table --topologies v5p-128 v5e-256 \
      --results runs/tpu_table.json [--markdown TABLE.md] [--readme docs/pods.md]

For each config and slice it compiles candidate settings in ``train.fit``'s order (by the roofline
step predicted before compiling, ``fit.predicted_step_s``; a row's ``--from_table`` setting first)
and keeps the first that fits with the headroom ``aot.HEADROOM``. Candidates that the per-device
estimates already put far over the chip's HBM are skipped without compiling. Results are appended to
``--results`` after each compile, so an interrupted table resumes where it stopped. Each row
compiles in a child process of its own (``--in_process``: in this one), so a compiler crash costs
its row, named at the end, not the run. ``--readme PAGE`` (the table's home: docs/pods.md) rewrites
the page's block between ``<!-- tpu-table -->`` and ``<!-- /tpu-table -->``: rows with a result in
``--results`` are replaced or added, the block's other rows are kept (so a new slice or config is
one more run). ``--before PAGE`` (e.g. the page as the last commit has it) sets the rows this run
compiled beside the same rows of PAGE's block in a second table (setting, peak memory, roofline
step, headroom, before and now), which keeps the rows of earlier runs the way the main table does.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from etils import epath

from t5like import cli
from t5like.config import Config, load_config
from t5like.tools import provenance
from t5like.training import aot, fit

PRETRAIN = [f"{f}_{s}" for s in ("150m", "1b", "2b", "4b", "8b") for f in ("decllm", "redllm")]
FINETUNE = [f"{f}_{s}_flan" for s in ("150m", "1b", "2b", "4b", "8b")
            for f in ("decllm", "decllm_prefix", "redllm")]
MOE = ([f"{f}_{s}_moe" for s in ("1b", "8b") for f in ("decllm", "redllm")]
       + [f"{f}_1b_moe_flan" for f in ("decllm", "redllm")])
# A mixture-of-experts config is compiled expert-parallel (docs/moe.md): its 8 expert groups one
# per shard of an 8-way `expert` axis, on the capacity path (the dispatch that runs sharded).
EXPERT_PARALLEL = ["mesh.expert=8", "model.moe.capacity_factor=1.25"]
# The candidate settings and their search: the trainer's own (train.fit, t5like/training/fit.py).
CANDIDATES, SKIP_ABOVE, search = fit.CANDIDATES, fit.SKIP_ABOVE, fit.search
# Data paths the paper configs require; a compile reads no data, so they are never opened.
PLACEHOLDERS = ["data.data_dir=gs://compile-only/corpus",
                "data.vocab_path=gs://compile-only/spm.model",
                "train.init_from=gs://compile-only/pretrained"]
BEGIN, END = "<!-- tpu-table -->", "<!-- /tpu-table -->"


def _rank(key: str) -> tuple[int, str]:
  """Table order: the paper configs in PRETRAIN + FINETUNE order, then the slice."""
  name, topo = key.split("@")
  names = PRETRAIN + FINETUNE + MOE
  return (names.index(name) if name in names else len(names), topo)


def _row(name: str, topo: str, r: dict[str, Any]) -> str:
  mesh = "x".join(f"{k}{v}" for k, v in r["mesh"].items() if v > 1) or "1"
  fits = f"{r['headroom']:.0%}" if r["fits"] else f"**no** ({r['headroom']:.0%})"
  return (f"| {name} | {topo} | {r['num_params'] / 1e9:.2f}B | {mesh} | {r['microbatches']} | "
          f"{r['remat']} | {r['train']['peak'] / aot.GiB:.1f} / {r['hbm_bytes'] / aot.GiB:.0f} | "
          f"{fits} | {r['step_s']:.2f}-{r['step_serial_s']:.2f} | "
          f"{r['mfu_serial']:.0%}-{r['mfu']:.0%} | "
          f"{r['compile_s']:.0f} | {provenance.cell(r.get('compiled'))} |")


def _lines(results: dict[str, dict[str, Any]], keep: dict[str, str], row) -> list[str]:
  """Table rows in table order: ``keep`` (rows already written) updated with ``results``."""
  lines = dict(keep)
  for key, r in results.items():
    line = row(*key.split("@"), r)
    if line:
      lines[key] = line
  return [lines[k] for k in sorted(lines, key=_rank)]


def markdown(results: dict[str, dict[str, Any]], keep: dict[str, str] | None = None) -> str:
  rows = ["| config | slice | params | mesh | micro-batches | remat | peak / HBM GiB per chip | "
          "headroom | step s | roofline MFU | compile s | compiled (date, host, code) |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  return "\n".join(rows + _lines(results, keep or {}, _row))


COMPARED = "Before and now"  # Opens the block's second table (``--before``).


def _cells(line: str) -> list[str]:
  return [c.strip() for c in line.strip().strip("|").split("|")]


def _compare_row(name: str, topo: str, r: dict[str, Any], before: dict[str, str]) -> str:
  """One row of the before/now table: ``before[key]``, a main-table row, against ``r``."""
  key = f"{name}@{topo}"
  if key not in before:
    return ""
  old = _cells(before[key])
  return (f"| {name} | {topo} | {old[5]}/{old[4]} → {r['remat']}/{r['microbatches']} | "
          f"{old[6].split('/')[0].strip()} → {r['train']['peak'] / aot.GiB:.1f} | "
          f"{old[8]} → {r['step_s']:.2f}-{r['step_serial_s']:.2f} | "
          f"{old[7]} → {r['headroom']:.0%} |")


def compare_markdown(results: dict[str, dict[str, Any]], before: dict[str, str],
                     keep: dict[str, str] | None = None) -> str:
  """The rows of ``results`` that ``before`` (main-table rows by ``config@slice``) has too,
  merged into ``keep`` (the before/now rows an earlier run wrote)."""
  lines = _lines(results, keep or {}, lambda n, t, r: _compare_row(n, t, r, before))
  if not lines:
    return ""
  return "\n".join(["| config | slice | remat/micro-batches before → now | peak GiB per chip "
                    "before → now | roofline step s before → now | headroom before → now |",
                    "|---|---|---|---|---|---|"] + lines)


def block_rows(block: str) -> tuple[dict[str, str], str]:
  """The main table's rows of a block written before, keyed like results (``config@slice``),
  and the block's text after it (the before/now table, kept as it was unless ``--before``).
  ``--readme`` keeps the rows unless this run has a result for them, so a table grows slice
  by slice without recompiling what is already there."""
  main: dict[str, str] = {}
  lines = block.splitlines()
  for i, line in enumerate(lines):
    if line.startswith((COMPARED, "Same settings")):
      return main, "\n".join(lines[i:]).strip()
    cells = _cells(line)
    if line.startswith("| ") and len(cells) > 2 and cells[0] != "config":
      main[f"{cells[0]}@{cells[1]}"] = line
  return main, ""


def table_settings(page: str) -> dict[str, tuple[str, int]]:
  """``config@slice`` -> (remat, microbatches) of each main-table row in ``page``'s block."""
  if BEGIN not in page or END not in page:
    return {}
  main, _ = block_rows(_block(page))
  out = {}
  for key, line in main.items():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) > 5 and cells[4].isdigit():
      out[key] = (cells[5], int(cells[4]))
  return out


def _block(page: str) -> str:
  return page.split(BEGIN, 1)[1].split(END, 1)[0] if BEGIN in page and END in page else ""


def table(results: dict[str, dict[str, Any]], block: str = "", before: str | None = None) -> str:
  """The markdown of ``results`` merged into the rows of ``block`` (a table written before);
  ``before`` (a page): with the table of this run's rows against that page's rows, else
  ``block``'s before/now table as it was."""
  keep_main, compared = block_rows(block)
  text = markdown(results, keep_main)
  if before is not None:  # Rows of earlier runs stay unless this one compiled them again.
    kept = {} if not compared.startswith(COMPARED) else {
        f"{c[0]}@{c[1]}": ln for ln in compared.splitlines()
        if ln.startswith("| ") and (c := _cells(ln))[0] != "config"}
    rows = compare_markdown(results, block_rows(_block(before))[0], kept)
    compared = (f"{COMPARED}: each row as the run that last compiled it found it, beside the "
                f"same row of the table that run was given as before (setting, peak, roofline "
                f"step, headroom):\n\n{rows}" if rows else "")
  if compared.startswith(COMPARED):  # An old table of another kind goes.
    text += "\n\n" + compared
  return text


def _load(path: str) -> Config:
  """A config to compile: data placeholders; an MoE config expert-parallel."""
  base = load_config(path, PLACEHOLDERS)
  return load_config(path, PLACEHOLDERS + EXPERT_PARALLEL) if base.model.moe.num_experts else base


def _jsonable(r: dict[str, Any]) -> dict[str, Any]:
  out = dict(r)
  out["largest_consumer"] = list(r["largest_consumer"])
  return out


def _parse_candidate(text: str) -> tuple[str, int]:
  remat, _, mb = text.partition("/")
  if remat not in {r for r, _ in CANDIDATES} or not mb.isdigit() or int(mb) < 1:
    raise SystemExit(f"--candidates: {text!r} is not REMAT/MICROBATCHES with REMAT one of "
                     f"{sorted({r for r, _ in CANDIDATES})} (e.g. full/2)")
  return remat, int(mb)


def _compile_in_process(args, shown: dict[str, tuple[str, int]],
                        candidates: list[tuple[str, int]]) -> list[str]:
  """Compiles every missing ``config@slice`` row here, saving ``--results`` after each."""
  import jax
  jax.config.update("jax_enable_compilation_cache", False)  # "compile s" is a cold compile.
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  results_path = epath.Path(args.results)
  results = json.loads(results_path.read_text()) if results_path.exists() else {}
  for topo in args.topologies:
    chip, devices = aot.topology_devices(topo)
    for name in args.configs:
      key = f"{name}@{topo}"
      base = _load(os.path.join(root, "configs", f"{name}.py"))
      if key in results:
        continue
      print(f"{key}:", flush=True)
      report, _ = search(base, chip, devices, log=lambda s: print(s, flush=True),
                         max_compiles=args.max_compiles, candidates=candidates or None,
                         first=shown.get(key))
      report["compiled"] = provenance.stamp()  # Compile seconds depend on host and code.
      results[key] = _jsonable(report)
      results_path.parent.mkdir(parents=True, exist_ok=True)
      results_path.write_text(json.dumps(results, indent=1, default=float))
  return []


def child_command(args, name: str, topo: str, candidates: list[tuple[str, int]],
                  first: tuple[str, int] | None = None) -> list[str]:
  """This tool, compiling one row in a process of its own (``--in_process``)."""
  cmd = [sys.executable, "-m", "t5like.tools.tpu_table", "--in_process", "--topologies", topo,
         "--configs", name, "--results", args.results, "--max_compiles", str(args.max_compiles)]
  if candidates:
    cmd += ["--candidates"] + [f"{r}/{m}" for r, m in candidates]
  if first:
    cmd += ["--first", f"{first[0]}/{first[1]}"]
  return cmd


def _compile_in_children(args, shown: dict[str, tuple[str, int]],
                         candidates: list[tuple[str, int]]) -> list[str]:
  """Each missing row compiled by a child process (libtpu's compiler has crashed the whole
  process on a paper config: a row that kills its child is reported and the table goes on)."""
  results_path = epath.Path(args.results)
  failed = []
  for topo in args.topologies:
    for name in args.configs:
      key = f"{name}@{topo}"
      done = json.loads(results_path.read_text()) if results_path.exists() else {}
      if key in done:
        continue
      rc = subprocess.run(child_command(args, name, topo, candidates, shown.get(key)),
                          check=False).returncode
      if rc:
        why = f"was killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"
        print(f"{key}: its compile process {why}; the table goes on", flush=True)
        failed.append(key)
  return failed


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--topologies", nargs="+", default=None,
                  help="slices to compile (default: v5p-128 v5e-256) and to render (default: "
                       "every slice --results holds, e.g. 2xv5p-128 rows of an earlier run)")
  ap.add_argument("--configs", nargs="+", default=PRETRAIN + FINETUNE + MOE,
                  help="names under configs/ (default: the ten pretraining, fifteen "
                       "instruction-tuning and six mixture-of-experts paper configs; an MoE "
                       "config is compiled with " + " ".join(EXPERT_PARALLEL) + ")")
  ap.add_argument("--results", default="runs/tpu_table.json")
  ap.add_argument("--max_compiles", type=int, default=8,
                  help="compiles per config and slice before giving up on a fitting setting")
  ap.add_argument("--candidates", nargs="*", default=[],
                  help="search only these settings, REMAT/MICROBATCHES in order (e.g. full/2), "
                       "e.g. a same-shaped config's result: decllm_prefix_* has decllm_*'s memory")
  ap.add_argument("--first", default="", help="try this REMAT/MICROBATCHES before the others")
  ap.add_argument("--from_table", action="store_true",
                  help="with --readme: recompile each row at the setting its row in the page "
                       "shows (one compile per row; the search resumes only where that setting "
                       "no longer fits), so every row's figures come from this run")
  ap.add_argument("--in_process", action="store_true",
                  help="compile in this process (default: one child process per row, so a "
                       "compiler crash costs that row, not the run)")
  ap.add_argument("--report_only", action="store_true",
                  help="compile nothing: the table of what --results already holds")
  ap.add_argument("--markdown", default="")
  ap.add_argument("--readme", default="",
                  help="a page with a tpu-table block to rewrite (the table's home: docs/pods.md)")
  ap.add_argument("--before", default="",
                  help="with --readme: a page whose block holds the rows before this run (e.g. "
                       "git show HEAD:docs/pods.md > before.md); the block gets a table of this "
                       "run's rows beside those")
  cli.add_debug_argument(ap)
  args = ap.parse_args(argv)
  render_all = args.topologies is None
  args.topologies = args.topologies or ["v5p-128", "v5e-256"]
  candidates = [_parse_candidate(c) for c in args.candidates]
  if args.from_table and not args.readme:
    raise SystemExit("--from_table reads the rows of --readme's table: name the page")
  results_path = epath.Path(args.results)
  shown = table_settings(epath.Path(args.readme).read_text()) if args.from_table else {}
  if args.first:  # One row's setting (a child of --from_table): tried before the search.
    shown.update({f"{c}@{t}": _parse_candidate(args.first)
                  for c in args.configs for t in args.topologies})
  compile_rows = _compile_in_process if args.in_process else _compile_in_children
  failed = [] if args.report_only else compile_rows(args, shown, candidates)
  results = json.loads(results_path.read_text()) if results_path.exists() else {}
  chosen = {k: v for k, v in results.items()
             if (render_all or k.split("@")[1] in args.topologies)
             and k.split("@")[0] in args.configs}
  print(table(chosen))
  if args.markdown:
    epath.Path(args.markdown).write_text(table(chosen) + "\n")
  if args.readme:
    readme = epath.Path(args.readme)
    text = readme.read_text()
    if BEGIN not in text or END not in text:
      print(f"{args.readme} has no {BEGIN} ... {END} block", file=sys.stderr)
      return 2
    head, rest = text.split(BEGIN, 1)
    block, tail = rest.split(END, 1)
    before = epath.Path(args.before).read_text() if args.before else None
    readme.write_text(head + BEGIN + "\n" + table(chosen, block, before) + "\n" + END + tail)
  if failed:
    print("not compiled (their rows are kept as they were): " + ", ".join(failed), file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(cli.guard(main))
