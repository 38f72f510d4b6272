"""The schedule language of faults.schedule and capacity.schedule: ';'-separated items `kind:key=value,...`.

One parser for both; each caller gives its kinds, their fields' types and its wording, then checks whole items.
"""

from typing import Any, Callable, Mapping

from runtime.errors import ConfigError


def _no_problem(key: str, value: Any) -> None:
  return None


def parse(text: str, field: str, kinds: Mapping[str, Mapping[str, type]], kind_noun: str, type_error: str,
          problem: Callable[[str, Any], str | None] = _no_problem) -> list[tuple[str, dict[str, Any], str]]:
  """(kind, {key: typed value}, item text) of each item, in order; errors name `field` and what is allowed.

  `kind_noun` names an item kind ('a fault kind'); `type_error` is what a value that does not convert needs, with
  {key} and {type} filled in; `problem(key, value)` is what a converted value needs, or None when it is allowed.
  """
  items = []
  for item in filter(None, (part.strip() for part in text.split(";"))):
    kind, _, args = item.partition(":")
    kind = kind.strip()
    if kind not in kinds:
      raise ConfigError(field, item, f"{kind_noun} in {tuple(kinds)}")
    values = {}
    for pair in filter(None, (p.strip() for p in args.split(","))):
      key, _, raw = pair.partition("=")
      key = key.strip()
      if key not in kinds[kind]:
        raise ConfigError(field, item, f"{kind} fields {list(kinds[kind])}")
      try:
        values[key] = kinds[kind][key](raw.strip())
      except ValueError:
        raise ConfigError(field, item, type_error.format(key=key, type=kinds[kind][key].__name__)) from None
      needs = problem(key, values[key])
      if needs is not None:
        raise ConfigError(field, item, needs)
    items.append((kind, values, item))
  return items
