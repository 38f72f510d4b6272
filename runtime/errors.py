"""Errors raised at the project's boundaries, each naming what was wrong."""

import contextlib
import dataclasses
import math
import threading
import typing
from typing import Any, Iterator


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


class ConfigErrors(ConfigError):
  """Several config fields are invalid; the message names each on its own line (`field` is the first)."""

  def __init__(self, errors: list[ConfigError]):
    ValueError.__init__(self, f"{len(errors)} config fields are invalid:\n" + "\n".join(f"  {e}" for e in errors))
    self.errors = tuple(errors)
    self.field = errors[0].field


_COLLECTING = threading.local()  # the errors `check` found inside `every_error`, this thread's


def check(ok: bool, field: str, value: object, allowed: str) -> None:
  """Raises ConfigError naming `field`, its value and what is allowed, unless `ok` (inside `every_error`, it
  records the error and validation goes on)."""
  if ok:
    return
  error = ConfigError(field, value, allowed)
  found = getattr(_COLLECTING, "errors", None)
  if found is None:
    raise error
  if all(str(e) != str(error) for e in found):
    found.append(error)


@contextlib.contextmanager
def every_error() -> Iterator[None]:
  """Validation inside reports every invalid field at once: the errors `check` found are raised together on leaving
  (one alone as itself). A ConfigError raised directly, or any error that a field already found invalid may have
  caused (a division by an invalid zero), ends the validation with what was found so far."""
  if getattr(_COLLECTING, "errors", None) is not None:  # an enclosing validation collects
    yield
    return
  _COLLECTING.errors = found = []
  try:
    yield
  except ConfigError as error:
    found.append(error)
  except Exception:  # pylint: disable=broad-except
    if not found:
      raise
  finally:
    _COLLECTING.errors = None
  if len(found) == 1:
    raise found[0]
  if found:
    raise ConfigErrors(found)


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
