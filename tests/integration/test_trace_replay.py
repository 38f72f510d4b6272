"""A recorded failure trace (the goodput simulator's JSON) replayed by the runtime: exact times, exact repairs."""

import json

import pytest

from runtime.config import run as config_lib
from runtime.experiments import modes
from runtime.errors import ConfigError
from runtime.train.harness import Experiment


def _trace(tmp_path, failures: dict[int, list[list[float]]], slices: int, learners: int = 1, kind: str = "elastic",
           syncer=()) -> str:
  """Writes a trace in `runtime/sim/trace.py`'s format; `failures` maps slice -> [[fail, repaired], ...]."""
  path = tmp_path / "trace.json"
  path.write_text(json.dumps({
      "format": "goodput-failure-trace/1", "setup": "test", "kind": kind, "learners": learners, "spares": 0,
      "slice_chips": 256.0, "step_s": 1.0, "horizon_s": 1000.0, "syncer_failures": [list(s) for s in syncer],
      "slices": [{"slice": s, "learner": s * learners // slices, "failures": failures.get(s, [])}
                 for s in range(slices)]}))
  return str(path)


def _run(config, name="run"):
  run = modes.prepare(config)
  return modes.train_one(run, Experiment(run), None, name)


@pytest.mark.slow  # CI time (~30 s); tests/experiments/test_sim_vs_runtime.py replays a trace on elastic DP by default
def test_elastic_dp_replays_the_traces_failure_and_its_repair_time(tiny_config, tmp_path):
  """The same failure as test_dp's drawn one (slice 1 at 5.5, back at 10.5), read from a trace: the same 41.5 s."""
  tiny_config.mode = "dp_elastic"
  tiny_config.total_steps = 24
  tiny_config.faults.reconfig_seconds = 8.0
  tiny_config.faults.repair_seconds = 999.0  # the trace's repair time is the one replayed
  tiny_config.faults.trace = _trace(tmp_path, {1: [[5.5, 10.5]]}, slices=4)
  result = _run(tiny_config, "dp")
  assert result.virtual_seconds == pytest.approx(41.5)
  assert result.extras["faults"] == 1


def test_dp_restart_with_one_spare_waits_when_two_slices_are_down(tiny_config, tmp_path):
  """One spare covers one failed slice, not two: with slices 1 and 2 in repair the job waits for the first back."""
  tiny_config.mode = "dp_restart"
  tiny_config.slices = tiny_config.num_devices = 5  # 4 trained on, 1 hot spare
  tiny_config.total_steps = 24
  tiny_config.faults.restart_seconds = 2.0
  tiny_config.faults.restart_checkpoint_every = 10
  tiny_config.faults.trace = _trace(tmp_path, {1: [[5.5, 25.5]], 2: [[9.0, 29.0]]}, slices=4)
  result = _run(tiny_config, "dp")
  # Crash at 5.5, restart (+2) on the spare from step 0; crash at 9.0: the spare stands in for slice 1 until its
  # repair (25.5), so the job waits for it, restarts (+2) and trains all 24 steps from the step-0 checkpoint.
  assert result.virtual_seconds == pytest.approx(25.5 + 2 + 24)
  assert result.extras["faults"] == 2


def test_decoupled_learners_crash_at_the_traces_times_and_rejoin_when_its_repairs_end(tiny_config, tmp_path):
  tiny_config.learners = 2
  tiny_config.num_devices = 2
  tiny_config.total_steps = 24
  tiny_config.faults.repair_seconds = 999.0
  tiny_config.faults.trace = _trace(tmp_path, {1: [[6.5, 16.5]], 0: [[20.25, 23.0]]}, slices=2, learners=2,
                                    kind="decoupled")
  result = _run(tiny_config)
  faults = [(f["fault"], f["learner"], f["time"]) for f in result.details["faults"]]
  assert faults == [("crash", 1, 6.5), ("rejoin", 1, 16.5), ("crash", 0, 20.25), ("rejoin", 0, 23.0)]
  assert result.tokens >= tiny_config.total_steps * tiny_config.data.batch_size * tiny_config.data.seq_len


@pytest.mark.parametrize("change,field", [
    (lambda c, p: setattr(c.faults, "trace", str(p / "missing.json")), "faults.trace"),
    (lambda c, p: setattr(c.faults, "mtbi_chip_seconds", 100.0), "faults.mtbi_chip_seconds"),
    (lambda c, p: setattr(c, "learners", 2), "faults.trace"),  # a trace of 4 slices on a run of 2
    (lambda c, p: (p / "trace.json").write_text("{"), "trace"),
])
def test_a_bad_trace_or_a_clash_is_refused_naming_the_field(tiny_config, tmp_path, change, field):
  tiny_config.faults.trace = _trace(tmp_path, {}, slices=4)
  change(tiny_config, tmp_path)
  with pytest.raises(ConfigError, match=field):
    config_lib.validate(config_lib.from_config_dict(tiny_config))


def test_a_trace_with_syncer_failures_is_refused_as_not_replayed(tiny_config, tmp_path):
  tiny_config.faults.trace = _trace(tmp_path, {}, slices=4, syncer=[[10.0, 20.0]])
  with pytest.raises(ConfigError, match="syncer_failures"):
    config_lib.validate(config_lib.from_config_dict(tiny_config))
