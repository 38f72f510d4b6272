"""The asynchrony study: a grid of runs whose rows go into a tracked file one by one, so it runs in pieces.

A cell is one run: a setting (a config, e.g. configs/scaling.py:heterogeneity or :chaos, with the command line's
--config overrides) × model size × merge policy (launch.heterogeneity's variants) × rounds.length × outer.rule ×
outer.outer_grad_base × seed. When a cell finishes, its row (its key, its figures, and its eval curve, from which the
time to another run's loss is read) is appended to the rows file; a cell whose row is there is skipped, so the study
is stopped and resumed at will and its rows committed as they come (docs/results/asynchrony.md).

The table compares each cell with the K=M cell of its group (the same key but the policy, and the rule where there
is one: at K=M every merge holds the whole round, so the rules coincide), at equal tokens and in modeled time to
K=M's final eval loss.
"""

import dataclasses
import json
import math
import os
import pathlib
from typing import Iterator, Sequence

import ml_collections
import numpy as np
from absl import logging

from runtime.config.run import RunConfig, from_config_dict, with_fields
from runtime.errors import UsageError
from runtime.experiments import heterogeneity
from runtime.experiments.modes import prepare, train_one
from runtime.reporting import provenance, summary
from runtime.train.harness import Experiment, RunResult

# Model sizes with the inner learning rate and global batch the heterogeneity runs use at each (docs/results/
# asynchrony.md); "small" is the scaling configs' own M=4 point.
SIZES = {"tiny": {"model.size": "tiny", "data.batch_size": 8, "inner.lr": 0.006}, "small": {"model.size": "small"}}
KEY = ("setting", "overrides", "size", "variant", "length", "rule", "base", "seed")
COLUMNS = ("setting", "overrides", "size", "length", "rule", "base", "variant", "seeds", "eval_loss", "vs_K=M_%",
           "modeled_s_to_K=M_loss", "K=M_modeled_s", "learners_per_merge", "gathered", "goodput")


@dataclasses.dataclass(frozen=True)
class Grid:
  """The axes of a study; every combination is a cell."""

  sizes: tuple[str, ...] = ("tiny",)
  variants: tuple[str, ...] = ("K=M", "K=1+grace")
  lengths: tuple[str, ...] = ("steps", "time")
  rules: tuple[str, ...] = ("nesterov",)
  bases: tuple[str, ...] = ("current",)
  seeds: tuple[int, ...] = (0,)

  def cells(self, setting: str, overrides: str) -> Iterator[dict]:
    for size in self.sizes:
      for seed in self.seeds:
        for length in self.lengths:
          for base in self.bases:
            for rule in self.rules:
              for variant in self.variants:
                yield dict(setting=setting, overrides=overrides, size=size, variant=variant, length=length, rule=rule,
                           base=base, seed=seed)

  def check(self) -> None:
    """Every axis value allowed (one line naming the flag otherwise)."""
    for flag, values, allowed in (("sizes", self.sizes, SIZES), ("variants", self.variants, heterogeneity.VARIANTS)):
      for value in values:
        if value not in allowed:
          raise UsageError(f"--{flag}: {value!r} is not allowed: allowed a comma-separated list of {list(allowed)}")


def sized(config: ml_collections.ConfigDict, size: str) -> ml_collections.ConfigDict:
  """The setting's config at one model size (before it is resolved: the token budget follows the size)."""
  config = ml_collections.ConfigDict(config.to_dict())
  for dotted, value in SIZES[size].items():
    section, _, field = dotted.rpartition(".")
    (config[section] if section else config)[field] = value
  return config


def cell_run(config: ml_collections.ConfigDict, cell: dict) -> RunConfig:
  """The run of one cell: the setting at its size, under its policy (heterogeneity.variant_config) and seed, with
  its round length, rule and outer-gradient base."""
  policy = heterogeneity.variant_config(from_config_dict(sized(config, cell["size"])), cell["variant"], cell["seed"])
  return with_fields(policy, {"rounds.length": cell["length"], "outer.rule": cell["rule"],
                              "outer.outer_grad_base": cell["base"]})


def setting_name(config_file: str) -> str:
  """A config file (with its :variant) as the rows name it: relative to the repository when inside it."""
  path, colon, variant = config_file.partition(":")
  repo = pathlib.Path(__file__).resolve().parents[2]
  resolved = pathlib.Path(path).resolve()
  shown = resolved.relative_to(repo).as_posix() if resolved.is_relative_to(repo) else str(resolved)
  return shown + colon + variant


def key_of(row: dict) -> tuple:
  return tuple(row[k] for k in KEY)


def read_rows(path: str | os.PathLike) -> list[dict]:
  """The rows file's rows; a last line cut short by a kill is ignored (its cell runs again)."""
  path = pathlib.Path(path)
  if not path.exists():
    return []
  rows = []
  for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      logging.warning("%s:%d is not a whole row (a run stopped while writing it?): skipped", path, number)
  return rows


def append_row(path: str | os.PathLike, row: dict) -> None:
  """Appends one row as one line, flushed to disk before returning; a last line cut short by a kill (no newline)
  is dropped first."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with path.open("a+b") as f:
    end = f.seek(0, os.SEEK_END)
    if end:
      f.seek(0)
      text = f.read()
      if not text.endswith(b"\n"):
        f.truncate(text.rfind(b"\n") + 1)
        logging.warning("%s: dropped its last line, cut short (a run stopped while writing it)", path)
    f.seek(0, os.SEEK_END)
    f.write((json.dumps(row, allow_nan=True) + "\n").encode())
    f.flush()
    os.fsync(f.fileno())


def row_of(cell: dict, result: RunResult) -> dict:
  """A finished cell's row: its key, figures, the code it ran and its eval curve (modeled s, loss)."""
  extras = result.extras
  curve = [[r["time"], r["eval_loss"]] for r in result.records if r["kind"] == "eval"]
  return dict(cell, eval_loss=result.final_eval_loss, tokens=result.tokens, modeled_s=result.virtual_seconds,
              goodput=extras["goodput"], busy_min=extras["busy_min"], learners_per_merge=extras["learners_per_merge"],
              gathered=extras["gathered"], merges=extras["merges"], wall_s=result.wall_seconds, commit=provenance.git_commit(),
              curve=curve)


def run(config: ml_collections.ConfigDict, workdir: str | os.PathLike | None, rows_path: str | os.PathLike,
        setting: str, overrides: str, grid: Grid, table_only: bool = False, markdown: bool = False) -> list[dict]:
  """Runs every cell of `grid` whose row is not in `rows_path` yet (none with `table_only`), appending each row as it
  finishes; returns and prints (as Markdown with `markdown`) the table of the grid's cells that have rows.
  `workdir`: the rows file's directory (the runs keep no directory of their own)."""
  del workdir
  grid.check()
  done = {key_of(r) for r in read_rows(rows_path)}
  cells = list(grid.cells(setting, overrides))
  todo = [] if table_only else [c for c in cells if key_of(c) not in done]
  logging.info("asynchrony study: %d cells, %d with rows already in %s", len(cells), len(cells) - len(todo), rows_path)
  if todo:
    prepare(sized(config, todo[0]["size"]))  # simulated devices, once, before JAX starts
  for i, cell in enumerate(todo):
    run_cfg = cell_run(config, cell)
    name = " ".join(f"{k}={cell[k]}" for k in KEY[2:])
    logging.info("asynchrony study: cell %d of %d: %s", i + 1, len(todo), name)
    append_row(rows_path, row_of(cell, train_one(run_cfg, Experiment(run_cfg), None, name)))
  table = tabulate(read_rows(rows_path), {key_of(c) for c in cells})
  print(summary.summary_table(table, COLUMNS, title=None if markdown else f"asynchrony study: {rows_path}",
                              markdown=markdown))
  return table


def tabulate(rows: Sequence[dict], keys: set[tuple] | None = None) -> list[dict]:
  """One line per group of cells differing only in seed (their means), with K=M's loss and time beside them."""
  rows = [r for r in rows if keys is None or key_of(r) in keys]
  groups: dict[tuple, list[dict]] = {}
  for r in rows:
    groups.setdefault(tuple(r[k] for k in KEY if k != "seed"), []).append(r)
  table = []
  for group_key, members in groups.items():
    group = dict(zip([k for k in KEY if k != "seed"], group_key))
    vs, reach, ref_times = [], [], []
    for r in members:
      ref = _reference(rows, r)
      if ref is None:
        continue
      vs.append(100 * (r["eval_loss"] / ref["eval_loss"] - 1))
      reach.append(_time_to(r["curve"], ref["eval_loss"]))
      ref_times.append(_time_to(ref["curve"], ref["eval_loss"]))
    mean = lambda key: float(np.mean([r[key] for r in members]))
    table.append(dict(group, seeds=len(members), eval_loss=mean("eval_loss"),
                      **{"vs_K=M_%": float(np.mean(vs)) if vs else math.nan,
                         "modeled_s_to_K=M_loss": float(np.mean(reach)) if reach else math.nan,
                         "K=M_modeled_s": float(np.mean(ref_times)) if ref_times else math.nan},
                      learners_per_merge=mean("learners_per_merge"), gathered=mean("gathered"),
                      goodput=mean("goodput")))
  order = {k: i for i, k in enumerate(heterogeneity.VARIANTS)}
  return sorted(table, key=lambda t: (t["setting"], t["overrides"], t["size"], t["length"], t["base"], t["rule"],
                                      order.get(t["variant"], len(order))))


def _reference(rows: Sequence[dict], row: dict) -> dict | None:
  """The K=M row of `row`'s group: its own rule's if there is one, else any rule's."""
  same = [r for r in rows if r["variant"] == "K=M" and
          all(r[k] == row[k] for k in KEY if k not in ("variant", "rule"))]
  return next((r for r in same if r["rule"] == row["rule"]), same[0] if same else None)


def _time_to(curve: Sequence[Sequence[float]], target: float) -> float:
  """Modeled seconds until the eval loss is first at or below `target` (NaN if never)."""
  return next((t for t, loss in curve if loss <= target), math.nan)
