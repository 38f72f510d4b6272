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

Under the real clock (clock.kind='real') the rows are data-parallel and Decoupled DiLoCo, replayed in wall time
with real failures (device errors of the running programs). A failure-free run of each row first measures its wall
seconds per step and its goodput without failures, `runtime_calm` (what real time costs that the model leaves out:
merges, Θ's transfers, evaluations, checkpoint saves). The row's traces are drawn as under the virtual clock, in
modeled seconds, over a horizon stretched by 2 / runtime_calm (restores and stalls stretch a replay further);
faults.time_scale (and with it the restart, reconfiguration and spare-swap costs) is the measured step over
clock.step_seconds, so failures, repairs and costs stand to the steps as they do in the model. The runtime's wall
time to the budget, scaled back, is where the simulator cuts the trace, and the `runtime` column is the replay's
goodput over runtime_calm: what the failures cost.
Elastic DP is left out there: each new set of slices needs a compile, which at this scale's short reconfigurations
would be measured, not modeled.
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


REAL_COLUMNS = COLUMNS + ("runtime_calm", "wall_step_ms", "host_load")


def rows(learners: Sequence[int], real: bool = False) -> tuple[Setup, ...]:
  elastic = () if real else (Setup("elastic data-parallel", "elastic", 1),)
  return ((Setup("data-parallel", "data-parallel", 1), *elastic)
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


def runtime_fields(setup: Setup, trace: trace_lib.FailureTrace, path: str, devices_per_slice: int = 1) -> dict:
  """The run that replays `trace` for `setup`: its slices (of `devices_per_slice` devices each) and spares, its
  mode."""
  f = {"faults.trace": path, "faults.mtbi_chip_seconds": 0.0,
       "num_devices": (trace.slices + trace.spares) * devices_per_slice, "slices": trace.slices + trace.spares}
  if setup.kind == "decoupled":
    # Data from the service: a learner slowed by a lost slice takes fewer windows instead of holding a fixed share
    # that the others, done, would wait for (the simulator's learners never run out of work before the end).
    return {**f, "mode": "decoupled", "learners": setup.learners, "slices_per_learner": trace.slices_per_learner,
            "data.assignment": "service"}
  return {**f, "mode": "dp_restart" if setup.kind == "data-parallel" else "dp_elastic", "learners": trace.slices}


def failure_free(run: RunConfig, name: str) -> tuple[float, float]:
  """(wall seconds per step, goodput) of `run` without failures under the real clock."""
  calm = with_fields(run, {"faults.trace": "", "faults.mtbi_chip_seconds": 0.0, "seed": 0})
  extras = train_one(calm, Experiment(calm), None, f"{name}, failure-free").extras
  return extras["step_seconds"], extras["goodput"]


def scaled(run: RunConfig, scale: float) -> RunConfig:
  """`run` with its trace and fault costs scaled by `scale` onto the run's clock."""
  f = run.faults
  return with_fields(run, {"faults.time_scale": scale, "faults.restart_seconds": f.restart_seconds * scale,
                           "faults.reconfig_seconds": f.reconfig_seconds * scale,
                           "faults.spare_swap_seconds": f.spare_swap_seconds * scale})


def cut(trace: trace_lib.FailureTrace, end: float) -> trace_lib.FailureTrace:
  """The trace up to modeled time `end` (failures after it dropped)."""
  keep = trace.fail_s < end
  return dataclasses.replace(trace, horizon_s=end, slice_of=trace.slice_of[keep], fail_s=trace.fail_s[keep],
                             repaired_s=trace.repaired_s[keep])


def run(config: ml_collections.ConfigDict, workdir: str | os.PathLike | None, seeds: Sequence[int],
        learners: Sequence[int], slices: int, spares: int, horizon_factor: float, interval_seeds: int,
        devices_per_slice: int = 1) -> list[dict]:
  """Replays each row's trace of each seed in the runtime; prints runtime vs simulator goodput, one row each."""
  base = prepare(config)
  if base.faults.mtbi_chip_seconds <= 0:
    raise UsageError("--config.faults.mtbi_chip_seconds: allowed > 0 (the simulator draws the traces from it)")
  real = base.clock.kind == "real"
  for m in learners:
    if m < 1 or slices % m:
      raise UsageError(f"--learners={m}: allowed divisors of --slices={slices} (each learner gets slices / M)")
  if horizon_factor < 1:
    raise UsageError(f"--horizon_factor={horizon_factor:g}: allowed >= 1")
  if devices_per_slice < 1:
    raise UsageError(f"--devices_per_slice={devices_per_slice}: allowed >= 1")
  devices_lib.configure_simulated_devices((slices + spares) * devices_per_slice)
  horizon = horizon_factor * base.total_steps * base.clock.step_seconds  # failure-free time to the budget × factor
  out = []
  with tempfile.TemporaryDirectory(prefix="traces-") as traces:
    for setup in rows(learners, real):
      swaps = setup.kind == "data-parallel" or (setup.kind == "decoupled" and base.faults.learner_recovery == "restart")
      sim = sim_config(base, slices, spares if swaps else 0, horizon, interval_seeds)
      chips = slices * base.faults.chips_per_slice
      wall, calm = base.clock.step_seconds, 1.0  # (the real clock's are measured: the row's step, its overheads)
      if real:  # a trace of the row for its fields (slices, spares, learners' slices); failures are not replayed
        probe = runtime_fields(setup, trace_lib.draw(sim, setup, chips, seeds[0]), "", devices_per_slice)
        wall, calm = failure_free(with_fields(base, probe), setup.name)
        sim = dataclasses.replace(sim, horizon_days=2 * sim.horizon_days / calm)  # (its overheads stretch its time)
      scale = wall / base.clock.step_seconds  # (1 under the virtual clock)
      results = []
      for seed in seeds:
        trace = trace_lib.draw(sim, setup, chips, seed)
        path = pathlib.Path(traces) / f"{setup.kind}-{setup.learners}-{seed}.json"
        path.write_text(trace_lib.to_json(trace))
        fields = {**runtime_fields(setup, trace, str(path), devices_per_slice), "seed": seed}
        if setup.kind == "decoupled":
          fields["faults.spare_swap_seconds"] = base.faults.restart_seconds
        logging.info("sim vs runtime: %s, seed %d (%d failures)", setup.name, seed, trace.fail_s.size)
        run_config = with_fields(base, fields)
        run_config = scaled(run_config, scale) if real else run_config
        result = train_one(run_config, Experiment(run_config), None, f"{setup.name} (seed {seed})")
        end = result.extras["run_seconds"] / scale if real else result.virtual_seconds
        if end > trace.horizon_s:
          raise UsageError(f"--horizon_factor={horizon_factor:g}: {setup.name} (seed {seed}) ran to t={end:.0f} s, "
                           f"past the trace's {trace.horizon_s:.0f} s; allowed a larger factor")
        same, _ = sim_model.evaluate(sim, cut(trace, end))
        step_loss, _ = sim_model.evaluate(dataclasses.replace(sim, inflight_steps=1), cut(trace, end))
        measured = dict(wall_step_ms=1e3 * wall, runtime_calm=100 * calm, host_load=os.getloadavg()[0]) if real else {}
        results.append((seed, trace, end, result.extras["goodput"] / calm, same, step_loss, measured))
      spread = sim_model.simulate(dataclasses.replace(
          sim, horizon_days=float(np.mean([r[2] for r in results])) / sim_config_lib.SECONDS_PER_DAY), setup, chips)
      lo, hi = np.percentile(spread.goodput, [2.5, 97.5])
      for seed, trace, end, goodput, same, step_loss, measured in results:
        out.append(dict(setup=setup.name, seed=seed, failures=int(np.sum(trace.fail_s < end)), modeled_s=end,
                        runtime=100 * goodput, sim_same_trace=100 * same, **{"runtime-sim": 100 * (goodput - same)},
                        sim_lo95=100 * lo, sim_hi95=100 * hi,
                        agrees="yes" if lo <= goodput <= hi or abs(goodput - same) * 100 <= AGREE_POINTS else "NO",
                        sim_step_loss=100 * step_loss, **measured))
  title = (f"goodput (%), simulator vs runtime on one trace: {slices} slices of {base.faults.chips_per_slice} chips "
           f"(+{spares} spares where failed slices are swapped), chip MTBI {base.faults.mtbi_chip_seconds:g} s, repair "
           f"{base.faults.repair_seconds:g} s, restart {base.faults.restart_seconds:g} s, reconfiguration "
           f"{base.faults.reconfig_seconds:g} s, H={base.inner_steps}, learners {base.faults.learner_recovery}; sim "
           f"range: 2.5-97.5% of {interval_seeds} traces")
  if real:
    title += (f"; the runtime under the real clock on {devices_per_slice} simulated device(s) per slice, each row's "
              "trace scaled onto its wall step time")
  summary.write_experiment(out, REAL_COLUMNS if real else COLUMNS, title, workdir, "sim_vs_runtime", {}, "modeled", "")
  agreed = sum(r["agrees"] == "yes" for r in out)
  print(f"{agreed} of {len(out)} rows agree (inside the simulator's 95% range or within {AGREE_POINTS:g} points of "
        f"its figure on the same trace).")
  return out
