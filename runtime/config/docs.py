"""What each config field means, read from the config files' own comments, and the `--help` text built on it."""

import ast
import pathlib
import re
import textwrap
from typing import Any

import ml_collections

_ASSIGN = re.compile(r"^\s*config((?:\.\w+)+)\s*=\s*(.*)$")
_BASE_IMPORT = re.compile(r"^\s*from configs import (\w+)\s*$")


def _inline_comment(code: str) -> str:
  """The `# ...` comment that ends a line of code, if any (a `#` inside a string literal is not one)."""
  for i, char in enumerate(code):
    if char == "#":
      try:
        ast.parse(code[:i].strip() or "0")
      except SyntaxError:
        continue
      return code[i + 1:].strip()
  return ""


def field_docs(path: str | pathlib.Path) -> dict[str, str]:
  """Dotted field -> meaning, from the comment block above each `config.x = ...` line (or its inline comment).

  Consecutive assignments under one comment share it; the files a config builds on (`from configs import
  default`) are read first and keep their meaning, so a derived file's comments only fill gaps.
  """
  path = pathlib.Path(path)
  lines = path.read_text(encoding="utf-8").splitlines()
  docs: dict[str, str] = {}
  for line in lines:
    base = _BASE_IMPORT.match(line)
    if base and (path.parent / f"{base.group(1)}.py").exists():
      docs.update(field_docs(path.parent / f"{base.group(1)}.py"))
  own: dict[str, str] = {}
  block: list[str] = []
  shared = ""
  for line in lines:
    stripped = line.strip()
    assign = _ASSIGN.match(line)
    if stripped.startswith("#"):
      block.append(stripped.lstrip("#").strip())
      shared = ""
    elif assign:
      if block:
        shared, block = " ".join(block), []
      field, rest = assign.group(1)[1:], assign.group(2)
      if "ConfigDict()" not in rest:
        own[field] = _inline_comment(rest) or shared
    else:
      block, shared = [], ""
  return {**docs, **{k: v for k, v in own.items() if v and k not in docs}}  # the base's order first


def flatten(config: ml_collections.ConfigDict, prefix: str = "") -> dict[str, Any]:
  """Dotted field -> value for every leaf of `config`, in the config's order."""
  out: dict[str, Any] = {}
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def help_text(config: ml_collections.ConfigDict, path: str | pathlib.Path) -> str:
  """Every field of `config` with its value and meaning, grouped by section as the config is."""
  docs = field_docs(path)
  values = flatten(config)
  order = {field: i for i, field in reversed(list(enumerate([*docs, *values])))}  # first appearance wins
  groups: dict[str, list[str]] = {"top level": []}
  for field in sorted(values, key=order.__getitem__):
    groups.setdefault(field.rpartition(".")[0] or "top level", []).append(field)
  lines = [f"Config fields of {path} (set any with --config.FIELD=VALUE):"]
  for group, fields in groups.items():
    lines += ["", f"  [{group}]"]
    for field in fields:
      lines.append(f"  --config.{field}={values[field]!r}")
      lines += textwrap.wrap(docs.get(field, "(undocumented)"), 110, initial_indent=" " * 6, subsequent_indent=" " * 6)
  return "\n".join(lines)
