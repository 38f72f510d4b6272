"""Run reports: summary tables for the terminal or a README, loss curves and learner timelines."""

from __future__ import annotations

import itertools
import numbers
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from runtime.reporting.metrics import TIME_KINDS

RESULTS_FILE = "results.json"  # a job's table as JSON, written last: a workdir that has it holds a finished job
STATE_COLORS: Mapping[str, str] = {
    "training": "tab:green",
    "syncing": "tab:blue",
    "waiting": "tab:orange",
    "down": "tab:red",
    "reconfiguring": "tab:olive",
    "failed": "tab:gray",
}
SYNCER_LANE = "syncer"
_KIND_STYLES: Mapping[str, Mapping[str, object]] = {
    "train": {"linestyle": "-", "linewidth": 1.2},
    "eval": {"linestyle": "--", "marker": "o", "markersize": 3},
    "merge": {"linestyle": ":", "marker": ".", "markersize": 3},
}


def _is_number(value: object) -> bool:
  """Says whether `value` is a real number (bools are not)."""
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _format_cell(value: object) -> str:
  """Formats floats to 4 significant digits, ints with thousands separators, missing as '-'."""
  if value is None:
    return "-"
  if isinstance(value, numbers.Integral) and not isinstance(value, bool):
    return f"{value:,}"
  if _is_number(value):
    return f"{value:.4g}"
  return str(value)


def summary_table(
    rows: Sequence[Mapping[str, object]],
    columns: Sequence[str],
    *,
    title: str | None = None,
    markdown: bool = False,
) -> str:
  """Renders `rows` as a fixed-width plain-text table, or a GitHub Markdown table if `markdown`."""
  if not columns:
    raise ValueError("summary_table needs at least one column")
  cells = [[_format_cell(row.get(column)) for column in columns] for row in rows]
  if markdown:
    cells = [[cell.replace("|", r"\|") for cell in line] for line in cells]
  # Numeric columns are right-aligned so digits line up; text columns read left to right.
  numeric = [
      all(_is_number(row[c]) for row in rows if row.get(c) is not None) for c in columns
  ]
  widths = [
      max([len(column), 3, *(len(line[i]) for line in cells)]) for i, column in enumerate(columns)
  ]

  def render(line: Sequence[str]) -> list[str]:
    return [
        cell.rjust(width) if right else cell.ljust(width)
        for cell, width, right in zip(line, widths, numeric)
    ]

  if markdown:
    rule = [
        "-" * (width - 1) + ":" if right else "-" * width for width, right in zip(widths, numeric)
    ]
    lines = ["| " + " | ".join(render(line)) + " |" for line in [list(columns), *cells]]
    lines.insert(1, "| " + " | ".join(rule) + " |")
    heading = [f"**{title}**", ""] if title else []
  else:
    lines = ["  ".join(render(line)).rstrip() for line in [list(columns), *cells]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    heading = [title] if title else []
  return "\n".join(heading + lines)


def _time_label(time_kind: str | None, caller: str) -> str:
  """The time axis label, which says whether its seconds are modeled or wall-clock."""
  if time_kind not in TIME_KINDS:
    raise ValueError(f"{caller}: time_kind={time_kind!r} for the time axis: allowed {list(TIME_KINDS)}")
  return f"{time_kind} time (s)"


def _curve_label(run: str, kind: str, y: str, records: Sequence[Mapping[str, object]]) -> str:
  """The legend entry of one (run, kind) line, saying what its values are."""
  if kind == "merge":  # a merge record's loss is the mean of the merged learners' round train losses
    return f"{run} merged learners' mean train {y}"
  if kind == "eval":  # a DiLoCo run (one with merges) evaluates its global parameters Θ
    of_theta = " of Θ" if any(record.get("kind") == "merge" for record in records) else ""
    return f"{run} held-out eval {y}{of_theta}"
  return f"{run} {kind} {y}"


def _save(figure: Figure, path: str | os.PathLike) -> pathlib.Path:
  """Writes `figure` as a PNG through the headless Agg canvas and returns the path."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  FigureCanvasAgg(figure).print_png(path)
  return path


def write_experiment(rows: list[dict], columns: Sequence[str], title: str, workdir: str | os.PathLike | None,
                     name: str, curves: dict[str, list], time_kind: str, plot_title: str) -> None:
  """Prints an experiment's table; with a workdir also writes <name>.txt / .md and <name>.png (eval loss)."""
  table = summary_table(rows, columns, title=title)
  print(table)
  if workdir is None:
    return
  out = pathlib.Path(workdir)
  out.mkdir(parents=True, exist_ok=True)
  (out / f"{name}.txt").write_text(table + "\n")
  (out / f"{name}.md").write_text(summary_table(rows, columns, title=title, markdown=True) + "\n")
  if curves:
    plot_curves(curves, out / f"{name}.png", x=("tokens", "time"), kinds=("eval",), time_kind=time_kind,
                title=plot_title)


def plot_lines(series: Mapping[str, Sequence[tuple[float, float]]], path: str | os.PathLike, *, x_label: str,
               y_label: str, title: str = "", log: str = "", dashed: Sequence[str] = (),
               colors: Mapping[str, str] | None = None, hline: float | None = None) -> pathlib.Path:
  """Writes one line per series of (x, y) points as a PNG at `path`: the axes named in `log` ("x", "y", "xy") on a
  log scale, the series named in `dashed` dashed, `colors` by series name, and a horizontal rule at `hline`."""
  figure = Figure(figsize=(7.0, 4.5), layout="constrained")
  ax = figure.subplots()
  for name, points in series.items():
    xs, ys = zip(*sorted(points))
    ax.plot(xs, ys, marker="o", label=name, linestyle="--" if name in dashed else "-",
            color=(colors or {}).get(name))
  if "x" in log:
    ax.set_xscale("log")
  if "y" in log:
    ax.set_yscale("log")
  if hline is not None:
    ax.axhline(hline, color="gray", linewidth=0.8)
  ax.set_xlabel(x_label)
  ax.set_ylabel(y_label)
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize="small")
  if title:
    ax.set_title(title, fontsize="small")
  return _save(figure, path)


def plot_curves(runs: Mapping[str, Sequence[Mapping[str, object]]], path: str | os.PathLike,
                **options: Any) -> pathlib.Path:
  """Writes `curves_figure(runs, **options)` as a PNG at `path`."""
  return _save(curves_figure(runs, **options), path)


def curves_figure(
    runs: Mapping[str, Sequence[Mapping[str, object]]],
    *,
    x: Sequence[str] = ("tokens",),
    y: str = "loss",
    kinds: Sequence[str] = ("train", "eval"),
    y_for_kind: Mapping[str, str] | None = None,
    title: str = "",
    log_y: bool = False,
    time_kind: str | None = None,
    loss_unit: str = "nats/byte",
) -> Figure:
  """Plots `y` against each key of `x` (one subplot each), one line per (run, kind).

  `y_for_kind` names the record key read for each kind; kinds it leaves out read `y`. By default
  eval records read `f"eval_{y}"` and the others `y`, e.g. {"train": "loss", "eval": "eval_loss",
  "merge": "loss"} for y="loss". An x key "time" needs `time_kind`, "modeled" or "wall" (seconds).
  """
  x_labels = {key: _time_label(time_kind, "plot_curves") if key == "time" else key for key in x}
  y_keys = {"eval": f"eval_{y}"} if y_for_kind is None else y_for_kind
  colors = dict(zip(runs, itertools.cycle(f"C{i}" for i in range(10))))
  figure = Figure(figsize=(5.5 * len(x), 4.0), layout="constrained")
  axes = figure.subplots(1, len(x), squeeze=False)[0]
  for ax, x_key in zip(axes, x):
    for run, records in runs.items():
      for kind in kinds:
        y_key = y_keys.get(kind, y)
        points = sorted(
            (record[x_key], record[y_key])
            for record in records
            if record.get("kind") == kind
            and _is_number(record.get(x_key))
            and _is_number(record.get(y_key))
        )
        if points:
          xs, ys = zip(*points)
          ax.plot(xs, ys, color=colors[run], label=_curve_label(run, kind, y, records),
                  **_KIND_STYLES.get(kind, {}))
    if not ax.lines:
      raise ValueError(
          f"plot_curves: no record of kinds {list(kinds)} in runs {list(runs)} has numbers for "
          f"x key '{x_key}' and y keys {[y_keys.get(kind, y) for kind in kinds]}"
      )
    ax.set_xlabel(x_labels[x_key])
    ax.set_ylabel(f"loss ({loss_unit})" if y == "loss" else y)
    if log_y:
      ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
  if title:
    figure.suptitle(title)
  return figure


def plot_timeline(intervals: Sequence[tuple[str, float, float, str]], events: Sequence[tuple[float, str]],
                  path: str | os.PathLike, **options: Any) -> pathlib.Path:
  """Writes `timeline_figure(intervals, events, **options)` as a PNG at `path`."""
  return _save(timeline_figure(intervals, events, **options), path)


def timeline_figure(
    intervals: Sequence[tuple[str, float, float, str]],
    events: Sequence[tuple[float, str]],
    *,
    time_kind: str,
    title: str = "",
) -> Figure:
  """Draws each lane's state intervals as colored bars and `events` as ticks on the syncer lane.

  `time_kind` says whether the times are "modeled" or "wall" seconds.
  """
  time_label = _time_label(time_kind, "plot_timeline")
  if not intervals and not events:
    raise ValueError("plot_timeline: no intervals and no events to plot")
  for lane, start, end, state in intervals:
    if state not in STATE_COLORS:
      raise ValueError(
          f"plot_timeline: lane '{lane}' has state {state!r}: allowed {sorted(STATE_COLORS)}"
      )
    if end < start:
      raise ValueError(
          f"plot_timeline: lane '{lane}' has an interval ending at {end} before its start {start}"
      )
  lanes = list(dict.fromkeys(lane for lane, *_ in intervals))
  if events and SYNCER_LANE not in lanes:
    lanes.append(SYNCER_LANE)
  # The first lane is drawn at the top, as it is read.
  row = {lane: len(lanes) - 1 - i for i, lane in enumerate(lanes)}

  figure = Figure(figsize=(10.0, 1.2 + 0.45 * len(lanes)), layout="constrained")
  ax = figure.subplots()
  for lane, start, end, state in intervals:
    ax.broken_barh([(start, end - start)], (row[lane] - 0.4, 0.8), facecolors=STATE_COLORS[state])
  labels = list(dict.fromkeys(label for _, label in events))
  palette = itertools.cycle(["black", "tab:purple", "tab:brown", "tab:gray"])
  event_colors = dict(zip(labels, palette))
  for label, color in event_colors.items():
    moments = [moment for moment, event in events if event == label]
    syncer_row = row[SYNCER_LANE]
    ax.vlines(moments, syncer_row - 0.4, syncer_row + 0.4, colors=color, linewidths=2)

  ax.set_yticks(list(row.values()), list(row))
  ax.set_ylim(-0.6, len(lanes) - 0.4)
  ax.set_xlabel(time_label)
  ax.grid(True, axis="x", alpha=0.3)
  handles = [Patch(facecolor=color, label=state) for state, color in STATE_COLORS.items()]
  handles += [Line2D([], [], color=color, label=label) for label, color in event_colors.items()]
  ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
  if title:
    ax.set_title(title)
  return figure
