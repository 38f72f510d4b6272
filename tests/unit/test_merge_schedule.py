"""The merge schedule on its own: one merge at a time, the next scheduled once a quorum is ready again, and each
merge's reports answered when it is done."""

import types

from controller_fakes import FakeBudget, FakeLearner, FakeLog, FakeSyncer
from runtime.diloco.clock import EventKind, make_clock
from runtime.diloco.learner.lifecycle import DONE, DOWN
from runtime.diloco.ledger import Ledger
from runtime.diloco.merge_schedule import IDLE, RUNNING, SCHEDULED, MergeSchedule
from runtime.experiments import modes


class _Links:
  def send_down(self, learner, now, payload=None, fragment=-1):
    return 3.0


class _Slices:
  def __init__(self):
    self.settled_at = []

  def settled(self):
    self.settled_at.append(True)


class _Settling(FakeLearner):
  """A fake learner that takes its report's verdict."""

  def live_bases(self):
    return ((-1, 0),)

  def report_settled(self, report, merged):
    self.calls.append(("settled", merged))


def _schedule(tiny_config, quorum=2):
  run = modes.prepare(tiny_config)
  clock, syncer = make_clock(run.clock, run.learners, run.seed), FakeSyncer(quorum)
  learners = [_Settling(m, (m,)) for m in range(run.learners)]
  log = FakeLog()
  schedule = MergeSchedule(run, clock, learners, syncer, _Links(), FakeBudget(clock, log, Ledger(run.num_slices)),
                           log, _Slices())
  return schedule, clock, syncer, learners, log


def _arrive(merges, syncer, report):
  """A report reaches the syncer (Rounds hands it over), and the event loop checks for a ready quorum after it."""
  syncer.receive(report)
  merges.maybe_merge()


def _report(m):
  return types.SimpleNamespace(learner=m, fragment=0, params=None, busy_seconds=1.0, tokens=10, total_steps=1)


def test_exactly_one_merge_runs_at_a_time_and_the_next_is_scheduled_when_a_quorum_is_ready(tiny_config):
  merges, clock, syncer, learners, log = _schedule(tiny_config)
  reports = [_report(m % 4) for m in range(5)]
  _arrive(merges, syncer, reports[0])
  assert merges.state == IDLE and not clock.pending()  # one report: no quorum
  _arrive(merges, syncer, reports[1])
  assert merges.state == SCHEDULED and clock.pending() == 1  # due after the grace window
  _arrive(merges, syncer, reports[2])
  assert clock.pending() == 1  # a merge is scheduled already
  at, due = clock.next_event()
  assert (at, due.kind) == (1.0, EventKind.MERGE_DUE)
  merges.on_merge_due(due)
  assert merges.state == RUNNING and syncer.pending == []
  _arrive(merges, syncer, reports[3])
  _arrive(merges, syncer, reports[4])
  assert clock.pending() == 1  # only the running merge's completion: the quorum waits for it
  at, done = clock.next_event()
  assert done.kind == EventKind.MERGE_DONE
  merges.on_merge_done(done)
  (result, merged, when, _, _), = log.merges
  assert (result.reports, result.members, merged, when) == (tuple(reports[:3]), 4, reports[:3], at)
  assert [c for l in learners for c in l.calls] == [("settled", True)] * 3 and syncer.version == 4
  assert merges.state == IDLE and clock.pending() == 3  # Θ on its way to each merged report's learner
  merges.maybe_merge()
  assert merges.state == SCHEDULED and clock.pending() == 4
  merges.close()


def test_a_merge_due_with_no_report_left_waiting_goes_back_to_idle(tiny_config):
  merges, clock, _, _, _ = _schedule(tiny_config)
  merges.schedule(0.0)
  _, due = clock.next_event()
  merges.on_merge_due(due)
  assert merges.state == IDLE and not clock.pending()
  merges.close()


def test_learners_down_done_or_absent_cannot_report(tiny_config):
  merges, _, _, learners, _ = _schedule(tiny_config)
  learners[0].status, learners[1].status = DOWN, DONE
  assert merges.able() == len(learners) - 2 and merges.able(0) == len(learners) - 2
  merges.close()


def test_the_merge_state_survives_a_snapshot(tiny_config):
  merges, _, _, _, _ = _schedule(tiny_config)
  merges.schedule(2.0)
  saved = merges.snapshot(None)
  again, _, _, _, _ = _schedule(tiny_config)
  again.restore(saved, None)
  assert saved == {"merge_state": SCHEDULED} and again.state == SCHEDULED
  merges.close()
  again.close()


def test_the_sync_time_behind_the_grace_window_is_the_merge_and_theta_down_not_the_reports_way_up_again(tiny_config):
  """The window opens once the reports are up (the wait for them since the first was sent is ξ_quorum): the time it
  must leave is the merge's and Θ's way down. Counting the way up in both cut the window short by one transfer."""
  tiny_config.clock.merge_seconds = 0.5
  merges, clock, syncer, _, _ = _schedule(tiny_config)
  observed = []
  syncer.observe_sync = observed.append
  for m in range(2):
    _arrive(merges, syncer, _report(m))
  _, due = clock.next_event()
  merges.on_merge_due(due)
  _, done = clock.next_event()
  merges.on_merge_done(done)
  assert observed == [3.5]  # 0.5 s of merge, 3 s down
  merges.close()
