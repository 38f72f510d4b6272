"""The heterogeneous-hardware experiment: merge policies and their ablations over seeds, at equal tokens.

The paper's claim: with learners on two hardware classes, K=M (synchronous) loses goodput waiting for the
slow class; K=1 keeps everyone busy but merges worse; K=1 with the adaptive grace window keeps both.
"""

import math
import os
from typing import Sequence

import ml_collections
import numpy as np
from absl import logging

from runtime.reporting import summary
from runtime.config.run import RunConfig, with_fields
from runtime.errors import UsageError
from runtime.train.harness import Experiment, RunResult
from runtime.experiments.modes import prepare, train_one
from runtime.experiments.scavenging import time_to_loss

# Each variant overrides the config's fields; the ablations take K=1 + grace and remove one mechanism.
# "K=M": synchronous; "-x": K=1+grace without mechanism x (token weighting, RDA, carrying the overlap work
# onto Θ, the overlap itself); "mix": the overlap work kept by Streaming DiLoCo's α-mixing instead of carried.
POLICIES = {
    "K=M": {"outer.quorum": -1, "outer.grace": "none"},
    "K=1": {"outer.quorum": 1, "outer.grace": "none"},
    "K=1+grace": {"outer.quorum": 1, "outer.grace": "adaptive"},
}
ABLATIONS = {
    "K=1+grace -weighting": {"outer.token_weighting": False},
    "K=1+grace -rda": {"outer.merge": "mean"},
    "K=1+grace -carry": {"outer.receive": "overwrite"},
    "K=1+grace -overlap": {"overlap_steps": 0},
    "K=1+grace mix": {"outer.receive": "mix"},
}
VARIANTS = {**POLICIES, **{name: {**POLICIES["K=1+grace"], **fields} for name, fields in ABLATIONS.items()}}
COLUMNS = ("variant", "seeds", "goodput", "busy_min", "busy_mean", "learners_per_merge", "gathered", "merges",
           "eval_loss", "eval_loss_sd", "vs_K=M_%", "time_to_K=M_loss")


def variant_config(base: RunConfig, variant: str, seed: int) -> RunConfig:
  """The base config under one variant and seed (a quorum of -1 means every learner)."""
  fields = {k: (base.learners if k == "outer.quorum" and v == -1 else v) for k, v in VARIANTS[variant].items()}
  return with_fields(base, {**fields, "seed": seed})


def run(config: ml_collections.ConfigDict, workdir: str | os.PathLike | None, seeds: Sequence[int],
        variants: Sequence[str] | None = None) -> list[dict]:
  """Trains every variant (default: all) on every seed; returns and tabulates one row per variant (seed means)."""
  variants = list(variants or VARIANTS)
  for variant in variants:
    if variant not in VARIANTS:
      raise UsageError(f"--variants: {variant!r} is not a variant; allowed names from {list(VARIANTS)}")
  base = prepare(config)
  results: dict[str, list[RunResult]] = {}
  for seed in seeds:
    exp = Experiment(with_fields(base, {"seed": seed}))
    for variant in variants:
      logging.info("heterogeneity: %s, seed %d", variant, seed)
      results.setdefault(variant, []).append(
          train_one(variant_config(base, variant, seed), exp, None, f"{variant} (seed {seed})"))
  rows = [_row(variant, runs) for variant, runs in results.items()]
  reference = next((r["eval_loss"] for r in rows if r["variant"].startswith("K=M")), None)
  for row, runs in zip(rows, results.values()):
    row["vs_K=M_%"] = 100 * (row["eval_loss"] / reference - 1) if reference else float("nan")
    row["time_to_K=M_loss"] = float(np.mean([time_to_loss(r, reference) for r in runs])) if reference else math.nan
  title = (f"heterogeneous learners: {base.learners} learners, speeds {sorted(set(base.clock.speeds))}, jitter "
           f"{base.clock.jitter:g}, H={base.inner_steps}, τ={base.overlap_steps}, {base.token_budget:,} tokens, "
           f"seeds {list(seeds)}")
  curves = {variant: runs[0].records for variant, runs in results.items() if variant in POLICIES}
  summary.write_experiment(rows, COLUMNS, title, workdir, "heterogeneity", curves,
                           next(iter(results.values()))[0].time_kind, f"eval loss of Θ, seed {seeds[0]}")
  return rows


def _row(variant: str, runs: list[RunResult]) -> dict:
  mean = lambda key: float(np.mean([r.extras[key] for r in runs]))
  losses = [r.final_eval_loss for r in runs]
  return dict(variant=variant, seeds=len(runs), goodput=mean("goodput"), busy_min=min(r.extras["busy_min"] for r in runs),
              busy_mean=mean("busy_mean"), learners_per_merge=mean("learners_per_merge"), gathered=mean("gathered"),
              merges=mean("merges"),
              eval_loss=float(np.mean(losses)), eval_loss_sd=float(np.std(losses, ddof=1)) if len(runs) > 1 else 0.0)
