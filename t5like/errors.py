"""The base class of the errors a user causes and fixes (a config key, a path, a damaged workdir).

Each is raised with a message that names the problem and the fix. The command-line entry points
(``t5like.cli.guard``) print such an error as one ``error: ...`` block and exit with status 2,
without a traceback; anything else is a bug and keeps its traceback.
"""
from __future__ import annotations


class UserError(Exception):
  """An expected error: bad input or a state of the user's files or storage, not a bug."""
