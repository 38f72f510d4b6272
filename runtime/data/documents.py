"""Documents of a text input: whole plain-text files, and the lines of JSONL files, cut into shard-sized pieces.

The input (`stdlib`, a file, a directory or a glob, as `data.path` accepts) is listed in sorted order. A plain
text file is one document; a `.jsonl` file holds one document per line, its text in a field. Work is planned
as shards of about `shard_bytes` of input each: text files whole, JSONL files cut at byte offsets (a line belongs
to the piece its first byte is in), so one large JSONL file is still prepared by many workers. Each document
has a stable identity (its relative path, or path and byte offset), which decides its split.
"""

import dataclasses
import json
import pathlib
from typing import Iterator

from runtime.data import corpus
from runtime.errors import DataError

JSONL_SUFFIX = ".jsonl"


@dataclasses.dataclass(frozen=True)
class Piece:
  """Bytes [start, end) of one input file: a whole text file, or a run of a JSONL file's lines."""

  path: str
  relative: str
  start: int
  end: int

  @property
  def jsonl(self) -> bool:
    return self.path.endswith(JSONL_SUFFIX)


@dataclasses.dataclass
class Reading:
  """What reading pieces met besides documents: JSONL lines without text, dropped by --skip_bad_lines."""

  bad_lines: int = 0
  first_bad: str = ""


def plan(input_path: str, shard_bytes: int) -> list[list[Piece]]:
  """The input as shards of pieces, in input order; each shard about `shard_bytes` of input."""
  root, files = corpus.resolve(input_path, field="--input")
  shards: list[list[Piece]] = [[]]
  filled = 0
  for file in files:
    size = file.stat().st_size
    relative = file.relative_to(root).as_posix()
    step = shard_bytes if file.name.endswith(JSONL_SUFFIX) else size
    for start in range(0, size, max(step, 1)):
      if filled >= shard_bytes:
        shards.append([])
        filled = 0
      end = min(start + step, size)
      shards[-1].append(Piece(str(file), relative, start, end))
      filled += end - start
  return shards


def documents(piece: Piece, text_field: str, skip_bad_lines: bool, reading: Reading) -> Iterator[tuple[str, bytes]]:
  """(identity, text as UTF-8 bytes) of each document in `piece`, in order."""
  if not piece.jsonl:
    with open(piece.path, "rb") as f:
      yield piece.relative, f.read()
    return
  with open(piece.path, "rb") as f:
    offset = piece.start
    if offset > 0:  # the line that starts before this piece belongs to the previous one
      f.seek(offset - 1)
      offset += len(f.readline()) - 1
    while offset < piece.end:
      line = f.readline()
      if not line:
        return
      text = _text(line, text_field)
      if isinstance(text, str):
        if text:
          yield f"{piece.relative}@{offset}", text.encode("utf-8")
      elif line.strip():
        where = f"{piece.path}:{_line_number(piece.path, offset)}"
        if not skip_bad_lines:
          raise DataError(f"{where}: {text}; fix the line, or pass --skip_bad_lines to drop such lines")
        reading.bad_lines += 1
        reading.first_bad = reading.first_bad or where
      offset += len(line)


def _text(line: bytes, text_field: str) -> str | object:
  """The line's text, or a description (not a str) of why it has none."""
  try:
    record = json.loads(line)
  except (ValueError, UnicodeDecodeError) as error:
    return _Why(f"not a JSON object ({error})")
  if not isinstance(record, dict):
    return _Why(f"not a JSON object (a {type(record).__name__})")
  if text_field not in record:
    return _Why(f"no field {text_field!r} (its fields: {sorted(record)[:8]}); choose one with --text_field")
  if not isinstance(record[text_field], str):
    return _Why(f"field {text_field!r} is a {type(record[text_field]).__name__}, not text")
  return record[text_field]


class _Why:
  """Why a JSONL line has no document: not a str, so never mistaken for a document's text."""

  def __init__(self, reason: str):
    self.reason = reason

  def __str__(self) -> str:
    return self.reason


def _line_number(path: str, offset: int) -> int:
  """The 1-based line that starts at byte `offset` (counted only when a line is reported)."""
  with open(path, "rb") as f:
    return f.read(offset).count(b"\n") + 1


def input_bytes(shards: list[list[Piece]]) -> int:
  return sum(p.end - p.start for shard in shards for p in shard)


def signature(shards: list[list[Piece]]) -> list[list]:
  """What a resumed preparation must find unchanged: every piece's file, range and the file's size and mtime."""
  return [[[p.relative, p.start, p.end, pathlib.Path(p.path).stat().st_mtime_ns] for p in shard] for shard in shards]
