"""The merge schedule on its own: one merge at a time, the next scheduled once a quorum is ready again."""

import types

from controller_fakes import FakeLearner, FakeSyncer
from runtime.diloco.clock import EventKind, make_clock
from runtime.diloco.learner.learner import DONE, DOWN
from runtime.diloco.merge_schedule import IDLE, RUNNING, SCHEDULED, MergeSchedule
from runtime.experiments import modes


def _schedule(tiny_config, quorum=2):
  run = modes.prepare(tiny_config)
  clock, syncer = make_clock(run.clock, run.learners, run.seed), FakeSyncer(quorum)
  learners = [FakeLearner(m, (m,)) for m in range(run.learners)]
  schedule = MergeSchedule(run, clock, learners, syncer, members=lambda: len(learners), host_sharding=None)
  return schedule, clock, syncer, learners


def _report(m):
  return types.SimpleNamespace(learner=m, fragment=0, params=None)


def test_exactly_one_merge_runs_at_a_time_and_the_next_is_scheduled_when_a_quorum_is_ready(tiny_config):
  merges, clock, syncer, _ = _schedule(tiny_config)
  reports = [_report(m % 4) for m in range(5)]
  merges.receive(reports[0])
  assert merges.state == IDLE and not clock.pending()  # one report: no quorum
  merges.receive(reports[1])
  assert merges.state == SCHEDULED and clock.pending() == 1  # due after the grace window
  merges.receive(reports[2])
  assert clock.pending() == 1  # a merge is scheduled already
  at, due = clock.next_event()
  assert (at, due.kind) == (1.0, EventKind.MERGE_DUE)
  merges.on_merge_due(due)
  assert merges.state == RUNNING and syncer.pending == []
  merges.receive(reports[3])
  merges.receive(reports[4])
  assert clock.pending() == 1  # only the running merge's completion: the quorum waits for it
  _, done = clock.next_event()
  assert done.kind == EventKind.MERGE_DONE
  made, merged, started = merges.finished(done)
  assert (made.result.reports, made.result.members) == (tuple(reports[:3]), 4) and not made.placed
  assert merged == reports[:3] and started == 1.0 and set(made.stages) == {"report_copy_s", "merge_s", "theta_copy_s"}
  assert merges.state == IDLE
  merges.maybe_merge()
  assert merges.state == SCHEDULED and clock.pending() == 1
  merges.close()


def test_a_merge_due_with_no_report_left_waiting_goes_back_to_idle(tiny_config):
  merges, clock, _, _ = _schedule(tiny_config)
  merges.schedule(0.0)
  _, due = clock.next_event()
  merges.on_merge_due(due)
  assert merges.state == IDLE and not clock.pending()
  merges.close()


def test_learners_down_done_or_absent_cannot_report(tiny_config):
  merges, _, _, learners = _schedule(tiny_config)
  learners[0].status, learners[1].status = DOWN, DONE
  assert merges.able() == len(learners) - 2 and merges.able(0) == len(learners) - 2
  merges.close()


def test_the_merge_state_survives_a_snapshot(tiny_config):
  merges, _, _, _ = _schedule(tiny_config)
  merges.schedule(2.0)
  saved = merges.snapshot()
  again, _, _, _ = _schedule(tiny_config)
  again.restore(saved)
  assert saved == {"merge_state": SCHEDULED} and again.state == SCHEDULED
  merges.close()
  again.close()
