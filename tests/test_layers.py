"""The packages of t5like import one way, and no module imports itself back through others.

The import graph is read from the source (``ast``), counting every import statement wherever it
stands (inside functions too: a lazy import is still a dependency), so it costs no imports.
"""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "t5like")

# Lower layers never import higher ones; a layer may import its own rank.
LAYERS = {
    "config": 0, "errors": 0, "paths": 0, "runtime": 0,  # Settings, process/path utilities,
    "cli": 0,  # the entry points' shared flags and error printing (imports config only).
    "kernels": 1,  # C++ kernels: only the backends of the ops behind the models import them.
    "data": 2, "models": 2, "ops": 2, "partitioning": 2,
    "training": 3,
    "inference": 4,
    "evaluation": 5,
    "experiments": 6,
    "demo": 7, "tools": 7,  # Entry points (train.py, eval.py, benchmarks/ stand outside).
    "hf": 7,  # PyTorch code shipped in exported model directories; imports no t5like module.
}
# Same-rank imports that would turn the architecture upside down.
FORBIDDEN_SAME_RANK = {("data", "models"), ("models", "data"), ("data", "partitioning")}


def module_files() -> dict[str, str]:
  """``t5like.x.y`` -> its file, for every module of the package."""
  out = {}
  for folder, _, files in os.walk(PACKAGE):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(folder, f)
        name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        out[name.removesuffix(".__init__")] = path
  return out


def _owner(name: str, modules: dict[str, str]) -> str:
  """The module of the package that ``name`` (a module or a name in one) belongs to."""
  while name and name not in modules:
    name = name.rpartition(".")[0]
  return name


def imports_of(module: str, path: str, modules: dict[str, str]) -> set[str]:
  """Every t5like module that ``module`` imports, at module level or inside functions."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out |= {_owner(a.name, modules) for a in node.names if a.name.startswith("t5like")}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      if base.split(".")[0] == "t5like":
        out |= {_owner(f"{base}.{a.name}", modules) for a in node.names}
  return out - {module, ""}


def import_graph() -> dict[str, set[str]]:
  modules = module_files()
  return {m: imports_of(m, p, modules) for m, p in modules.items()}


def layer(module: str) -> str:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else parts[0]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components with more than one module (Tarjan)."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  found: list[list[str]] = []

  def visit(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_every_package_has_a_layer():
  unknown = sorted({layer(m) for m in module_files()} - set(LAYERS) - {"t5like"})
  assert unknown == [], f"add {unknown} to LAYERS in tests/test_layers.py"


def test_no_import_from_a_lower_layer_to_a_higher_one():
  upward = []
  for module, targets in sorted(import_graph().items()):
    for target in sorted(targets):
      a, b = layer(module), layer(target)
      if a == "t5like" or b == "t5like":
        continue
      if LAYERS[b] > LAYERS[a] or (a, b) in FORBIDDEN_SAME_RANK:
        upward.append(f"{module} -> {target}")
  assert upward == []


def test_no_import_circles():
  assert cycles(import_graph()) == []


def test_the_graph_sees_lazy_and_relative_imports(tmp_path):
  """The reader itself: an import inside a function and a relative import both count."""
  modules = {"t5like.a.x": "", "t5like.a.y": "", "t5like.b": ""}
  src = tmp_path / "x.py"
  src.write_text("from . import y\n\ndef f():\n  import t5like.b\n")
  assert imports_of("t5like.a.x", str(src), modules) == {"t5like.a.y", "t5like.b"}
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
