"""Typed config machinery: dotted overrides and early validation for nested dataclasses.

Every config section is a plain ``@dataclasses.dataclass`` whose fields carry a one-line comment and
whose ``validate()`` rejects nonsense. This module gives the generic parts: turning
``model.d_model=256`` into a typed assignment, rejecting unknown keys with the list of valid ones,
and serialising a resolved config to plain JSON (stored with every checkpoint).
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from typing import Any

from t5like.errors import UserError


class ConfigError(UserError, ValueError):
  """A config key or value that cannot be used; the message says what to change."""


def field_names(obj: Any) -> list[str]:
  return [f.name for f in dataclasses.fields(obj)]


def _resolve_types(cls: type) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def _coerce(raw: str, typ: Any, key: str) -> Any:
  """Parses a command-line string into the field's declared type."""
  origin = typing.get_origin(typ)
  if origin in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(typ) if a is not type(None)]
    if raw.lower() in ("none", "null"):
      return None
    errors = []
    for a in args:
      try:
        return _coerce(raw, a, key)
      except ConfigError as e:
        errors.append(str(e))
    raise ConfigError(f"{key}: cannot parse {raw!r} as {typ}: {'; '.join(errors)}")
  if origin in (tuple, list):
    (elem, *_) = typing.get_args(typ) or (str,)
    parts = [p for p in raw.strip("()[]").split(",") if p.strip()]
    vals = [_coerce(p.strip(), elem, key) for p in parts]
    return tuple(vals) if origin is tuple else vals
  if origin is dict or typ is dict:
    try:
      val = json.loads(raw)
    except json.JSONDecodeError as e:
      raise ConfigError(f"{key}: expected a JSON object, got {raw!r} ({e})") from None
    if not isinstance(val, dict):
      raise ConfigError(f"{key}: expected a JSON object, got {raw!r}")
    return val
  if typ is bool:
    low = raw.lower()
    if low in ("1", "true", "yes", "on"):
      return True
    if low in ("0", "false", "no", "off"):
      return False
    raise ConfigError(f"{key}: expected a boolean (true/false), got {raw!r}")
  if typ is int:
    try:
      return int(raw)
    except ValueError:
      raise ConfigError(f"{key}: expected an integer, got {raw!r}") from None
  if typ is float:
    try:
      return float(raw)
    except ValueError:
      raise ConfigError(f"{key}: expected a number, got {raw!r}") from None
  if typ is str or typ is Any:
    return raw
  raise ConfigError(f"{key}: cannot override a field of type {typ} from the command line")


def set_dotted(cfg: Any, key: str, value: Any) -> None:
  """Sets ``cfg.a.b.c = value``; ``value`` may be a string (parsed by the field type) or typed."""
  parts = key.split(".")
  obj = cfg
  for i, part in enumerate(parts):
    if not dataclasses.is_dataclass(obj):
      raise ConfigError(f"{'.'.join(parts[:i])} is not a config section; cannot set {key}")
    names = field_names(obj)
    if part not in names:
      where = ".".join(parts[:i]) or "config"
      near = difflib.get_close_matches(part, names, n=1)
      hint = f" Did you mean {'.'.join(parts[:i] + near)!r}?" if near else ""
      raise ConfigError(
          f"unknown config key {key!r}: {where} has no field {part!r}.{hint} "
          f"Valid keys of {where}: {', '.join(sorted(names))}")
    if i == len(parts) - 1:
      typ = _resolve_types(type(obj))[part]
      if isinstance(value, str) and typ is not str:
        value = _coerce(value, typ, key)
      elif dataclasses.is_dataclass(getattr(obj, part)) and not dataclasses.is_dataclass(value):
        raise ConfigError(f"{key} is a section; set its fields, e.g. {key}.<field>=...")
      setattr(obj, part, value)
    else:
      obj = getattr(obj, part)


def apply_overrides(cfg: Any, overrides: typing.Iterable[str]) -> Any:
  """Applies ``key=value`` strings (as given after ``--config.``) in order; returns ``cfg``."""
  for item in overrides:
    if "=" not in item:
      raise ConfigError(f"override {item!r} must look like key=value, e.g. model.d_model=256")
    key, raw = item.split("=", 1)
    set_dotted(cfg, key.strip(), raw.strip())
  return cfg


def apply_dict(cfg: Any, values: dict[str, Any], prefix: str = "") -> Any:
  """Applies a nested dict (e.g. a saved config) onto ``cfg``, rejecting unknown keys."""
  for k, v in values.items():
    key = f"{prefix}{k}"
    parts = key.split(".")
    target = cfg
    for p in parts[:-1]:
      target = getattr(target, p)
    if isinstance(v, dict) and dataclasses.is_dataclass(getattr(target, parts[-1], None)):
      apply_dict(cfg, v, prefix=f"{key}.")
    else:
      if isinstance(v, list):
        v = tuple(v)
      set_dotted(cfg, key, v)
  return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
  return dataclasses.asdict(cfg)


def to_json(cfg: Any) -> str:
  return json.dumps(to_dict(cfg), indent=2, sort_keys=True)


def check_choice(name: str, value: Any, choices: typing.Iterable[Any]) -> None:
  choices = tuple(choices)
  if value not in choices:
    raise ConfigError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}")


def check_positive(name: str, value: float, allow_zero: bool = False) -> None:
  if value < 0 or (value == 0 and not allow_zero):
    raise ConfigError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
