"""The repository stands on its own: no tracked file points outside it or to a missing document."""
from __future__ import annotations

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = (".py", ".md", ".toml", ".cfg", ".txt", ".sh", ".yml", ".yaml", "Makefile", "Dockerfile",
        ".ci/run", ".gitignore")
OUTSIDE = [
    (re.compile(r"\.\./shared\b"), "a sibling directory of the checkout"),
    (re.compile(r"(?<![\w.:/])/(?:work|root|home/\w+|Users/\w+)/"), "an absolute machine path"),
    (re.compile(r"\b(?:PAPER|ANCHORS|LAYOUT)\.md\b"), "a document not in the repository"),
]
DOC_PATH = re.compile(r"\bdocs/[\w./-]+\.md\b")
MD_LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")


def _tracked() -> list[str]:
  out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
  return [f for f in out.stdout.splitlines()
          if f.endswith(TEXT) and "/embedded/" not in f and f != "tests/test_self_contained.py"]


def test_no_tracked_file_refers_outside_the_repository_or_to_missing_documents():
  problems = []
  for rel in _tracked():
    path = os.path.join(ROOT, rel)
    if not os.path.exists(path):  # Deleted in the work tree, not yet committed.
      continue
    with open(path, encoding="utf-8", errors="replace") as f:
      text = f.read()
    for n, line in enumerate(text.splitlines(), 1):
      for pattern, why in OUTSIDE:
        if pattern.search(line):
          problems.append(f"{rel}:{n}: {why}: {line.strip()[:100]}")
      for doc in DOC_PATH.findall(line):
        if not os.path.exists(os.path.join(ROOT, doc)):
          problems.append(f"{rel}:{n}: {doc} does not exist")
      if rel.endswith(".md"):
        for target in MD_LINK.findall(line):
          if "://" in target:
            continue
          resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
          if not resolved.startswith(ROOT + os.sep) or not os.path.exists(resolved):
            problems.append(f"{rel}:{n}: link to {target} leaves the repository or is missing")
  assert not problems, "\n".join(problems)


def test_the_checker_catches_what_it_claims():
  bad = ["see ../shared/reference/x", "PAPER.md §1", "open('/work/main/x')",
         "/home/alice/data"]
  assert all(any(p.search(s) for p, _ in OUTSIDE) for s in bad)
  ok = ["https://example.com/work/x", "gs://bucket/root/x", "docs/paper.md §1", "/tmp/x"]
  assert not any(p.search(s) for p, _ in OUTSIDE for s in ok)
