"""The scavenging experiment: a base of M learners grows for a while on lent slices, at equal tokens (FLOPs).

The paper's claim: temporarily growing a base of M=4 learners to 8 or 16 on spare capacity reaches the base
run's final loss sooner, with the same quality at equal tokens. Each lent slice runs one more learner (the
data service feeds it; the syncer's quorum, grace and outer-step scale follow the learners present).
"""

import os
from typing import Sequence

import ml_collections
import numpy as np
from absl import logging

from runtime.cluster import devices as devices_lib
from runtime.reporting import summary
from runtime.config.run import RunConfig, with_fields
from runtime.errors import UsageError
from runtime.train.harness import Experiment, RunResult
from runtime.experiments.modes import prepare, train_one

COLUMNS = ("variant", "seeds", "peak_learners", "modeled_s", "t_to_base_loss_s", "speedup", "eval_loss",
           "eval_loss_sd", "vs_base_%", "goodput", "busy_mean", "lent_slice_s")


def variants(base: RunConfig, growth: Sequence[int], lend_at: float, lend_seconds: float) -> dict[str, dict]:
  """Each variant's fields over the base (one device per slice throughout).

  "M→N": N − M slices lent from `lend_at` for `lend_seconds`; "M→N, run schedule": the same with the inner
  schedule following the run's progress; "N throughout": N learners from start to end at equal tokens (the
  same per-learner batch, so fewer steps each): what the larger effective batch alone costs.
  """
  m, per_learner = base.learners, base.learner_batch(0)
  out = {f"M={m}": {}}
  for n in growth:
    lend = {"num_devices": base.num_slices + n - m,
            "capacity.schedule": f"lend:slices={n - m},time={lend_at:g},duration={lend_seconds:g}"}
    out[f"M={m}→{n}"] = lend
    out[f"M={m}→{n}, run schedule"] = {**lend, "inner.schedule_progress": "run"}
    out[f"M={n} throughout"] = {"learners": n, "num_devices": n, "data.batch_size": per_learner * n,
                                "total_steps": base.total_steps * m // n,
                                "eval_every": max(base.eval_every * m // n, 1)}
  return out


def run(config: ml_collections.ConfigDict, workdir: str | os.PathLike | None, seeds: Sequence[int],
        growth: Sequence[int], lend_at: float, lend_seconds: float) -> list[dict]:
  """Trains the base and each growth (learners while lent) on every seed; one row per variant (seed means)."""
  base = prepare(config)
  for total in growth:
    if total <= base.learners:
      raise UsageError(f"--growth: {total} learners is no growth of the base's {base.learners}; allowed more")
  if not (lend_at >= 0 and lend_seconds > 0):
    raise UsageError(f"--lend_at={lend_at:g}, --lend_seconds={lend_seconds:g}: allowed lend_at >= 0, lend_seconds > 0")
  devices_lib.configure_simulated_devices(base.num_slices + max(growth, default=base.learners) - base.learners)
  fields = variants(base, growth, lend_at, lend_seconds)
  results: dict[str, list[RunResult]] = {}
  peaks = {}
  for seed in seeds:
    exp = Experiment(with_fields(base, {"seed": seed}))
    for name, changes in fields.items():
      logging.info("scavenging: %s, seed %d", name, seed)
      run_config = with_fields(base, {**changes, "seed": seed})
      peaks[name] = run_config.learners + run_config.lent_slices
      results.setdefault(name, []).append(train_one(run_config, exp, None, f"{name} (seed {seed})"))
  reference = results[f"M={base.learners}"]
  rows = [_row(name, runs, reference, peaks[name]) for name, runs in results.items()]
  title = (f"scavenging: base M={base.learners}, lent from t={lend_at:g} s for {lend_seconds:g} s "
           f"(modeled), K={base.outer.quorum}, H={base.inner_steps}, τ={base.overlap_steps}, {base.token_budget:,} "
           f"tokens, seeds {list(seeds)}")
  curves = {name: runs[0].records for name, runs in results.items()}
  summary.write_experiment(rows, COLUMNS, title, workdir, "scavenging", curves, "modeled",
                           f"eval loss of Θ, seed {seeds[0]}")
  return rows


def time_to_loss(result: RunResult, target: float) -> float:
  """Modeled seconds until Θ's eval loss is first at or below `target` (NaN if never)."""
  return next((r["time"] for r in result.records if r["kind"] == "eval" and r["eval_loss"] <= target), float("nan"))


def _row(name: str, runs: list[RunResult], reference: list[RunResult], peak: int) -> dict:
  mean = lambda values: float(np.mean(values))
  losses = [r.final_eval_loss for r in runs]
  reach = [time_to_loss(r, ref.final_eval_loss) for r, ref in zip(runs, reference)]
  return dict(variant=name, seeds=len(runs), peak_learners=peak, modeled_s=mean([r.virtual_seconds for r in runs]),
              t_to_base_loss_s=mean(reach), speedup=mean([ref.virtual_seconds / t for ref, t in zip(reference, reach)]),
              eval_loss=mean(losses), eval_loss_sd=float(np.std(losses, ddof=1)) if len(runs) > 1 else 0.0,
              **{"vs_base_%": mean([100 * (r.final_eval_loss / ref.final_eval_loss - 1)
                                    for r, ref in zip(runs, reference)])},
              goodput=mean([r.extras["goodput"] for r in runs]), busy_mean=mean([r.extras["busy_mean"] for r in runs]),
              lent_slice_s=mean([r.extras.get("lent_slice_s", 0.0) for r in runs]))
