"""Errors raised at the project's boundaries, each naming what was wrong."""

import dataclasses
import math
import typing
from typing import Any


class ConfigError(ValueError):
  """A config field has a value outside what it allows; the message names the field."""

  def __init__(self, field: str, value: object, allowed: str):
    super().__init__(f"config field '{field}' = {value!r} is invalid: allowed {allowed}")
    self.field = field


class DataError(ValueError):
  """The corpus or a data position cannot be used; the message says which and why."""


class TrainingDiverged(RuntimeError):
  """Training cannot go on: the message says what diverged and which config field most likely caused it."""


class ProgramError(RuntimeError):
  """Training cannot go on: every learner stopped on a program error (no lost slice); the message names them."""


def check(ok: bool, field: str, value: object, allowed: str) -> None:
  """Raises ConfigError naming `field`, its value and what is allowed, unless `ok`."""
  if not ok:
    raise ConfigError(field, value, allowed)


class UsageError(ValueError):
  """A command-line flag, path or sweep cannot be used; the message names it and what is allowed."""


TYPE_NAMES = {int: "an integer", float: "a finite number", bool: "True or False", str: "a string"}


def check_types(section: Any, prefix: str) -> None:
  """Every scalar field holds its declared type (floats finite; None only where the type allows it)."""
  for f in dataclasses.fields(section):
    value, name = getattr(section, f.name), f"{prefix}{f.name}"
    kinds = [k for k in (typing.get_args(f.type) or (f.type,)) if k in TYPE_NAMES]
    if not kinds or typing.get_origin(f.type) is tuple or (value is None and type(None) in typing.get_args(f.type)):
      continue
    allowed = " or ".join(TYPE_NAMES[k] for k in kinds) + (" or None" if type(None) in typing.get_args(f.type) else "")
    ok = any(isinstance(value, k) and (k is bool or not isinstance(value, bool)) for k in kinds)
    ok = ok or (float in kinds and isinstance(value, int) and not isinstance(value, bool))
    check(ok and (not isinstance(value, float) or math.isfinite(value)), name, value, allowed)
