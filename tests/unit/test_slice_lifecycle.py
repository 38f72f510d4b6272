"""The slice lifecycle on its own: spares and repairs for crashed learners, and learners of several slices."""

import jax
import pytest

from controller_fakes import FakeBudget, FakeLearner, FakeLog, FakePost, FakeSyncer
from runtime.diloco.clock import Event, EventKind, make_clock
from runtime.diloco.learner.lifecycle import DOWN, FAILED, WAITING
from runtime.diloco.ledger import Ledger
from runtime.diloco.slices.lifecycle import SliceLifecycle
from runtime.diloco.slices.one_slice import OneSlice
from runtime.diloco.slices.several_slices import SeveralSlices
from runtime.errors import ProgramError
from runtime.experiments import modes
from runtime.faults import injection
from runtime.faults.plan import timed_events


class _Harness:
  """A slice lifecycle over fake learners, a virtual clock, and records of the losses and pulls of Θ it made."""

  def __init__(self, config, slices_of, injector=False):
    self.run = modes.prepare(config)
    self.clock = make_clock(self.run.clock, self.run.learners, self.run.seed)
    self.learners = [FakeLearner(m, slices_of(m)) for m in range(self.run.learners)]
    self.log, self.post = FakeLog(), FakePost(self.clock)
    self.budget = FakeBudget(self.clock, self.log, Ledger(self.run.num_slices))
    devices = [[d] for d in jax.devices()[:self.run.num_slices]]
    armed = injection.Injector(self.run.learners, self.run.faults.schedule) if injector else None
    self.slices = SliceLifecycle(
        self.run, devices, armed, self.clock, self.learners, FakeSyncer(), self.budget, self.post, self.log,
        policy=SeveralSlices if self.run.slices_per_learner > 1 else OneSlice)
    self.pulled = self.post.pulled
    self.handlers = {EventKind.SLICE_REPAIRED: self.slices.on_slice_repaired, EventKind.REJOIN: self.slices.on_rejoin,
                     EventKind.SLICE_CRASH: self.slices.on_slice_crash,
                     EventKind.LEARNER_CRASH: self.slices.on_learner_crash}

  def run_events(self) -> list[tuple[float, str]]:
    """Handles every scheduled event the lifecycle knows (others are only listed); returns (time, kind) of each."""
    seen = []
    while self.clock.pending():
      at, event = self.clock.next_event()
      seen.append((at, event.kind))
      if event.kind in self.handlers:
        self.handlers[event.kind](event)
    return seen


@pytest.fixture
def one_spare(tiny_config):
  tiny_config.learners, tiny_config.slices = 2, 4  # slices 2 and 3 are spares
  tiny_config.faults.repair_seconds, tiny_config.faults.spare_swap_seconds = 5.0, 1.0
  return tiny_config


def test_a_crashed_learner_gets_the_spare_and_its_slice_becomes_the_spare_after_repair(one_spare):
  h = _Harness(one_spare, lambda m: (m,))
  h.learners[1].unmerged_tokens = 40
  h.slices.crash(h.learners[1], "test")
  assert h.learners[1].status == DOWN and h.budget.lost == [(40, 1.5)] and h.log.kinds() == ["crash"]
  assert h.run_events() == [(1.0, EventKind.REJOIN), (5.0, EventKind.SLICE_REPAIRED)]
  assert h.learners[1].slices == (2,) and h.pulled == [(1, 1.0)]  # on the oldest spare, from Θ, after the swap
  assert h.log.kinds() == ["crash", "rejoin"]
  assert h.slices.pool.snapshot()["spares"] == [3, 1]  # the repaired slice is a spare again


def test_without_a_spare_the_crashed_learner_rejoins_on_its_repaired_slice(tiny_config):
  tiny_config.learners = 4
  tiny_config.faults.repair_seconds = 5.0
  h = _Harness(tiny_config, lambda m: (m,))
  h.slices.crash(h.learners[2], "test")
  assert h.run_events() == [(5.0, EventKind.SLICE_REPAIRED)]
  assert h.learners[2].slices == (2,) and h.pulled == [(2, 5.0)]


def test_a_learner_whose_process_was_found_ended_crashes_as_on_its_slice_loss_once(one_spare):
  h = _Harness(one_spare, lambda m: (m,))
  h.learners[1].unmerged_tokens = 40
  h.learners[1].lost = injection.ProcessLost(1, "ActorDiedError: the actor died")
  h.slices.crash_lost()
  h.slices.crash_lost()  # (its crash handled, it is lost no more)
  assert h.learners[1].status == DOWN and h.learners[0].status == WAITING and h.budget.lost == [(40, 1.5)]
  assert h.log.kinds() == ["crash"] and "learner 1's process ended: ActorDiedError" in h.log.faults[0]["detail"]
  assert h.run_events() == [(1.0, EventKind.REJOIN), (5.0, EventKind.SLICE_REPAIRED)]
  assert h.learners[1].slices == (2,) and h.log.kinds() == ["crash", "rejoin"]


def test_a_learner_with_a_report_on_its_way_waits_for_its_verdict_before_it_rejoins(one_spare):
  h = _Harness(one_spare, lambda m: (m,))
  h.learners[0].reports_out = 1
  h.slices.crash(h.learners[0], "test")
  h.run_events()
  assert h.learners[0].status == DOWN and h.slices.pool.held() == [(0, 2)]
  h.learners[0].reports_out = 0  # (the merge settled it)
  h.slices.settled()
  assert h.learners[0].status == WAITING and h.learners[0].slices == (2,) and h.slices.pool.held() == []


def test_a_learner_stopped_by_a_program_error_gives_its_slice_to_the_learner_waiting(tiny_config):
  tiny_config.learners = 4
  h = _Harness(tiny_config, lambda m: (m,))
  h.slices.crash(h.learners[0], "test")  # no spare: learner 0 waits for a slice
  h.slices.failed(h.learners[1], "at dispatch", ValueError("a bug"))
  assert h.learners[1].status == FAILED and h.learners[0].slices == (1,)
  assert h.log.kinds() == ["crash", "program_error", "rejoin"]


def test_the_last_learner_stopped_by_a_program_error_ends_the_run(tiny_config):
  tiny_config.learners = 4
  h = _Harness(tiny_config, lambda m: (m,))
  for learner in h.learners[:3]:
    h.slices.failed(learner, "at dispatch", ValueError("a bug"))
  with pytest.raises(ProgramError, match="no learner is left to train"):
    h.slices.failed(h.learners[3], "at dispatch", ValueError("a bug"))


@pytest.fixture
def two_slice_learners(tiny_config):
  tiny_config.learners, tiny_config.slices_per_learner = 2, 2
  tiny_config.data.batch_size = 8
  tiny_config.faults.schedule = "crash:learner=1,time=5,slice=1,repair=6"
  tiny_config.faults.reconfig_seconds = 1.0
  return tiny_config


def test_a_learner_of_two_slices_losing_one_shrinks_onto_the_other_and_grows_back_after_the_repair(two_slice_learners):
  h = _Harness(two_slice_learners, lambda m: (2 * m, 2 * m + 1))
  learner = h.learners[1]
  (_, kind, m, fault), = timed_events(h.run.faults.schedule)  # (handled now, at t=0)
  h.slices.on_learner_crash(Event(kind, m, fault))
  assert h.log.kinds() == ["shrink"] and h.slices.pool.owned(1) == [2]
  seen = []
  while h.clock.pending():
    at, event = h.clock.next_event()
    seen.append((at, event.kind))
    if event.kind == EventKind.RECONFIGURED:
      h.slices.regroup(learner)
      learner.wait(at)
    elif event.kind in h.handlers:
      h.handlers[event.kind](event)
  assert seen == [(1.0, EventKind.RECONFIGURED), (6.0, EventKind.SLICE_REPAIRED), (7.0, EventKind.RECONFIGURED)]
  assert learner.slices == (2, 3) and h.log.kinds() == ["shrink", "expand"]
  assert not h.slices.regroup_due(learner, "main")  # it holds the set it trains on


def test_steps_on_one_of_two_slices_take_twice_as_long(two_slice_learners):
  h = _Harness(two_slice_learners, lambda m: (2 * m, 2 * m + 1))
  assert h.slices.step_scale(h.learners[0]) == 1.0
  h.learners[0].slices = (0,)
  assert h.slices.step_scale(h.learners[0]) == 2.0


def test_a_lent_slice_that_failed_while_not_lent_leaves_its_learner_down_and_is_reclaimed_from_it(tiny_config):
  tiny_config.learners = 2
  tiny_config.data.assignment, tiny_config.capacity.schedule = "service", "lend:slices=2,time=4,duration=8"
  h = _Harness(tiny_config, lambda m: (m,))
  h.learners += [FakeLearner(2), FakeLearner(3)]
  h.slices.pool.begin_repair(2)
  assert not h.slices.lend(2, h.learners[2]) and h.learners[2].status == DOWN
  assert h.slices.lend(3, h.learners[3]) and h.learners[3].status == WAITING
  assert h.slices.reclaim(2) == 2 and h.slices.snapshot(None)["lent"] == [(3, 3)]


def test_a_learner_of_two_slices_losing_one_has_both_settled_at_the_end_its_failed_program_ran_on_both(
    two_slice_learners):
  """A device error's token stays on every device of the failed program; one left unsettled raises at exit."""
  h = _Harness(two_slice_learners, lambda m: (2 * m, 2 * m + 1))
  (_, kind, m, fault), = timed_events(h.run.faults.schedule)
  h.slices.on_learner_crash(Event(kind, m, fault))
  assert h.slices.pool.take_crashed() == [2, 3]
  assert h.slices.pool.is_repairing(3) and not h.slices.pool.is_repairing(2)  # slice 2 trains on


def test_a_step_crash_armed_in_a_round_that_another_failure_took_stays_planned_and_fires_once(tiny_config):
  """A learner armed to crash at inner step 6 is taken down first by its process's death: the step crash never
  fired, so its event is dropped and it stays in the plan; armed again when the learner next reaches step 6, it
  fires there, once (before, the death spent it and its event crashed the learner later, wherever it then was)."""
  tiny_config.learners, tiny_config.faults.schedule = 2, "crash:learner=1,step=6,repair=1"
  h = _Harness(tiny_config, lambda m: (m,), injector=True)
  learner = h.learners[1]
  learner.total_steps = 4
  assert h.slices.arm_crash(learner, 4, 4.0) == 2.0  # (steps 4-7 over 4 s from t=0: step 6 at 2 s)
  assert h.slices.doomed(learner)
  learner.lost = injection.ProcessLost(1, "ActorDiedError: the actor died")
  h.slices.crash_lost()
  assert not h.slices.doomed(learner) and h.slices.crashes.snapshot()["step_crashes"] == [0]
  assert [kind for _, kind in h.run_events()] == [EventKind.SLICE_REPAIRED]  # (no crash event left)
  assert learner.status == WAITING and h.log.kinds() == ["crash", "rejoin"]
  start = h.clock.now()
  assert h.slices.arm_crash(learner, 4, 4.0) == start + 2.0  # the same step, in the round it trains again
  learner.status = "training"
  assert [kind for _, kind in h.run_events()] == [EventKind.LEARNER_CRASH, EventKind.SLICE_REPAIRED]
  assert h.log.kinds() == ["crash", "rejoin", "crash", "rejoin"]
  assert h.slices.crashes.snapshot()["step_crashes"] == []  # spent by the crash it caused
