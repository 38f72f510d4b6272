"""The cross-region experiment: 8 learners in regions, the inter-region bandwidth swept; DP against DiLoCo.

Part one (seed 0, no faults): at each inter-region bandwidth (and with none to speak of, "unlimited"), DP with
an fp32 all-reduce per step, Decoupled DiLoCo (K=1, τ overlap) with fp32, int4 and top-k + error feedback
reports, and synchronous DiLoCo without overlap (K=M, τ=0): modeled time to the token budget, its slowdown
against the same variant unlimited, busy fraction, cross-region bytes per trained token and eval loss.
Part two (every seed, K=1, one learner dropping out mid-run for good): the eval loss of each compression at
equal tokens against uncompressed Decoupled DiLoCo. Both in virtual time: the host's speed moves no number.
"""

import dataclasses
import os
import pathlib
from typing import Sequence

import ml_collections
import numpy as np
from absl import logging

from runtime.reporting import summary
from runtime.config.run import RunConfig, with_fields, with_mode
from runtime.errors import UsageError
from runtime.train.harness import Experiment, RunResult
from runtime.experiments.modes import prepare, train_one
from runtime.config.network import num_regions

UNLIMITED = 1e15  # bytes per second: an inter-region link that costs nothing measurable
COLUMNS = ("inter_B_per_s", "variant", "modeled_s", "slowdown", "busy_mean", "cross_B_per_token", "dp_over_this",
           "cross_up_B_per_token", "peak_learner_B", "eval_loss")
QUALITY_COLUMNS = ("variant", "seeds", "eval_loss", "eval_loss_sd", "vs_fp32_%", "cross_B_per_token",
                   "dp_over_this", "dp_over_up_only")
VARIANTS = {  # name: (mode, fields); dp: an fp32 all-reduce per step; topk: 1% + error feedback; sync: K=M, τ=0
    "dp": ("dp", {}),
    "decoupled_fp32": ("decoupled", {}),
    "decoupled_int4": ("decoupled", {"compression.up": "int4"}),
    "decoupled_topk": ("decoupled", {"compression.up": "topk"}),
    "decoupled_int4_down": ("decoupled", {"compression.up": "int4", "compression.down": "int4"}),  # Θ down too
    "decoupled_topk_down": ("decoupled", {"compression.up": "topk", "compression.down": "topk"}),
    "sync_no_overlap": ("diloco_sync", {"overlap_steps": 0}),
}
COMPRESSIONS = ("decoupled_fp32", "decoupled_int4", "decoupled_topk", "decoupled_int4_down", "decoupled_topk_down")


def variant(base: RunConfig, name: str, fields: dict) -> RunConfig:
  """The base in a variant's mode with its fields (and `fields`: bandwidth, seed, faults)."""
  mode, own = VARIANTS[name]
  return with_mode(with_fields(base, {**own, **fields}), mode)


def dropout(base: RunConfig) -> str:
  """The crash of the last learner halfway through the unlimited run's modeled time, never repaired."""
  return f"crash:learner={base.learners - 1},time={base.total_steps * base.clock.step_seconds / 2:g},repair=1e9"


def run(config: ml_collections.ConfigDict, workdir: str | os.PathLike | None, bandwidths: Sequence[float],
        seeds: Sequence[int], names: Sequence[str] = ()) -> tuple[list[dict], list[dict]]:
  """The sweep (seed 0) and the quality runs (every seed) of the `names`d variants (default all); writes both
  tables and the slowdown plot."""
  base = prepare(config)
  names = tuple(names) or tuple(VARIANTS)
  unknown = [n for n in names if n not in VARIANTS]
  if unknown or not all(b > 0 for b in bandwidths) or not seeds:
    raise UsageError(f"--variants={list(names)}, --bandwidths={list(bandwidths)}, --seeds={list(seeds)}: allowed "
                     f"variants among {list(VARIANTS)}, bandwidths > 0, at least one seed")
  exp = Experiment(base)
  sweep: dict[str, dict[float, RunResult]] = {}
  for bandwidth in (UNLIMITED, *sorted(bandwidths, reverse=True)):
    for name in names:
      logging.info("cross-region: %s at %g B/s", name, bandwidth)
      cfg = variant(base, name, {"links.inter_region_bandwidth_bytes_per_s": bandwidth})
      sweep.setdefault(name, {})[bandwidth] = train_one(cfg, exp, None, f"{name} @ {bandwidth:g}")
  rows = [_row(name, bw, result, sweep) for name in names for bw, result in sweep[name].items()]
  quality = {name: [train_one(variant(base, name, {"seed": s, "faults.schedule": dropout(base)}),
                              Experiment(with_fields(base, {"seed": s})), None, f"{name}, seed {s}") for s in seeds]
             for name in COMPRESSIONS if name in names}
  dp = sweep.get("dp", {}).get(UNLIMITED)
  quality_rows = [_quality_row(name, runs, quality.get(COMPRESSIONS[0]), dp) for name, runs in quality.items()]
  title = (f"cross-region: {base.learners} learners in {num_regions(base.links)} regions (syncer in region 0), "
           f"H={base.inner_steps}, τ={base.overlap_steps}, K={base.outer.quorum}, {base.token_budget:,} tokens, "
           f"own link {base.clock.bandwidth_bytes_per_s:g} B/s")
  summary.write_experiment(rows, COLUMNS, title, workdir, "cross_region", {}, "modeled", "")
  quality_title = (f"compression at equal tokens, K={base.outer.quorum}, learner {base.learners - 1} drops out "
                   f"({dropout(base)}), seeds {list(seeds)}")
  summary.write_experiment(quality_rows, QUALITY_COLUMNS, quality_title, workdir, "cross_region_quality", {},
                           "modeled", "")
  for line in targets(rows, quality_rows):
    print(line)
  if workdir is not None:
    summary.plot_lines({n: [(r["_bw"], r["slowdown"]) for r in rows if r["variant"] == n] for n in names},
                       pathlib.Path(workdir) / "cross_region_slowdown.png", x_label="inter-region bandwidth (B/s)",
                       y_label="time to budget / unlimited", title=title, log="xy")
  return rows, quality_rows


def _row(name: str, bandwidth: float, result: RunResult, sweep: dict[str, dict[float, RunResult]]) -> dict:
  e = result.extras
  dp = sweep.get("dp", {}).get(bandwidth)
  unlimited = sweep[name][UNLIMITED].virtual_seconds
  return {"inter_B_per_s": "unlimited" if bandwidth == UNLIMITED else f"{bandwidth:.0e}", "variant": name,
          "modeled_s": result.virtual_seconds, "slowdown": result.virtual_seconds / unlimited,
          "busy_mean": e["busy_mean"], "cross_B_per_token": e["cross_bytes_per_token"],
          "dp_over_this": _ratio(dp, e["cross_bytes_per_token"]),
          "cross_up_B_per_token": e.get("cross_up_bytes_per_token"),
          "peak_learner_B": e["peak_in_flight_learner"], "eval_loss": result.final_eval_loss, "_bw": bandwidth}


def _ratio(dp: RunResult | None, value: float) -> float | None:
  return dp.extras["cross_bytes_per_token"] / value if dp is not None and value > 0 else None


def _quality_row(name: str, runs: list[RunResult], reference: list[RunResult] | None, dp: RunResult | None) -> dict:
  """A compression's mean over seeds; vs_fp32_% needs uncompressed Decoupled's runs (`reference`)."""
  losses = [r.final_eval_loss for r in runs]
  cross = float(np.mean([r.extras["cross_bytes_per_token"] for r in runs]))
  up = float(np.mean([r.extras["cross_up_bytes_per_token"] for r in runs]))
  return {"variant": name, "seeds": len(runs), "eval_loss": float(np.mean(losses)),
          "eval_loss_sd": float(np.std(losses, ddof=1)) if len(runs) > 1 else 0.0,
          "vs_fp32_%": 100 * (np.mean(losses) / np.mean([r.final_eval_loss for r in reference]) - 1)
          if reference else None,
          "cross_B_per_token": cross, "dp_over_this": _ratio(dp, cross), "dp_over_up_only": _ratio(dp, up)}


@dataclasses.dataclass(frozen=True)
class Target:
  """One Done-when target of the issue: what it asks, what was measured, and whether it holds."""

  text: str
  measured: str
  met: bool

  def __str__(self) -> str:
    return f"[{'met' if self.met else 'MISSED'}] {self.text}: {self.measured}"


def targets(rows: list[dict], quality_rows: list[dict]) -> list[Target]:
  """The issue's targets checked against the tables (those whose variants ran)."""
  out = []
  quality = {r["variant"]: r for r in quality_rows}
  for name, factor, loss in (("decoupled_int4", 200, 0.5), ("decoupled_topk", 1000, 1.0),
                             ("decoupled_int4_down", 200, 0.5), ("decoupled_topk_down", 1000, 1.0)):
    q = quality.get(name)
    if q and q["dp_over_this"] is not None:
      out.append(Target(f"{name}: >= {factor}× fewer cross-region bytes/token than DP", f"{q['dp_over_this']:.1f}× "
                        f"(reports up alone: {q['dp_over_up_only']:.1f}×)", q["dp_over_this"] >= factor))
    if q and q["vs_fp32_%"] is not None:
      out.append(Target(f"{name}: eval loss within {loss}% of fp32 Decoupled", f"{q['vs_fp32_%']:+.2f}%",
                        abs(q["vs_fp32_%"]) <= loss))
  by = {(r["variant"], r["_bw"]): r for r in rows}
  slow = [bw for (n, bw), r in sorted(by.items(), key=lambda kv: -kv[0][1])
          if n == "dp" and r["slowdown"] >= 10]
  for bw in slow:  # every bandwidth where DP is ≥ 10× slower than unlimited
    for name in COMPRESSIONS:
      if (name, bw) in by:
        r = by[(name, bw)]
        out.append(Target(f"{name} at {bw:g} B/s (DP {by[('dp', bw)]['slowdown']:.1f}× slower): "
                          f"time within 10% of unlimited, busy ≥ 0.97", f"{r['slowdown']:.3f}×, busy "
                          f"{r['busy_mean']:.3f}", r["slowdown"] <= 1.1 and r["busy_mean"] >= 0.97))
    if ("sync_no_overlap", bw) in by:
      busy = by[("sync_no_overlap", bw)]["busy_mean"]
      out.append(Target(f"sync DiLoCo without overlap at {bw:g} B/s: busy < 0.5", f"busy {busy:.3f}", busy < 0.5))
  return out
