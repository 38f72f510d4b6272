"""The simulated goodput table beside the paper's Table 1: statistics over seeds, calibration, text, plot."""

import dataclasses
import functools
import math
import os

import numpy as np

from runtime.sim.config import PAPER_CHIPS, PAPER_GOODPUT, PAPER_MTBI_YEARS, ClusterSimConfig, Setup, setups
from runtime.sim.model import CellResult, simulate

_MISS_POINTS = 3.0


@functools.lru_cache
def student_t_quantile(q: float, dof: int) -> float:
  """The q-quantile (q > 0.5) of Student's t distribution with dof degrees of freedom."""
  x = np.linspace(0.0, 200.0, 400_001)
  log_scale = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
  density = np.exp(log_scale - (dof + 1) / 2 * np.log1p(x * x / dof))
  mass = np.concatenate([[0.0], np.cumsum((density[1:] + density[:-1]) * np.diff(x) / 2.0)])
  return float(np.interp(q - 0.5, mass, x))


def mean_and_ci(values: np.ndarray) -> tuple[float, float]:
  """Mean and 95% confidence half-width over seeds (Student t); NaN half-width for one seed."""
  if values.size < 2:
    return float(values.mean()), math.nan
  half = student_t_quantile(0.975, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size)
  return float(values.mean()), float(half)


def run_table(config: ClusterSimConfig) -> list[CellResult]:
  """Simulates every row (setup) at every chip count."""
  return [simulate(config, setup, chips) for setup in setups(config) for chips in config.chips]


def _fit_cost(config: ClusterSimConfig, field: str, setup: Setup, target: float) -> float:
  """The cost (config field, seconds) at which `setup` reaches `target` at calibration_chips."""
  def goodput(cost: float) -> float:
    trial = dataclasses.replace(config, **{field: cost})
    return float(simulate(trial, setup, config.calibration_chips).goodput.mean())

  low, high = 0.0, 64.0
  while goodput(high) > target and high < 1e7:
    low, high = high, 2.0 * high
  for _ in range(30):
    middle = (low + high) / 2.0
    low, high = (middle, high) if goodput(middle) > target else (low, middle)
  return (low + high) / 2.0


def calibrate(config: ClusterSimConfig) -> ClusterSimConfig:
  """Fits restart_s on data-parallel and reconfig_s on elastic DP to the paper's cells."""
  column = PAPER_CHIPS.index(config.calibration_chips)
  data_parallel, elastic = setups(config)[:2]
  restart_s = _fit_cost(config, "restart_s", data_parallel,
                        PAPER_GOODPUT[data_parallel.name][column] / 100)
  reconfig_s = _fit_cost(config, "reconfig_s", elastic, PAPER_GOODPUT[elastic.name][column] / 100)
  return dataclasses.replace(config, restart_s=restart_s, reconfig_s=reconfig_s)


def _chips_label(chips: int) -> str:
  """150k, 1.2M, ..."""
  return f"{chips / 1e6:g}M" if chips >= 1_000_000 else f"{chips / 1e3:g}k"


def _paper(config: ClusterSimConfig, result: CellResult) -> float | None:
  """The paper's goodput in % for this cell, when the paper has it and the MTBI matches."""
  if config.mtbi_years != PAPER_MTBI_YEARS or result.chips not in PAPER_CHIPS:
    return None
  row = PAPER_GOODPUT.get(result.setup.name)
  return None if row is None else float(row[PAPER_CHIPS.index(result.chips)])


def _is_calibration_cell(config: ClusterSimConfig, result: CellResult) -> bool:
  """Whether the config's costs were fitted on this cell."""
  baseline = result.setup.kind in ("data-parallel", "elastic")
  return baseline and result.chips == config.calibration_chips


def format_table(config: ClusterSimConfig, results: list[CellResult]) -> str:
  """The goodput table (ours ± CI, paper, difference) and the uptime table, as printable text."""
  header = f"{'setup':<22}" + "".join(f"| {_chips_label(c):^21}" for c in config.chips)
  lines = [
      f"Goodput %: ours ± 95% CI over {config.seeds} seeds of {config.horizon_days:g} days | "
      f"paper | ours - paper.  * calibration cell, ! off by more than {_MISS_POINTS:g} points.",
      f"chip MTBI {config.mtbi_years:g} y, slice {config.slice_chips} chips, repair "
      f"{config.repair_s:g} s, step {config.step_s:g} s, restart {config.restart_s:.1f} s, "
      f"reconfiguration {config.reconfig_s:.1f} s, learner recovery '{config.learner_recovery}', "
      f"quorum K={config.quorum}, spares {config.spare_fraction:g} of the slices, syncer MTBI "
      f"{config.syncer_mtbi_days:g} d.",
      header]
  predicted, misses = 0, []
  for setup in setups(config):
    cells = []
    for result in (r for r in results if r.setup == setup):
      mean, half = mean_and_ci(100.0 * result.goodput)
      paper = _paper(config, result)
      if paper is None:
        cells.append(f"| {mean:5.1f}±{half:<4.1f}{'':11}")
        continue
      diff = mean - paper
      calibration = _is_calibration_cell(config, result)
      mark = "*" if calibration else "!" if abs(diff) > _MISS_POINTS else " "
      predicted += not calibration
      if mark == "!":
        misses.append(f"{setup.name} @ {_chips_label(result.chips)} ({diff:+.1f})")
      cells.append(f"| {mean:5.1f}±{half:<4.1f}{paper:3.0f} {diff:+5.1f}{mark} ")
    lines.append(f"{setup.name:<22}" + "".join(cells))
  if predicted:
    lines.append(f"Predicted cells within ±{_MISS_POINTS:g} points: {predicted - len(misses)} of "
                 f"{predicted}" + (f"; misses: {', '.join(misses)}." if misses else "."))
  lines += ["", "Uptime % (time the job, or the syncer, advances): ours ± 95% CI.", header]
  for setup in setups(config):
    cells = [mean_and_ci(100.0 * r.uptime) for r in results if r.setup == setup]
    lines.append(f"{setup.name:<22}"
                 + "".join(f"| {mean:5.1f}±{half:<4.1f}{'':11}" for mean, half in cells))
  return "\n".join(lines)


def plot_goodput(config: ClusterSimConfig, results: list[CellResult], path: str) -> None:
  """Writes a PNG of goodput against chip count for every setup, ours (with CI) and the paper's."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=import-outside-toplevel

  figure, axes = plt.subplots(figsize=(8, 5))
  for index, setup in enumerate(setups(config)):
    color = f"C{index}"
    rows = [r for r in results if r.setup == setup]
    stats = np.array([mean_and_ci(100.0 * r.goodput) for r in rows])
    axes.errorbar(config.chips, stats[:, 0], yerr=stats[:, 1], color=color, marker="o",
                  label=setup.name)
    paper = [(r.chips, _paper(config, r)) for r in rows if _paper(config, r) is not None]
    if paper:
      axes.plot(*zip(*paper), color=color, marker="x", linestyle="--", alpha=0.6)
  axes.set_xscale("log")
  axes.minorticks_off()
  axes.set_xticks(config.chips, [_chips_label(c) for c in config.chips])
  axes.set_xlabel("chips")
  axes.set_ylabel("goodput %")
  axes.set_title(f"Goodput at chip MTBI {config.mtbi_years:g} y (solid: simulated, dashed: paper)")
  axes.grid(alpha=0.3)
  axes.legend(fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)


def build(config: ClusterSimConfig, workdir: str) -> str:
  """Calibrates if asked, simulates the table, writes workdir/goodput.png, returns the text."""
  lines = []
  if config.calibrate:
    config = calibrate(config)
    lines.append(f"Calibrated at {_chips_label(config.calibration_chips)} chips: restart_s = "
                 f"{config.restart_s:.2f} (data-parallel), reconfig_s = {config.reconfig_s:.2f} "
                 "(elastic data-parallel).")
  results = run_table(config)
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, "goodput.png")
  plot_goodput(config, results, path)
  lines += [format_table(config, results), "", f"Wrote {path}"]
  return "\n".join(lines)
