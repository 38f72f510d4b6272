"""A program error that is no lost slice stops its learner for good; a lost slice is survived; neither loops."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from runtime.cluster import devices as devices_lib
from runtime.experiments import modes
from runtime.diloco import durability as durability_lib
from runtime.diloco.controller import Controller
from runtime.diloco.learner.learner import Learner
from runtime.diloco.learner.lifecycle import FAILED
from runtime.errors import ProgramError
from runtime.train.harness import Experiment
from runtime.faults import injection
from runtime.config.faults import parse_schedule
from runtime.reporting.metrics import without_wall_time
from test_parts_in_flight import _overlapping
from test_resume import _newest_sound_meta

BUG = "INVALID_ARGUMENT: Executable expected parameter 0 of size 1024 but got buffer with incompatible size 2048"


def _controller(config):
  run = modes.prepare(config)
  return Controller(run, Experiment(run), None, "run")


def _faults(result, kind):
  return [f for f in result.details["faults"] if f["fault"] == kind]


@pytest.fixture
def four_learners(tiny_config):
  tiny_config.total_steps = 24
  tiny_config.faults.repair_seconds = 2.0
  return tiny_config


def _fail_from(monkeypatch, method, learners, time=3.0):
  """Learners' `method` ("dispatch" or "collect") raises the same program error whenever called at `time` or later,
  as a deterministic bug does (also after a resume); returns the calls made per learner."""
  real, calls = getattr(Learner, method), {m: 0 for m in learners}

  def failing(learner, *args, **kwargs):
    if learner.index in calls:
      calls[learner.index] += 1
      if args[0 if method == "collect" else 2] >= time:  # collect(now), dispatch(kind, steps, now, ...)
        raise jax.errors.JaxRuntimeError(BUG)
    return real(learner, *args, **kwargs)

  monkeypatch.setattr(Learner, method, failing)
  return calls


def test_a_program_error_at_dispatch_or_when_awaited_stops_its_learner_once_and_the_others_reach_the_budget(
    four_learners, monkeypatch):
  four_learners.outer.quorum = 4  # synchronous: merges must follow the learners still able to report
  controller = _controller(four_learners)
  dispatches = _fail_from(monkeypatch, "dispatch", [1])  # its second round's dispatch, at t=4
  collects = _fail_from(monkeypatch, "collect", [2])  # its first round, awaited at t=4
  result = controller.train()
  stops = _faults(result, "program_error")
  assert sorted((f["learner"], f["detail"]) for f in stops) == [
      (1, f"at dispatch: JaxRuntimeError: {BUG}"), (2, f"awaiting its round: JaxRuntimeError: {BUG}")]
  assert not _faults(result, "crash") and not _faults(result, "rejoin")  # never retried on another slice
  assert dispatches[1] == 2 and collects[2] == 1
  assert result.tokens == controller.run.token_budget  # their unmerged work was trained by the others
  later = [r for r in result.records if r["kind"] == "merge" and r["time"] > stops[-1]["time"]]
  assert later and all(r["alive"] == 2 and set(r["merged"]) <= {0, 3} for r in later)
  assert [r["quorum"] for r in later][:-1] == [2] * (len(later) - 1)  # the last: as learners finish the budget


def test_when_every_learner_stops_on_a_program_error_the_run_stops_naming_them(four_learners, monkeypatch):
  controller = _controller(four_learners)
  _fail_from(monkeypatch, "dispatch", range(4))
  with pytest.raises(ProgramError, match="no learner is left to train") as err:
    controller.train()
  assert all(f"learner {m} (at dispatch: JaxRuntimeError: {BUG})" in str(err.value) for m in range(4))
  assert all(learner.status == FAILED for learner in controller.learners)


def _crash_error() -> Exception:
  """The error an injected slice crash raises: a host callback failing inside a device program."""
  injector, mesh = injection.Injector(1), devices_lib.slice_mesh(jax.devices()[:1])
  injector.arm(0, 0)
  try:
    jax.block_until_ready(jax.jit(injection.device_check(injector, 0, mesh))(
        jax.device_put(np.int32(0), NamedSharding(mesh, P()))))
  except jax.errors.JaxRuntimeError as error:
    return error
  finally:
    injector.settle([mesh.devices.tolist()])
  raise AssertionError("the armed program did not fail")


def test_an_injected_crash_is_a_lost_slice_and_an_injected_bug_is_a_program_error():
  crash = _crash_error()
  assert injection.slice_lost(crash) and injection.slice_lost(injection.RecordedFailure(injection.describe(crash)))
  injector = injection.Injector(2, parse_schedule("bug:learner=1,time=40"))
  injector.check_program(0, 50.0)  # another learner: no bug
  injector.check_program(1, 39.0)  # before its time: no bug
  for now in (40.0, 90.0):  # from its time on, every dispatch fails the same way
    with pytest.raises(jax.errors.JaxRuntimeError, match="INVALID_ARGUMENT: injected program bug") as bug:
      injector.check_program(1, now)
    assert not injection.slice_lost(bug.value)
  assert not injection.slice_lost(jax.errors.JaxRuntimeError(BUG)) and not injection.slice_lost(ValueError(BUG))


def test_pathwaysutils_reads_an_injected_crash_as_a_lost_slice_and_an_injected_bug_not():
  elastic = pytest.importorskip("pathwaysutils.elastic.elastic")
  injector = injection.Injector(1, parse_schedule("bug:learner=0,time=0"))
  with pytest.raises(jax.errors.JaxRuntimeError) as bug:
    injector.check_program(0, 0.0)
  assert elastic.is_error_due_to_slice_down(_crash_error(), log_traceback=False)
  assert not elastic.is_error_due_to_slice_down(bug.value, log_traceback=False)
  assert elastic.is_error_due_to_slice_down(jax.errors.JaxRuntimeError("DATA_LOSS: slice 3 lost"))
  assert injection.slice_lost(jax.errors.JaxRuntimeError("DATA_LOSS: slice 3 lost"))  # a real one, through it


def test_a_scheduled_bug_stops_its_learner_at_its_next_dispatch(tiny_config):
  tiny_config.learners = tiny_config.num_devices = 2
  tiny_config.total_steps = 8
  tiny_config.faults.schedule = "bug:learner=1,time=3"
  result = _controller(tiny_config).train()
  stop, = _faults(result, "program_error")
  assert stop["learner"] == 1 and stop["time"] == pytest.approx(4.0, abs=1e-3)  # its first round ends at 4
  assert stop["detail"].startswith("at dispatch: JaxRuntimeError: INVALID_ARGUMENT: injected program bug in "
                                   "learner 1's round program (bug:learner=1,time=3)")
  assert result.tokens == modes.prepare(tiny_config).token_budget and result.extras["faults"] == 1


def test_a_run_with_a_stopped_learner_killed_and_resumed_ends_bit_identical(tiny_config, tmp_path, monkeypatch):
  tiny_config.learners = tiny_config.num_devices = 2
  tiny_config.total_steps = 12
  tiny_config.checkpoint_every = 2
  _fail_from(monkeypatch, "dispatch", [1])
  reference = modes.train(tiny_config, tmp_path / "reference")[0]
  save = durability_lib.Durability.save

  def dying(self, step):
    if step == 4:
      raise KeyboardInterrupt
    save(self, step)

  with monkeypatch.context() as patch:
    patch.setattr(durability_lib.Durability, "save", dying)
    with pytest.raises(KeyboardInterrupt):
      modes.train(tiny_config, tmp_path / "killed")
  assert [l["status"] for l in _newest_sound_meta(tmp_path / "killed")["learners"]][1] == FAILED
  result = modes.train(tiny_config, tmp_path / "killed")[0]
  metrics = [without_wall_time((p / "decoupled" / "metrics.jsonl").read_text())
             for p in (tmp_path / "reference", tmp_path / "killed")]
  assert metrics[0] == metrics[1] and metrics[0].count('"fault": "program_error"') == 1
  assert result.final_eval_loss == reference.final_eval_loss and result.tokens == reference.tokens


def test_a_learner_stopped_by_a_program_error_gives_back_the_windows_it_leased_and_never_merged(tiny_config):
  # Regression: with the data service a learner stopped for good kept its leases past its last report (what it
  # trained and did not report, and what it had staged ahead): those windows were never trained by anyone.
  tiny_config.learners = tiny_config.num_devices = 2
  tiny_config.total_steps = 16
  tiny_config.data.assignment = "service"
  tiny_config.faults.schedule = "bug:learner=1,time=5"  # after its first round's report
  controller = _controller(tiny_config)
  result = controller.train()
  assert len(_faults(result, "program_error")) == 1
  end = max(b for m, _, b in result.details["merged_ranges"] if m == 1)
  assert end > 0 and len(controller.learners[1].leases()) == end * controller.run.learner_batch(1)
  assert result.tokens == controller.run.token_budget


def test_a_program_error_dispatching_a_queued_part_stops_its_learner_when_the_part_ahead_ends(tiny_config,
                                                                                           monkeypatch):
  """Two parts in flight: the dispatch of learner 1's part queued behind its running overlap part raises a program
  error. That part runs to its end and the learner stops then, once, as one part at a time stops it (its dispatch at
  that part's end fails): the same records and Θ; before, the running part was cut off at the failed dispatch."""
  failed, real = [], Learner.dispatch

  def failing(learner, kind, steps, now, *args, **kwargs):
    if learner.index == 1 and now >= 3.0:
      failed.append((now, len(learner.parts)))
      raise jax.errors.JaxRuntimeError(BUG)
    return real(learner, kind, steps, now, *args, **kwargs)

  monkeypatch.setattr(Learner, "dispatch", failing)
  runs = {}
  for depth in (1, 2):
    failed.clear()
    config = _overlapping(tiny_config, depth)
    runs[depth] = _controller(config).train(), list(failed)
  (one, one_failed), (two, two_failed) = runs[1], runs[2]
  assert [parts for _, parts in one_failed] == [0] and [parts for _, parts in two_failed] == [1]
  assert two_failed[0][0] < one_failed[0][0]  # (queued while its overlap part ran)
  stop, = _faults(one, "program_error")
  assert stop["time"] == one_failed[0][0]
  for a, b in zip(one.records, two.records, strict=True):  # (modeled times summed in another order: see the test)
    assert a.keys() == b.keys() and a["kind"] == b["kind"]
    for key in set(a) - {"wall_time"}:
      if key in ("time", "grace", "busy", "goodput"):
        np.testing.assert_allclose(a[key], b[key], rtol=1e-12)
      else:
        assert a[key] == b[key], (key, a, b)
  for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(two.params), strict=True):
    np.testing.assert_array_equal(a, b)
