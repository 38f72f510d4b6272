"""One failure trace, two engines: the goodput simulator and the runtime side by side.

For each seed and row (data-parallel, elastic data-parallel, Decoupled M learners on the same slices), the
simulator draws the failure trace of the row's slices; the runtime replays it in virtual time with real JAX
programs (`faults.trace`) until its token budget, at modeled time E; the simulator evaluates the same trace cut
at E, and gives its 95% range over many traces of length E. Both read one set of costs, the run config's:
faults.{mtbi_chip_seconds, chips_per_slice, repair_seconds, restart_seconds, reconfig_seconds,
restart_checkpoint_every, learner_recovery}, inner_steps (H) and clock.step_seconds. A restarting learner's spare
takes restart_seconds (the simulator's restart_s), not spare_swap_seconds. A reconfiguring learner loses the part
of its round in flight (H - τ steps at most: the smallest unit the runtime dispatches), so the simulator runs with
inflight_steps = H - τ; `sim_step_loss` is its figure for the paper's loss of one step, the difference that
granularity makes.
"""

import dataclasses
import os
import pathlib
import tempfile
from typing import Sequence

import ml_collections
import numpy as np
from absl import logging

from runtime.cluster import devices as devices_lib
from runtime.reporting import summary
from runtime.config.run import RunConfig, with_fields
from runtime.errors import UsageError
from runtime.train.harness import Experiment
from runtime.experiments.modes import prepare, train_one
from runtime.sim import config as sim_config_lib
from runtime.sim import model as sim_model
from runtime.sim import trace as trace_lib
from runtime.sim.config import ClusterSimConfig, Setup

COLUMNS = ("setup", "seed", "failures", "modeled_s", "runtime", "sim_same_trace", "runtime-sim", "sim_lo95",
           "sim_hi95", "agrees", "sim_step_loss")
AGREE_POINTS = 2.0  # or inside the simulator's 95% range


def rows(learners: Sequence[int]) -> tuple[Setup, ...]:
  return ((Setup("data-parallel", "data-parallel", 1), Setup("elastic data-parallel", "elastic", 1))
          + tuple(Setup(f"Decoupled M={m}", "decoupled", m) for m in learners))


def sim_config(run: RunConfig, slices: int, spares: int, horizon_s: float, seeds: int) -> ClusterSimConfig:
  """The simulator's settings from the run's costs; no syncer failures, jitter or round wait (none replayed)."""
  f = run.faults
  return ClusterSimConfig(
      mtbi_years=f.mtbi_chip_seconds / sim_config_lib.SECONDS_PER_YEAR, chips=(slices * f.chips_per_slice,),
      learners=(1,), quorum=run.outer.quorum, slice_chips=f.chips_per_slice, repair_s=f.repair_seconds,
      step_s=run.clock.step_seconds, restart_s=f.restart_seconds, reconfig_s=f.reconfig_seconds,
      checkpoint_every_steps=f.restart_checkpoint_every, sync_every_steps=run.inner_steps,
      inflight_steps=run.inner_steps - run.overlap_steps,  # a reconfiguring learner loses the part in flight
      learner_recovery=f.learner_recovery, spare_fraction=spares / slices, round_wait_s=0.0, syncer_mtbi_days=0.0,
      syncer_restart_s=0.0, speed_jitter=0.0, horizon_days=horizon_s / sim_config_lib.SECONDS_PER_DAY, seeds=seeds,
      seed=run.seed, calibrate=False, calibration_chips=sim_config_lib.PAPER_CHIPS[0])


def runtime_fields(setup: Setup, trace: trace_lib.FailureTrace, path: str) -> dict:
  """The run that replays `trace` for `setup`: its slices (one device each) and spares, its mode."""
  f = {"faults.trace": path, "faults.mtbi_chip_seconds": 0.0, "num_devices": trace.slices + trace.spares,
       "slices": trace.slices + trace.spares}
  if setup.kind == "decoupled":
    # Data from the service: a learner slowed by a lost slice takes fewer windows instead of holding a fixed share
    # that the others, done, would wait for (the simulator's learners never run out of work before the end).
    return {**f, "mode": "decoupled", "learners": setup.learners, "slices_per_learner": trace.slices_per_learner,
            "data.assignment": "service"}
  return {**f, "mode": "dp_restart" if setup.kind == "data-parallel" else "dp_elastic", "learners": trace.slices}


def cut(trace: trace_lib.FailureTrace, end: float) -> trace_lib.FailureTrace:
  """The trace up to modeled time `end` (failures after it dropped)."""
  keep = trace.fail_s < end
  return dataclasses.replace(trace, horizon_s=end, slice_of=trace.slice_of[keep], fail_s=trace.fail_s[keep],
                             repaired_s=trace.repaired_s[keep])


def run(config: ml_collections.ConfigDict, workdir: str | os.PathLike | None, seeds: Sequence[int],
        learners: Sequence[int], slices: int, spares: int, horizon_factor: float, interval_seeds: int) -> list[dict]:
  """Replays each row's trace of each seed in the runtime; prints runtime vs simulator goodput, one row each."""
  base = prepare(config)
  if base.faults.mtbi_chip_seconds <= 0:
    raise UsageError("--config.faults.mtbi_chip_seconds: allowed > 0 (the simulator draws the traces from it)")
  if base.clock.kind != "virtual":  # (its DP rows model their faults' time; a real-time comparison is not built)
    raise UsageError(f"--config.clock.kind={base.clock.kind}: allowed 'virtual' (the simulator's goodput is compared "
                     "with the runtime's in modeled time; the DP baselines do not inject faults in wall time yet)")
  for m in learners:
    if m < 1 or slices % m:
      raise UsageError(f"--learners={m}: allowed divisors of --slices={slices} (each learner gets slices / M)")
  if horizon_factor < 1:
    raise UsageError(f"--horizon_factor={horizon_factor:g}: allowed >= 1")
  devices_lib.configure_simulated_devices(slices + spares)
  horizon = horizon_factor * base.total_steps * base.clock.step_seconds  # failure-free time to the budget × factor
  out = []
  with tempfile.TemporaryDirectory(prefix="traces-") as traces:
    for setup in rows(learners):
      swaps = setup.kind == "data-parallel" or (setup.kind == "decoupled" and base.faults.learner_recovery == "restart")
      sim = sim_config(base, slices, spares if swaps else 0, horizon, interval_seeds)
      chips = slices * base.faults.chips_per_slice
      results = []
      for seed in seeds:
        trace = trace_lib.draw(sim, setup, chips, seed)
        path = pathlib.Path(traces) / f"{setup.kind}-{setup.learners}-{seed}.json"
        path.write_text(trace_lib.to_json(trace))
        fields = {**runtime_fields(setup, trace, str(path)), "seed": seed}
        if setup.kind == "decoupled":
          fields["faults.spare_swap_seconds"] = base.faults.restart_seconds
        logging.info("sim vs runtime: %s, seed %d (%d failures)", setup.name, seed, trace.fail_s.size)
        run_config = with_fields(base, fields)
        result = train_one(run_config, Experiment(run_config), None, f"{setup.name} (seed {seed})")
        end = result.virtual_seconds
        if end > horizon:
          raise UsageError(f"--horizon_factor={horizon_factor:g}: {setup.name} (seed {seed}) ran to t={end:.0f} s, "
                           f"past the trace's {horizon:.0f} s; allowed a larger factor")
        same, _ = sim_model.evaluate(sim, cut(trace, end))
        step_loss, _ = sim_model.evaluate(dataclasses.replace(sim, inflight_steps=1), cut(trace, end))
        results.append((seed, trace, end, result.extras["goodput"], same, step_loss))
      spread = sim_model.simulate(dataclasses.replace(
          sim, horizon_days=float(np.mean([r[2] for r in results])) / sim_config_lib.SECONDS_PER_DAY), setup, chips)
      lo, hi = np.percentile(spread.goodput, [2.5, 97.5])
      for seed, trace, end, goodput, same, step_loss in results:
        out.append(dict(setup=setup.name, seed=seed, failures=int(np.sum(trace.fail_s < end)), modeled_s=end,
                        runtime=100 * goodput, sim_same_trace=100 * same, **{"runtime-sim": 100 * (goodput - same)},
                        sim_lo95=100 * lo, sim_hi95=100 * hi,
                        agrees="yes" if lo <= goodput <= hi or abs(goodput - same) * 100 <= AGREE_POINTS else "NO",
                        sim_step_loss=100 * step_loss))
  title = (f"goodput (%), simulator vs runtime on one trace: {slices} slices of {base.faults.chips_per_slice} chips "
           f"(+{spares} spares where failed slices are swapped), chip MTBI {base.faults.mtbi_chip_seconds:g} s, repair "
           f"{base.faults.repair_seconds:g} s, restart {base.faults.restart_seconds:g} s, reconfiguration "
           f"{base.faults.reconfig_seconds:g} s, H={base.inner_steps}, learners {base.faults.learner_recovery}; sim "
           f"range: 2.5-97.5% of {interval_seeds} traces")
  summary.write_experiment(out, COLUMNS, title, workdir, "sim_vs_runtime", {}, "modeled", "")
  agreed = sum(r["agrees"] == "yes" for r in out)
  print(f"{agreed} of {len(out)} rows agree (inside the simulator's 95% range or within {AGREE_POINTS:g} points of "
        f"its figure on the same trace).")
  return out
