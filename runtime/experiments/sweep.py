"""Sweeps: one training run per point of a grid (or list) over config fields, each in its own workdir and process.

`--sweep='outer.quorum=1,2,4;inner_steps=10,30'` names the axes; a grid runs every combination, a list pairs the
values position by position. Every point is validated before any runs. Each runs as `python -m launch.train` in
`workdir/<point>/` (so points can run in parallel processes, each with its own simulated devices); a point whose
`results.json` exists finished earlier and is skipped, so an interrupted sweep resumes where it stopped. At the
end one table (`sweep.txt`, `sweep.md`) and one plot (`sweep.png`) compare the points by the varied fields.
"""

import ast
import concurrent.futures
import dataclasses
import itertools
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any, Sequence

import ml_collections

from runtime import cli

from runtime.config import docs as config_docs

from runtime.reporting import metrics

from runtime.reporting import summary
from runtime.config.run import from_config_dict
from runtime.errors import ConfigError, UsageError

KINDS = ("grid", "list")
_REPO = pathlib.Path(__file__).resolve().parent.parent
_SPEC = "FIELD=V1,V2,...;FIELD=V1,V2,... (tuples in brackets: clock.speeds=(1,1,1,2),(1,1,1,1))"


@dataclasses.dataclass(frozen=True)
class Point:
  """One run of the sweep: the value (as typed on a command line) of each varied field."""

  fields: tuple[tuple[str, str], ...]

  @property
  def name(self) -> str:
    return cli.varied(dict(self.fields)) or "base"

  def flags(self) -> list[str]:
    return [f"--config.{field}={value}" for field, value in self.fields]


def _split(values: str) -> list[str]:
  """'1,(1,2),x' -> ['1', '(1,2)', 'x']: commas inside brackets or quotes do not split."""
  parts, depth, quote, current = [], 0, "", []
  for char in values:
    if quote:
      quote = "" if char == quote else quote
    elif char in "'\"":
      quote = char
    elif char in "([{":
      depth += 1
    elif char in ")]}":
      depth -= 1
    elif char == "," and depth == 0:
      parts.append("".join(current).strip())
      current = []
      continue
    current.append(char)
  parts.append("".join(current).strip())
  return [p for p in parts if p]


def parse(spec: str, kind: str = "grid") -> list[Point]:
  """The points of `spec` ('outer.quorum=1,2;inner_steps=10,30'), in order; errors name --sweep."""
  if kind not in KINDS:
    raise UsageError(f"--sweep_kind={kind}: allowed one of {KINDS}")
  axes: dict[str, list[str]] = {}
  for part in filter(None, (p.strip() for p in spec.split(";"))):
    field, eq, values = part.partition("=")
    field = field.strip().removeprefix("--config.").removeprefix("config.")
    if not eq or not field or not _split(values):
      raise UsageError(f"--sweep: {part!r} is not a field and its values; allowed {_SPEC}")
    if field in axes:
      raise UsageError(f"--sweep: field '{field}' is swept twice; allowed each field once: {_SPEC}")
    axes[field] = _split(values)
  if not axes:
    raise UsageError(f"--sweep={spec!r}: no field to sweep; allowed {_SPEC}")
  if kind == "list" and len({len(v) for v in axes.values()}) > 1:
    raise UsageError(f"--sweep with --sweep_kind=list pairs values by position: every field needs as many values "
                     f"({ {f: len(v) for f, v in axes.items()} })")
  rows = itertools.product(*axes.values()) if kind == "grid" else zip(*axes.values())
  return [Point(tuple(zip(axes, row))) for row in rows]


def _typed(old: Any, text: str) -> Any:
  """`text` as the type of the config's current value `old` (as config_flags would read it)."""
  if isinstance(old, bool):
    if text.lower() not in ("true", "false", "1", "0"):
      raise ValueError(text)
    return text.lower() in ("true", "1")
  if isinstance(old, (int, float)) or old is None:
    try:
      return type(old)(text) if old is not None else ast.literal_eval(text)
    except (ValueError, SyntaxError):
      if old is None:
        return text
      raise
  if isinstance(old, tuple):
    return (text,)  # runtime.config.run parses tuple text
  return text.strip("'\"")


def point_config(config: ml_collections.ConfigDict, point: Point) -> ml_collections.ConfigDict:
  """`config` with the point's fields set; an unknown field or a value of the wrong type names the field."""
  config = config.copy_and_resolve_references()
  known = config_docs.flatten(config)
  for field, text in point.fields:
    if field not in known:
      cli.check_overrides([f"--config.{field}={text}"], config)  # raises, with a suggestion
    section, _, leaf = field.rpartition(".")
    owner = config
    for part in filter(None, section.split(".")):
      owner = owner[part]
    try:
      with owner.ignore_type():
        owner[leaf] = _typed(known[field], text)
    except (ValueError, TypeError):
      raise ConfigError(field, text, f"a value of the type of {known[field]!r}") from None
  return config


def record(path: pathlib.Path, config_path: str, base: Sequence[str]) -> None:
  """Writes (or checks) the record at `path`: a workdir holds points of one config and one set of base overrides."""
  record_ = dict(config=config_path, overrides=list(base))
  if path.exists():
    try:
      old = json.loads(path.read_text())
      old = dict(config=old["config"], overrides=old["overrides"])
    except (OSError, ValueError, KeyError, TypeError) as error:
      raise UsageError(f"{path} is damaged ({error}): it says which config and overrides this workdir's points ran "
                       f"with; restore it, or write {json.dumps(record_)} there to go on with these") from None
    if old != record_:
      raise UsageError(f"--workdir={path.parent}: holds points of {old['config']} with overrides {old['overrides']}, "
                       f"not {config_path} with {list(base)}; allowed the same config and overrides (to resume or "
                       "extend it) or a new --workdir")
  path.write_text(json.dumps(record_, indent=2) + "\n")


def restartable(fields: tuple[tuple[str, str], ...], config: ml_collections.ConfigDict) -> tuple[tuple[str, str], ...]:
  """A point's fields, with resume=False when its run keeps no checkpoints: a point interrupted earlier then starts
  over beside its unfinished run (which could not resume) instead of being refused; one with checkpoints resumes."""
  run = from_config_dict(point_config(config, Point(fields)))
  return fields if run.checkpoint_every or run.checkpoint_seconds else (*fields, ("resume", "False"))


def run_points(points: dict[str, tuple[tuple[str, str], ...]], config_path: str, base: Sequence[str],
               workdir: pathlib.Path, parallel: int = 1) -> dict[str, str]:
  """Trains each named point (its fields) in `workdir/<name>/`, `parallel` at a time; returns {name: why} of those
  that failed. Each point's progress is printed as it ends."""
  failed = {}
  with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
    futures = {pool.submit(_run_point, Point(fields).flags(), config_path, base, workdir / name): name
               for name, fields in points.items()}
    for future in concurrent.futures.as_completed(futures):
      name = futures[future]
      status, seconds = future.result()
      if status == 0:
        print(f"{name}: done in {seconds:.0f} s", flush=True)
      else:
        failed[name] = f"exit {status}: {last_line(workdir / name / 'log.txt')}"
        print(f"{name}: FAILED ({failed[name]}); log: {workdir / name / 'log.txt'}", flush=True)
  return failed


def _run_point(flags: Sequence[str], config_path: str, base: Sequence[str], out: pathlib.Path) -> tuple[int, float]:
  """Runs one point as `python -m launch.train` in its own process; returns (exit status, wall seconds)."""
  out.mkdir(parents=True, exist_ok=True)
  command = [sys.executable, "-m", "launch.train", f"--config={config_path}", *base, *flags,
             f"--workdir={out}", "--config.progress=False"]
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_REPO), os.environ.get("PYTHONPATH")]))}
  start = time.perf_counter()
  with (out / "log.txt").open("w", encoding="utf-8") as log:
    log.write(" ".join(command) + "\n")
    log.flush()
    status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, check=False).returncode
  return status, time.perf_counter() - start


def _shown(text: str) -> Any:
  """A swept value for the table: a number when it reads as one (so that it aligns as one), else the text."""
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text
  return value if isinstance(value, (int, float)) and not isinstance(value, bool) else text


def last_line(path: pathlib.Path) -> str:
  lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
  return lines[-1] if lines else ""


def run(config_path: str, config: ml_collections.ConfigDict, base: Sequence[str], points: Sequence[Point],
        workdir: str | os.PathLike, parallel: int = 1) -> list[dict]:
  """Runs every unfinished point (`parallel` at a time), then writes the comparison; returns its rows."""
  workdir = pathlib.Path(workdir)
  for point in points:  # every point is valid before any runs
    from_config_dict(point_config(config, point))
  cli.check_workdir(str(workdir))
  record(workdir / "sweep.json", config_path, base)
  todo = [p for p in points if not (workdir / p.name / summary.RESULTS_FILE).exists()]
  for point in points:
    if point not in todo:
      print(f"{point.name}: finished earlier, skipped", flush=True)
  failed = run_points({p.name: restartable(p.fields, config) for p in todo}, config_path, base, workdir, parallel)
  failed = {p: failed[p.name] for p in points if p.name in failed}
  rows = compare(points, workdir, failed)
  if failed:
    raise SweepFailed(f"{len(failed)} of {len(points)} sweep points failed; see {workdir}/<point>/log.txt")
  return rows


class SweepFailed(RuntimeError):
  """Some points of a sweep did not finish; the message says how many and where their logs are."""


def compare(points: Sequence[Point], workdir: pathlib.Path, failed: dict[Point, str]) -> list[dict]:
  """One table (sweep.txt, sweep.md) and one plot (sweep.png) of every point, by the varied fields."""
  varied = list(dict.fromkeys(f for p in points for f, _ in p.fields))
  rows, curves = [], {}
  for point in points:
    row: dict[str, Any] = {field: _shown(text) for field, text in point.fields}
    results_path = workdir / point.name / summary.RESULTS_FILE
    if point in failed or not results_path.exists():
      row["status"] = f"failed ({failed.get(point, 'no results')})"
    else:
      result = json.loads(results_path.read_text())[-1]  # the point's newest run, if a rerun added one
      row.update(status="done", **{k: v for k, v in result.items() if k not in ("run", "mode")})
      label = ", ".join(f"{f}={v}" for f, v in point.fields)
      curves[label] = metrics.read_jsonl(workdir / point.name / result["run"] / metrics.JSONL_NAME)  # the run tabulated
    rows.append(row)
  columns = list(dict.fromkeys([*varied, "status", *(k for r in rows for k in r)]))
  title = f"sweep over {' × '.join(varied)}: {len(points)} points"
  table = summary.summary_table(rows, columns, title=title)
  (workdir / "sweep.txt").write_text(table + "\n")
  (workdir / "sweep.md").write_text(summary.summary_table(rows, columns, title=title, markdown=True) + "\n")
  if curves:
    summary.plot_curves(curves, workdir / "sweep.png", x=("tokens",), kinds=("eval",),
                        title=f"held-out loss of Θ, sweep over {' × '.join(varied)}")
  print(table)
  print(f"outputs in {workdir}/: sweep.txt, sweep.md (the table), sweep.png (eval loss per point), "
        "<point>/ (each run's workdir and log.txt)")
  return rows
