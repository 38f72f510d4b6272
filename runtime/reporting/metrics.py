"""Metrics records: one JSON line each, mirrored to TensorBoard and a token progress bar.

Non-finite numbers are written as the JSON extensions `NaN`, `Infinity` and `-Infinity`
(`json.dumps` with `allow_nan=True`): a diverged loss keeps its value instead of becoming `null`
or a string, and `read_jsonl` (`json.loads`) reads them back as floats. Strict JSON parsers
reject these literals; Python, pandas and TensorBoard tooling accept them.

Every record carries `wall_time`, the Unix time (seconds) it was logged at. A record's `time` is the
run's clock: modeled seconds under the virtual clock, wall seconds since the start under the real one.
"""

from __future__ import annotations

import json
import operator
import os
import pathlib
import re
import sys
import time
from collections.abc import Mapping
from typing import Protocol

import numpy as np
import tqdm

from runtime.errors import DataError

Value = float | int | bool | str | list
TIME_KINDS = ("modeled", "wall")  # what a record's `time` measures
JSONL_NAME = "metrics.jsonl"
_RESERVED = ("kind", "wall_time")  # keys the logger sets
_WALL_TIME = re.compile(r', "wall_time": [0-9.e+-]+(?=}$)', re.MULTILINE)  # as the logger writes it, last


def _to_python(key: str, value: object) -> Value:
  """Returns `value` as a JSON-ready Python value, or raises TypeError naming `key`."""
  if isinstance(value, str):
    return value
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  if isinstance(value, (list, tuple)):
    return [_to_python(key, item) for item in value]
  try:
    return operator.index(value)
  except TypeError:
    pass
  if hasattr(value, "__float__"):
    return float(value)
  raise TypeError(
      f"metric '{key}' = {value!r} is a {type(value).__name__}: allowed numbers, strings or lists"
  )


class _Sink(Protocol):
  """Somewhere a finished record goes."""

  def write(self, record: Mapping[str, Value]) -> None: ...

  def close(self) -> None: ...


class _JsonlFile:
  """Writes records to a JSON-lines file, flushed per record so a crash loses none.

  A fresh run starts the file afresh; a resumed one first rewrites it with the records it keeps (atomically),
  then appends.
  """

  def __init__(self, path: pathlib.Path, kept: list[Mapping[str, Value]] | None = None):
    path.parent.mkdir(parents=True, exist_ok=True)
    if kept is not None:
      tmp = path.with_suffix(".jsonl.tmp")
      tmp.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in kept), encoding="utf-8")
      tmp.replace(path)
    self._file = path.open("a" if kept is not None else "w", encoding="utf-8")

  def write(self, record: Mapping[str, Value]) -> None:
    try:
      self._file.write(json.dumps(record, allow_nan=True) + "\n")
      self._file.flush()
    except OSError as error:  # (a write names no file: the error says which)
      raise OSError(error.errno, error.strerror, self._file.name) from error

  def close(self) -> None:
    try:
      self._file.close()
    except OSError as error:
      raise OSError(error.errno, error.strerror, self._file.name) from error


class _TensorBoard:
  """Writes a record's numbers as scalars `kind/key` at the record's tokens (else step) and wall time."""

  def __init__(self, logdir: pathlib.Path, purge_step: int | None = None):
    # Imported here: tensorboardX loads protobuf, which in-memory loggers do not need.
    from tensorboardX import SummaryWriter

    # A resumed run purges the events it logged after its checkpoint: TensorBoard shows one run.
    self._writer = SummaryWriter(logdir=str(logdir), purge_step=purge_step)

  def write(self, record: Mapping[str, Value]) -> None:
    kind = record["kind"]
    step = record.get("tokens", record.get("step"))
    for key, value in record.items():
      if isinstance(value, (int, float)) and key not in _RESERVED:
        self._writer.add_scalar(f"{kind}/{key}", float(value), global_step=step, walltime=record["wall_time"])

  def close(self) -> None:
    self._writer.close()


class _TokenProgress:
  """A tqdm bar on stderr that counts tokens: "compiling" until the first step lands, then loss, real tokens per wall
  second (since that first step), tokens per modeled second under the virtual clock (labelled so), eval loss."""

  def __init__(self, total_tokens: int, time_kind: str):
    self._modeled = time_kind == "modeled"
    self._first: tuple[float, int] | None = None  # (wall time, tokens) of the first training record
    self._bar = tqdm.tqdm(
        total=total_tokens,
        desc="compiling",
        unit="tok",
        unit_scale=True,
        dynamic_ncols=True,
        file=sys.stderr,
        bar_format="{desc}{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]",
    )
    self._postfix: dict[str, str] = {}

  def write(self, record: Mapping[str, Value]) -> None:
    kind = record["kind"]
    tokens = record.get("tokens")
    if kind in ("train", "merge") and isinstance(tokens, int):
      if self._first is None:
        self._first = (record["wall_time"], tokens)
        self._bar.set_description_str("", refresh=False)
      if isinstance(record.get("loss"), (int, float)):
        self._postfix["loss"] = f"{record['loss']:.4g}"
      wall = record["wall_time"] - self._first[0]
      if wall > 0:
        self._postfix["tok/s"] = tqdm.tqdm.format_sizeof((tokens - self._first[1]) / wall)
      seconds = record.get("time")
      if self._modeled and isinstance(seconds, (int, float)) and seconds > 0:
        self._postfix["modeled tok/s"] = tqdm.tqdm.format_sizeof(tokens / seconds)
      self._bar.set_postfix(self._postfix, refresh=False)
      # Records may arrive out of order across learners; the bar never moves back.
      self._bar.update(max(0, tokens - self._bar.n))
    elif kind == "eval" and isinstance(record.get("eval_loss"), (int, float)):
      self._postfix["eval_loss"] = f"{record['eval_loss']:.4g}"
      self._bar.set_postfix(self._postfix)

  def close(self) -> None:
    self._bar.close()


class MetricsLogger:
  """Keeps every metrics record in memory and forwards it to the file, TensorBoard and bar sinks."""

  def __init__(
      self,
      workdir: str | os.PathLike | None,
      *,
      run: str = "run",
      total_tokens: int | None = None,
      progress: bool = True,
      tensorboard: bool = True,
      time_kind: str = "modeled",
      resume_after: int | None = None,
      keep_records: int | None = None,
  ):
    """`time_kind` says what the records' `time` measures ("modeled" or "wall"); the bar's tok/s shows it.

    `resume_after`: the run resumes from a checkpoint taken at this many tokens; the records the file holds up to
    there are kept (and returned by `records`), later ones are dropped, as are TensorBoard's later events.
    `keep_records`: with `resume_after`, keep the file's first `keep_records` records instead (a checkpoint that
    counted the records written before it).
    """
    if time_kind not in TIME_KINDS:
      raise ValueError(f"MetricsLogger: time_kind={time_kind!r}: allowed {list(TIME_KINDS)}")
    self._records: list[dict[str, Value]] = []
    self._sinks: list[_Sink] = []
    self._closed = False
    if workdir is not None:
      run_dir = pathlib.Path(workdir) / run
      kept = None
      if resume_after is not None:
        old, torn = read_records(run_dir / JSONL_NAME) if (run_dir / JSONL_NAME).exists() else ([], "")
        if torn:  # the rewrite below drops it from the file too
          print(f"{run_dir / JSONL_NAME}: {torn}; left out, and the file repaired", file=sys.stderr, flush=True)
        if keep_records is not None:
          kept = old[:keep_records]
        else:
          kept = [r for r in old if isinstance(r.get("tokens"), int) and r["tokens"] <= resume_after]
        self._records = kept
      self._sinks.append(_JsonlFile(run_dir / JSONL_NAME, kept))
      if tensorboard:
        self._sinks.append(_TensorBoard(run_dir / "tb", None if resume_after is None else resume_after + 1))
    if progress and total_tokens is not None:
      self._sinks.append(_TokenProgress(total_tokens, time_kind))

  @property
  def records(self) -> list[dict[str, Value]]:
    """Every record logged so far, oldest first."""
    return list(self._records)

  def log(self, kind: str, values: Mapping[str, object]) -> dict[str, Value]:
    """Appends and returns the record `{"kind": kind, **values, "wall_time": now}`, values as plain Python."""
    if self._closed:
      raise RuntimeError(f"MetricsLogger is closed; cannot log a {kind!r} record")
    for key in _RESERVED:
      if key in values:
        raise ValueError(f"metric key '{key}' is reserved: the logger sets it (record kind {kind!r})")
    record: dict[str, Value] = {"kind": kind}
    record.update((key, _to_python(key, value)) for key, value in values.items())
    record["wall_time"] = time.time()
    self._records.append(record)
    for sink in self._sinks:
      sink.write(record)
    return record

  def close(self) -> None:
    """Closes every sink (each tried, the first error raised after); later calls do nothing."""
    if self._closed:
      return
    self._closed, first = True, None
    for sink in self._sinks:
      try:
        sink.close()
      except Exception as error:  # pylint: disable=broad-except
        first = first or error
    if first is not None:
      raise first

  def __enter__(self) -> MetricsLogger:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.close()


def without_wall_time(text: str) -> str:
  """metrics.jsonl text with each record's `wall_time` removed: what reruns under the virtual clock reproduce."""
  return _WALL_TIME.sub("", text)


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Value]]:
  """Reads the records of a metrics.jsonl file, NaN and infinities included; a torn last line is left out."""
  return read_records(path)[0]


def read_records(path: str | os.PathLike) -> tuple[list[dict[str, Value]], str]:
  """(the records of a metrics.jsonl file, what was left out: '' or its torn last line, described).

  The file is append-only and flushed per record, so a process that died mid-write (power lost) leaves at most its
  last line cut short: that line is left out. Any other line that is not a record, or a file that cannot be read,
  is a DataError naming the file, the line and what to do.
  """
  path = pathlib.Path(path)
  try:
    lines = path.read_text(encoding="utf-8").splitlines()
  except (OSError, UnicodeDecodeError) as error:
    raise DataError(f"{path}: cannot be read as the run's records ({error}); move it aside (the run's checkpoints "
                    "and model do not depend on it) or restore it") from None
  records, torn = [], ""
  numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
  for i, (n, line) in enumerate(numbered):
    try:
      record = json.loads(line)
      if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    except ValueError as error:
      if i == len(numbered) - 1:
        torn = f"its last line ({n}) was cut short ({len(line)} characters: {error})"
        break
      raise DataError(f"{path}: line {n} is not a record ({error}): the file is damaged beyond its last line; move "
                      "it aside to resume without the records before the checkpoint (training does not need them), "
                      "or restore it") from None
    records.append(record)
  return records, torn
