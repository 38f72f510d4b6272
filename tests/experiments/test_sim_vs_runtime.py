"""The goodput simulator and the runtime on one failure trace (runtime/experiments/sim_vs_runtime.py)."""

import pathlib

import numpy as np
import pytest

from runtime.experiments import sim_vs_runtime as validation
from runtime.config.run import with_fields
from runtime.errors import UsageError
from runtime.train.harness import Experiment
from runtime.experiments.modes import prepare, train_one
from runtime.sim import model as sim_model
from runtime.sim import trace as trace_lib


@pytest.fixture
def replay(tiny_config, tmp_path):
  """Replays the simulator's trace of a setup (seed 0, 4 slices, a failure per slice every 40 s) in the runtime."""
  tiny_config.faults.mtbi_chip_seconds = 40.0 * 256
  tiny_config.faults.repair_seconds = 15.0
  tiny_config.faults.restart_seconds = 6.0
  tiny_config.faults.reconfig_seconds = 2.0
  tiny_config.faults.restart_checkpoint_every = 5
  tiny_config.total_steps = 30
  tiny_config.eval_every = 30

  def go(setup, spares):
    base = prepare(tiny_config)
    sim = validation.sim_config(base, 4, spares, horizon_s=400.0, seeds=4)
    trace = trace_lib.draw(sim, setup, 4 * 256, 0)
    path = pathlib.Path(tmp_path) / "trace.json"
    path.write_text(trace_lib.to_json(trace))
    run = with_fields(base, {**validation.runtime_fields(setup, trace, str(path)), "seed": 0})
    result = train_one(run, Experiment(run), None, setup.name)
    cut = validation.cut(trace, result.virtual_seconds)
    assert cut.fail_s.size >= 1  # the trace tests something
    return result, sim_model.evaluate(sim, cut)[0]
  return go


def test_restarting_dp_replays_the_trace_to_the_simulators_goodput(replay):
  """DP with one hot spare loses exactly what the simulator says on the same failures: rollbacks to its
  checkpoints, waits for a spare or a repair, restarts."""
  result, simulated = replay(validation.rows(())[0], 1)
  assert result.extras["goodput"] == pytest.approx(simulated, abs=1e-9)
  assert 0.1 < simulated < 0.9


def test_elastic_dp_replays_the_trace_to_within_a_point_of_the_simulators_goodput(replay):
  """Elastic DP on the same failures loses what the simulator says it loses (the runtime re-adds a repaired slice at
  its next step boundary, the simulator at the repair: a fraction of a point here)."""
  result, simulated = replay(validation.rows(())[1], 0)
  assert result.extras["goodput"] == pytest.approx(simulated, abs=0.01)
  assert 0.3 < simulated < 0.9


def test_cut_keeps_the_failures_before_the_end_only():
  trace = trace_lib.FailureTrace(validation.rows(())[0], 2, 0, 256.0, 1.0, 100.0, np.array([0, 1, 1]),
                                 np.array([10.0, 20.0, 70.0]), np.array([40.0, 50.0, 90.0]), np.zeros((0, 2)))
  cut = validation.cut(trace, 60.0)
  assert cut.horizon_s == 60.0 and cut.fail_s.tolist() == [10.0, 20.0] and cut.slice_of.tolist() == [0, 1]


def test_learners_that_do_not_divide_the_slices_are_refused_naming_the_flag(tiny_config):
  tiny_config.faults.mtbi_chip_seconds = 1e5
  with pytest.raises(UsageError, match="--learners=3"):
    validation.run(tiny_config, None, [0], [3], 8, 1, 4.0, 10)


@pytest.mark.slow  # four real-clock runs, ~75 s on 2 cores; the real-clock DP and chaos runs are in the default suite
def test_under_the_real_clock_dp_and_decoupled_replay_their_traces_in_wall_time_with_their_overheads_measured(
    tiny_config):
  tiny_config.faults.mtbi_chip_seconds = 40.0 * 256  # a failure per slice every 40 modeled seconds
  tiny_config.faults.repair_seconds = 15.0
  tiny_config.faults.reconfig_seconds = 2.0
  tiny_config.faults.restart_checkpoint_every = 5
  tiny_config.total_steps = 30
  tiny_config.eval_every = 30
  tiny_config.outer.quorum = 1
  tiny_config.clock.kind = "real"
  rows = validation.run(tiny_config, None, [0], [2], 4, 1, 4.0, 10)
  assert [r["setup"] for r in rows] == ["data-parallel", "Decoupled M=2"]  # (no elastic DP in wall time)
  for row in rows:
    assert row["failures"] >= 1  # the trace tests something
    assert row["wall_step_ms"] > 0 and 0 < row["runtime_calm"] <= 100
    assert 0 < row["runtime"] <= 110 and row["sim_lo95"] <= row["sim_hi95"]


def test_scaling_a_run_onto_wall_time_scales_its_trace_and_every_fault_cost(tiny_config):
  run = with_fields(prepare(tiny_config), {"faults.restart_seconds": 20.0, "faults.reconfig_seconds": 5.0,
                                           "faults.spare_swap_seconds": 3.0})
  f = validation.scaled(run, 0.01).faults
  assert (f.time_scale, f.restart_seconds, f.reconfig_seconds, f.spare_swap_seconds) == pytest.approx(
      (0.01, 0.2, 0.05, 0.03))
