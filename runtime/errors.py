"""Errors raised at the project's boundaries, each naming what was wrong."""


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
