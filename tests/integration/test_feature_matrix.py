"""Every feature under both clocks, with the same invariants: the budget is merged, no token is lost or merged twice
(merged ranges tile each learner's stream, or every data-service window is accounted for), and every planned fault
is recorded at its time: exactly under the virtual clock, within TOLERANCE_S after it under the real one (a crash
surfaces as its program's device error, at the program's next inner step or its end).

Both clocks run on the same time scale: modeled steps of 10 ms (about what a tiny step takes here) and a 50 ms link
each way, so every round takes at least 0.1 s under either clock and fault times between 0.3 s and 1 s fall inside
a run of about 2 s under both.
"""

import itertools
import math

import pytest

from invariants import assert_data_accounted, assert_ranges_tile
from test_trace_replay import _trace
from runtime.experiments import modes
from runtime.faults import replay
from runtime.diloco import rounds as rounds_lib
from runtime.train import preemption

TOLERANCE_S = 1.0  # real clock: a fault's record is this late at most (a 2-core box running 4 simulated devices)
CLOCKS = ("virtual", "real")


def _base(config, clock):
  config.clock.kind = clock
  config.learners, config.num_devices, config.slices = 2, 4, 4  # two spare slices
  config.data.batch_size = 8
  config.total_steps, config.inner_steps = 48, 4
  config.clock.step_seconds, config.clock.latency_s = 0.01, 0.05
  config.outer.quorum = 1
  config.eval_every = 10_000  # (the final evaluation only)
  config.faults.repair_seconds, config.faults.spare_swap_seconds = 0.3, 0.1
  config.faults.report_timeout_seconds = 0.2
  return config


def _random_crashes(config, *_):
  config.faults.mtbi_chip_seconds = 0.8 * config.faults.chips_per_slice  # a slice fails every 0.8 s on average


def _crash_and_straggler(config, *_):
  config.faults.schedule = "crash:learner=1,time=0.5;straggler:learner=0,time=0.3,duration=0.6,factor=3"


def _corrupt_report(config, *_):
  config.faults.schedule = "corrupt:learner=1,time=0.4,how=nan"


def _link_drop(config, *_):
  config.faults.schedule = "link:learner=0,time=0.3,duration=2.0,mode=drop"  # (rounds of 0.1 s or, loaded, 0.6 s)


def _lent_slices(config, *_):
  config.slices = 0
  config.data.assignment = "service"
  config.capacity.schedule = "lend:slices=2,time=0.3,duration=0.6"


def _fragments(config, *_):
  config.fragments = 2


def _several_slices(config, *_):
  config.slices, config.slices_per_learner = 0, 2
  config.faults.reconfig_seconds = 0.1
  config.faults.schedule = "crash:learner=1,time=0.5,slice=1"


def _compression(config, *_):
  config.compression.up, config.compression.down = "int4", "int8"


def _replayed_trace(config, tmp_path):
  """The simulator's trace of learner 1's slice failing at 4 s and repaired at 7 s, replayed at a tenth of its time."""
  config.faults.trace = _trace(tmp_path, {1: [[4.0, 7.0]]}, slices=4, learners=2, kind="decoupled")
  config.faults.time_scale = 0.1


FEATURES = {  # name: (settings, the fault records its plan leads to)
    "random_crashes": (_random_crashes, {"crash"}),
    "replayed_trace": (_replayed_trace, {"crash", "rejoin"}),
    "crash_and_straggler": (_crash_and_straggler, {"crash", "straggler"}),
    "corrupt_report": (_corrupt_report, {"corrupt", "quarantine"}),
    "link_drop": (_link_drop, {"link", "link_drop"}),
    "lent_slices": (_lent_slices, {"join"}),
    "fragments": (_fragments, set()),
    "several_slices": (_several_slices, {"shrink"}),
    "compression": (_compression, set()),
}


def _planned(run, end):
  """(kind, time) of each scheduled fault and lend due while the run lasted (until `end`, less the tolerance)."""
  planned = []
  for f in run.faults.schedule:
    planned.append(("shrink" if f.slice >= 0 else f.kind, f.time))
    if f.kind == "straggler":
      planned.append(("straggler", f.time + f.duration))
  for lend in run.capacity.schedule:
    planned += [("join", lend.time), ("leave", lend.time + lend.duration)]
  if run.faults.trace:  # (its slices are the learners' own here: each failure crashes one)
    faults = run.faults
    planned += [("crash", at) for s in range(run.num_slices) for at, _ in replay.slice_failures(faults, s, run.seed)]
  return [(kind, at) for kind, at in planned if at < end - TOLERANCE_S]


def _on_time(at, times, clock):
  """Whether a record of `times` is the fault planned `at`: exactly (virtual clock), or within tolerance after it."""
  if clock == "virtual":
    return any(math.isclose(t, at, abs_tol=1e-9) for t in times)
  return any(at <= t <= at + TOLERANCE_S for t in times)


def _assert_recorded(run, result, clock):
  """Every planned fault due while the run lasted is in its records at its time; every random crash recorded is one
  of its slices' trace (a slice that fails idle, a spare, fails no learner and leaves no record)."""
  faults = result.details["faults"]
  end = max(r["time"] for r in result.records if r["kind"] == "merge")
  for kind, at in _planned(run, end):
    assert _on_time(at, [f["time"] for f in faults if f["fault"] == kind], clock), (kind, at, faults)
  if run.faults.mtbi_chip_seconds:
    drawn = (replay.slice_failures(run.faults, s, run.seed) for s in range(run.num_slices))
    trace = [at for failures in drawn for at, _ in itertools.takewhile(lambda f: f[0] <= end, failures)]
    for crash in (f for f in faults if f["fault"] == "crash"):
      assert any(_on_time(at, [crash["time"]], clock) for at in trace), (crash, trace)


def _assert_nothing_lost(run, result):
  assert result.tokens == run.token_budget
  if run.data.assignment == "service":
    assert_data_accounted(result, run.data.seq_len)
  else:
    assert_ranges_tile(result, learners=range(run.learners))


SLOW = {("several_slices", "virtual"), ("several_slices", "real"), ("random_crashes", "real")}  # 20-40 s each here


@pytest.mark.parametrize("feature,clock", [
    pytest.param(f, c, marks=[pytest.mark.slow] if (f, c) in SLOW else []) for f in sorted(FEATURES) for c in CLOCKS])
def test_a_feature_keeps_the_runs_invariants_under_either_clock(tiny_config, tmp_path, feature, clock):
  settings, kinds = FEATURES[feature]
  config = _base(tiny_config, clock)
  settings(config, tmp_path)
  run = modes.prepare(config)
  result = modes.train(config, tmp_path)[0]
  _assert_nothing_lost(run, result)
  assert kinds <= {f["fault"] for f in result.details["faults"]}, result.details["faults"]
  _assert_recorded(run, result, clock)
  assert math.isfinite(result.final_eval_loss)


@pytest.mark.parametrize("clock", CLOCKS)
def test_a_run_stopped_mid_round_resumes_from_its_checkpoint_under_either_clock(tiny_config, tmp_path, monkeypatch,
                                                                               clock):
  config = _base(tiny_config, clock)
  _crash_and_straggler(config)
  config.checkpoint_every = 4
  on_part_done, seen = rounds_lib.Rounds.on_part_done, []

  def and_stop(self, event, now):
    on_part_done(self, event, now)
    seen.append(1)
    if len(seen) == 9:
      preemption._requested.append(15)  # pylint: disable=protected-access  # (what SIGTERM's handler records)

  with monkeypatch.context() as patch:
    patch.setattr(rounds_lib.Rounds, "on_part_done", and_stop)
    with pytest.raises(preemption.Interrupted):
      modes.train(config, tmp_path)
    preemption._requested.clear()  # pylint: disable=protected-access
  result = modes.train(config, tmp_path)[0]
  _assert_nothing_lost(modes.prepare(config), result)
