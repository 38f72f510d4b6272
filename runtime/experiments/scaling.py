"""The scaling study: DiLoCo's eval-loss gap to data-parallel at equal tokens, across model sizes and learner counts.

For each model size (a preset of models/config.py) at the config's budget (`tokens_per_param`): DP at each inner
learning rate and global batch of a small grid, the best kept; then for each M, DiLoCo (the config's mode) at each
outer learning rate and momentum of a grid, with DP's best global batch and inner learning rate (times each of
`inner_lr_factors`), the best kept. Extra seeds rerun only the best of each (DP and every M). Every run is one point, trained as `python -m
launch.train` in its own process and directory; a point whose results exist is skipped, so a study stopped at any
moment resumes, and a later invocation with other sizes or grids adds to the same workdir. The table is built from
every finished point there: eval loss, gap % to DP (per seed, then averaged), the best settings, tokens, merges,
and the anchor's gaps beside ours.
"""

import dataclasses
import json
import math
import os
import pathlib
from typing import Sequence

import ml_collections
import numpy as np

from models.config import SIZES
from runtime.config.run import from_config_dict
from runtime.errors import DataError, UsageError
from runtime.experiments import sweep
from runtime.reporting import summary

# Charles et al. 2025, "Scaling Laws for DiLoCo" (arXiv 2503.09799), Table 4: eval-loss gap of DiLoCo to DP in %,
# at 20 tokens per parameter, H=30, outer Nesterov with a tuned learning rate; parameters -> {M: gap}.
ANCHOR = {35e6: {1: -0.1, 2: 0.7, 4: 2.0, 8: 3.9}, 90e6: {1: -0.1, 2: 0.5, 4: 1.5, 8: 3.1},
          550e6: {1: -0.3, 2: 0.2, 4: 0.7}}
GRID_COLUMNS = ("size", "M", "seed", "outer_lr", "outer_momentum", "inner_lr", "batch", "eval_loss", "gap_%")
STUDY_FILE = "study.json"
POINT_FILE = "point.json"
# How launch.train ends a run whose syncer stopped it (runtime/diloco/sync/syncer.py, then cli.guarded's one line).
DIVERGED_LINE = "error: training diverged"
DIVERGED_FILE = "diverged.txt"  # a point whose run diverged: finished, with no loss (the line it ended with)
COLUMNS = ("size", "params", "M", "eval_loss", "gap_%", "gap_range_%", "outer_lr", "outer_momentum", "inner_lr",
           "batch", "tokens", "merges", "runs", "seeds")


@dataclasses.dataclass(frozen=True)
class Point:
  """One run of the study. learners == 0 is DP; seed 0 runs the grids, other seeds only the best settings."""

  size: str
  learners: int
  inner_lr: float
  batch_size: int  # global: DiLoCo's learners share it
  seed: int
  outer_lr: float = 0.0
  outer_momentum: float = 0.0

  @property
  def name(self) -> str:
    what = "dp" if not self.learners else f"M={self.learners},olr={self.outer_lr:g},mom={self.outer_momentum:g}"
    return f"{self.size}/{what},lr={self.inner_lr:g},B={self.batch_size},seed={self.seed}"

  def fields(self, num_devices: int) -> tuple[tuple[str, str], ...]:
    """The config fields this point sets, as a command line types them: DP on one mesh of the config's devices,
    DiLoCo with one device per learner."""
    fields = {"model.size": self.size, "inner.lr": repr(self.inner_lr), "data.batch_size": str(self.batch_size),
              "seed": str(self.seed)}
    if self.learners:
      fields.update({"learners": str(self.learners), "num_devices": str(self.learners),
                     "outer.lr": repr(self.outer_lr), "outer.momentum": repr(self.outer_momentum)})
    else:
      fields.update({"mode": "dp", "learners": "1", "num_devices": str(num_devices)})
    return tuple(fields.items())


@dataclasses.dataclass(frozen=True)
class Grid:
  """What the study tries at each size."""

  sizes: tuple[str, ...]
  learners: tuple[int, ...] = (1, 2, 4, 8)
  outer_lrs: tuple[float, ...] = (0.4, 0.6, 0.8, 1.0)
  outer_momenta: tuple[float, ...] = (0.6, 0.9)
  dp_lrs: tuple[float, ...] = (3e-3, 6e-3, 1.2e-2)
  inner_lr_factors: tuple[float, ...] = (1.0,)
  batch_sizes: tuple[int, ...] = ()  # DP's global batches tried (none: the config's); DiLoCo takes DP's best
  seeds: tuple[int, ...] = (0,)

  def check(self) -> None:
    unknown = [s for s in self.sizes if s not in SIZES]
    if unknown:
      raise UsageError(f"--sizes: {unknown} are not model sizes; allowed names from {sorted(SIZES)}")
    if 0 not in self.seeds:
      raise UsageError(f"--seeds={list(self.seeds)}: seed 0 runs the grids the other seeds take their best from; "
                       "allowed a list that holds 0")
    for flag, values in (("learners", self.learners), ("outer_lrs", self.outer_lrs), ("dp_lrs", self.dp_lrs),
                         ("inner_lr_factors", self.inner_lr_factors), ("batch_sizes", self.batch_sizes or (1,))):
      if not values or min(values) <= 0:
        raise UsageError(f"--{flag}={list(values)}: allowed a non-empty list of positive numbers")
    if not self.outer_momenta or not all(0 <= m < 1 for m in self.outer_momenta):
      raise UsageError(f"--outer_momenta={list(self.outer_momenta)}: allowed a non-empty list in [0, 1)")


def run(config_path: str, config: ml_collections.ConfigDict, base: Sequence[str], grid: Grid,
        workdir: str | os.PathLike, parallel: int = 1) -> list[dict]:
  """Runs every unfinished point of `grid` (DP first at each size, since DiLoCo takes its learning rate), then
  tabulates every finished point in `workdir`; returns the table's rows."""
  grid.check()
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  sweep.record(workdir / STUDY_FILE, config_path, base)
  resolved = from_config_dict(config)
  devices, batch = resolved.num_devices, resolved.data.batch_size
  for size in grid.sizes:  # every point is checked before any trains (DiLoCo's at the grid's first DP rate)
    for point in [Point(size, 0, lr, b, 0) for lr in grid.dp_lrs for b in grid.batch_sizes or (batch,)] + [
        Point(size, m, grid.dp_lrs[0] * f, b, 0, olr, mom) for m in grid.learners for olr in grid.outer_lrs
        for mom in grid.outer_momenta for f in grid.inner_lr_factors for b in grid.batch_sizes or (batch,)]:
      from_config_dict(sweep.point_config(config, sweep.Point(point.fields(devices))))
  for size in grid.sizes:
    _run_points([Point(size, 0, lr, b, 0) for lr in grid.dp_lrs for b in grid.batch_sizes or (batch,)], config, config_path,
                base, workdir, devices, parallel)
    dp = _best(_finished(workdir), size, 0)
    diloco = [Point(size, m, dp.inner_lr * f, dp.batch_size, 0, olr, mom) for m in grid.learners
              for olr in grid.outer_lrs for mom in grid.outer_momenta for f in grid.inner_lr_factors]
    _run_points(diloco, config, config_path, base, workdir, devices, parallel)
    done = _finished(workdir)
    bests = [_best(done, size, m) for m in (0, *grid.learners)]
    _run_points([dataclasses.replace(b, seed=s) for b in bests for s in grid.seeds if s], config, config_path, base,
                workdir, devices, parallel)
  return tabulate(workdir)


def _run_points(points: Sequence[Point], config: ml_collections.ConfigDict, config_path: str, base: Sequence[str],
                workdir: pathlib.Path, devices: int, parallel: int) -> None:
  """Trains the points not yet finished; a point whose run diverged is finished without a loss (said, and never the
  best); any other failure is reported, and the study stops after the points in flight."""
  todo = [p for p in points if not _done(workdir / p.name)]
  for point in todo:
    (workdir / point.name).mkdir(parents=True, exist_ok=True)
    params = from_config_dict(sweep.point_config(config, sweep.Point(point.fields(devices)))).model.num_params()
    (workdir / point.name / POINT_FILE).write_text(json.dumps(dict(dataclasses.asdict(point), params=params)) + "\n")
  failed = sweep.run_points({p.name: sweep.restartable(p.fields(devices), config) for p in todo}, config_path, base,
                            workdir, parallel)
  for name in list(failed):
    last = sweep.last_line(workdir / name / "log.txt")
    if last.startswith(DIVERGED_LINE):
      (workdir / name / DIVERGED_FILE).write_text(last + "\n")
      del failed[name]
  if failed:
    raise sweep.SweepFailed(f"{len(failed)} study points failed ({', '.join(failed)}); see {workdir}/<point>/log.txt")


def _done(point_dir: pathlib.Path) -> bool:
  return (point_dir / summary.RESULTS_FILE).exists() or (point_dir / DIVERGED_FILE).exists()


def _finished(workdir: pathlib.Path) -> list[dict]:
  """Every finished point in the workdir: its settings and its result (a diverged one: an infinite loss)."""
  out = []
  for path in sorted(workdir.glob(f"*/*/{POINT_FILE}")):
    if not _done(path.parent):
      continue
    results = path.parent / summary.RESULTS_FILE
    try:
      point = json.loads(path.read_text())
      params = point.pop("params")
      row = (json.loads(results.read_text())[-1] if results.exists()  # its newest run, if a rerun added one
             else dict(eval_loss=math.inf, tokens=None, merges=None))
      out.append(dict(point=Point(**point), params=params, eval_loss=row["eval_loss"], tokens=row["tokens"],
                      merges=row.get("merges")))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
      raise DataError(f"{path.parent} is damaged ({type(error).__name__}: {error}): move it aside (the study runs "
                      "the point again), or restore its point.json and results.json") from None
  return out


def _best(done: Sequence[dict], size: str, learners: int, seed: int = 0) -> Point:
  """The point of lowest eval loss among `size`'s runs with `learners` (0: DP) and `seed`."""
  runs = [d for d in done if d["point"].size == size and d["point"].learners == learners and d["point"].seed == seed
          and np.isfinite(d["eval_loss"])]
  if not runs:
    raise UsageError(f"no finished run of size {size}, {'DP' if not learners else f'M={learners}'}, seed {seed}")
  return min(runs, key=lambda d: d["eval_loss"])["point"]


def tabulate(workdir: str | os.PathLike) -> list[dict]:
  """The study's table from every finished point in `workdir`, printed and written with its plot."""
  workdir = pathlib.Path(workdir)
  if not (workdir / STUDY_FILE).is_file():
    raise UsageError(f"--workdir={workdir}: holds no {STUDY_FILE}, so no study ran there; allowed the workdir of a "
                     "study (run it without --table_only first)")
  done = _finished(workdir)
  study = json.loads((workdir / STUDY_FILE).read_text())
  rows = []
  for size in sorted({d["point"].size for d in done}, key=list(SIZES).index):
    learner_counts = sorted({d["point"].learners for d in done if d["point"].size == size})
    if 0 not in learner_counts:
      continue
    dp = _best(done, size, 0)
    dp_by_seed = {d["point"].seed: d for d in done if d["point"] == dataclasses.replace(dp, seed=d["point"].seed)}
    for m in learner_counts:
      best = _best(done, size, m)
      same = [d for d in done if d["point"] == dataclasses.replace(best, seed=d["point"].seed)]
      gaps = [100 * (d["eval_loss"] / dp_by_seed[d["point"].seed]["eval_loss"] - 1) for d in same
              if d["point"].seed in dp_by_seed]
      grid = [d for d in done if d["point"].size == size and d["point"].learners == m and d["point"].seed == 0]
      rows.append(dict(size=size, params=same[0]["params"], M=m or "DP",
                       eval_loss=float(np.mean([d["eval_loss"] for d in same])),
                       **{"gap_%": float(np.mean(gaps)) if m else 0.0,
                          "gap_range_%": f"{min(gaps):+.2f}..{max(gaps):+.2f}" if m and len(gaps) > 1 else ""},
                       outer_lr=best.outer_lr if m else None, outer_momentum=best.outer_momentum if m else None,
                       inner_lr=best.inner_lr, batch=best.batch_size, tokens=same[0]["tokens"], merges=same[0]["merges"] if m else None,
                       runs=len(grid), seeds=len(same)))
  title = f"DiLoCo vs DP at equal tokens: {study['config']} {' '.join(study['overrides'])}".strip()
  table = summary.summary_table(rows, COLUMNS, title=title)
  anchor = anchor_table()
  print(table + "\n\n" + anchor)
  (workdir / "scaling.txt").write_text(table + "\n\n" + anchor + "\n")
  (workdir / "scaling.md").write_text(summary.summary_table(rows, COLUMNS, markdown=True) + "\n\n"
                                      + anchor_table(markdown=True) + "\n")
  (workdir / summary.RESULTS_FILE).write_text(json.dumps(rows, indent=2, allow_nan=True) + "\n")
  (workdir / "grid.md").write_text(summary.summary_table(_grid_rows(done), GRID_COLUMNS, markdown=True) + "\n")
  _plot(rows, workdir / "scaling.png")
  print(f"outputs in {workdir}/: scaling.txt, scaling.md, results.json (the table), grid.md (every run), scaling.png "
        "(gap vs parameters), <size>/<point>/ (each run's workdir and log.txt)")
  return rows


def _grid_rows(done: Sequence[dict]) -> list[dict]:
  """Every finished run, by size, M and settings, with its gap to the best DP run of its size and seed."""
  rows = []
  for d in sorted(done, key=lambda d: (list(SIZES).index(d["point"].size), d["point"].learners, d["point"].seed,
                                       d["point"].outer_momentum, d["point"].outer_lr, d["point"].inner_lr)):
    p = d["point"]
    dp = [e["eval_loss"] for e in done if e["point"] == dataclasses.replace(_best(done, p.size, 0), seed=p.seed)]
    rows.append(dict(size=p.size, M=p.learners or "DP", seed=p.seed, outer_lr=p.outer_lr if p.learners else None,
                     outer_momentum=p.outer_momentum if p.learners else None, inner_lr=p.inner_lr,
                     batch=p.batch_size, eval_loss=d["eval_loss"],
                     **{"gap_%": 100 * (d["eval_loss"] / dp[0] - 1) if dp else None}))
  return rows


def anchor_table(markdown: bool = False) -> str:
  """The anchor's gaps to DP, one row per model size."""
  rows = [dict(params=int(n), **{f"M={m}": gaps.get(m) for m in (1, 2, 4, 8)}) for n, gaps in ANCHOR.items()]
  return summary.summary_table(rows, ("params", "M=1", "M=2", "M=4", "M=8"), markdown=markdown,
                               title=None if markdown else "anchor: Charles et al. 2025 (arXiv 2503.09799), Table 4, "
                               "gap to DP in % at 20 tokens per parameter")


def _plot(rows: Sequence[dict], path: pathlib.Path) -> None:
  """Gap vs parameters (log x), one line per M; the anchor's as dashed lines."""
  series: dict[str, list[tuple[float, float]]] = {}
  for row in rows:
    if row["M"] != "DP":
      series.setdefault(f"M={row['M']}", []).append((row["params"], row["gap_%"]))
  anchors = {f"anchor M={m}": [(n, g[m]) for n, g in ANCHOR.items() if m in g] for m in (1, 2, 4, 8)}
  colors = {f"{who}M={m}": f"C{i}" for i, m in enumerate((1, 2, 4, 8)) for who in ("", "anchor ")}
  if series:
    per_param = rows[0]["tokens"] / rows[0]["params"]
    summary.plot_lines({**series, **anchors}, path, x_label="parameters", y_label="eval loss gap to DP (%)",
                       title=f"DiLoCo vs DP at equal tokens ({per_param:.0f} tokens/parameter); dashed: the anchor",
                       log="x", dashed=tuple(anchors), colors=colors, hline=0.0)
