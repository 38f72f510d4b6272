"""The rounds on their own: parts dispatched within the token budget, reports up, Θ down, write-offs."""

import types

from controller_fakes import FakeLearner, FakeLog, FakeSyncer
from runtime.diloco.clock import EventKind, make_clock
from runtime.diloco.learner.learner import DONE, WAITING
from runtime.diloco.ledger import Ledger
from runtime.diloco.rounds import Rounds
from runtime.experiments import modes


class _Links:
  """Reports take 2 s up (or are dropped), Θ 3 s down."""

  def __init__(self, drop: bool = False):
    self.drop, self.sent_down = drop, []

  def send_up(self, learner, now, payload=None, fragment=0):
    return None if self.drop else 2.0

  def send_down(self, learner, now, payload=None, fragment=-1):
    self.sent_down.append((learner, now))
    return 3.0


class _Merges:
  def __init__(self):
    self.received, self.checks = [], 0

  def receive(self, report):
    self.received.append(report)

  def maybe_merge(self):
    self.checks += 1


def _rounds(tiny_config, drop=False):
  run = modes.prepare(tiny_config)
  clock = make_clock(run.clock, run.learners, run.seed)
  learners = [FakeLearner(m, (m,), tokens_per_batch=run.learner_batch(m) * run.data.seq_len)
              for m in range(run.learners)]
  slices = types.SimpleNamespace(regroup_due=lambda learner, kind: False, step_scale=lambda learner: 1.0,
                                 arm_crash=lambda learner, steps, modeled: None, failed=None,
                                 crashed_idle=lambda learner: False)
  log, links, merges, ledger = FakeLog(), _Links(drop), _Merges(), Ledger(run.num_slices)
  rounds = Rounds(run, clock, learners, FakeSyncer(), links, ledger, lambda: log, slices, merges)
  return types.SimpleNamespace(run=run, clock=clock, learners=learners, log=log, links=links, merges=merges,
                               ledger=ledger, rounds=rounds)


def test_a_round_is_dispatched_its_report_sent_and_its_arrival_handed_to_the_merge_schedule(tiny_config):
  h = _rounds(tiny_config)
  learner = h.learners[1]
  h.rounds.start_round(learner)
  steps = h.run.round_steps - h.run.overlap_steps
  assert h.rounds.tokens_dispatched == steps * learner.tokens_per_batch
  at, done = h.clock.next_event()
  assert done.kind == EventKind.PART_DONE and at == steps * h.run.clock.step_seconds
  h.rounds.on_part_done(done, at)
  assert h.rounds.reports_in_transit == 1 and learner.reports_out == 1 and learner.status == WAITING
  _, arrived = h.clock.next_event()
  assert arrived.kind == EventKind.REPORT_ARRIVED
  h.rounds.on_report_arrived(arrived)
  assert h.rounds.reports_in_transit == 0 and h.merges.received == [arrived.payload]


def test_a_part_beyond_the_token_budget_is_not_dispatched_and_its_learner_is_done(tiny_config):
  h = _rounds(tiny_config)
  learner = h.learners[0]
  while h.rounds.work_left():
    h.rounds.start_round(learner)
    learner.parts.clear()  # (its part is done; a learner with one in flight settles when it is)
  dispatched = h.rounds.tokens_dispatched
  assert dispatched == h.run.token_budget  # (the budget is a whole number of this learner's parts)
  h.rounds.start_round(learner)
  assert learner.status == DONE and h.merges.checks == 1 and h.rounds.tokens_dispatched == dispatched


def test_written_off_tokens_go_back_into_the_budget_and_a_finished_learner_pulls_theta_to_train_them(tiny_config):
  h = _rounds(tiny_config)
  h.learners[2].set_status(DONE, 0.0)
  h.rounds.start_round(h.learners[0])
  dispatched = h.rounds.tokens_dispatched
  h.rounds.write_off(100)
  assert h.rounds.tokens_dispatched == dispatched - 100 and h.learners[2].status == WAITING
  assert h.links.sent_down == [(2, 0.0)]
  events = [h.clock.next_event()[1] for _ in range(h.clock.pending())]
  assert [(e.kind, e.learner) for e in events if e.kind == EventKind.PARAMS_ARRIVED] == [(EventKind.PARAMS_ARRIVED, 2)]


def test_a_report_dropped_by_its_link_times_out_and_its_learner_pulls_the_current_theta(tiny_config):
  h = _rounds(tiny_config, drop=True)
  h.rounds.start_round(h.learners[3])
  at, done = h.clock.next_event()
  h.rounds.on_part_done(done, at)
  assert h.rounds.reports_in_transit == 0 and h.log.kinds() == ["link_drop"] and h.ledger.lost_seconds == 2.0
  timeout_at, timeout = h.clock.next_event()
  assert timeout.kind == EventKind.REPORT_TIMEOUT and timeout_at == at + h.run.faults.report_timeout_seconds
  h.rounds.on_report_timeout(timeout)
  arrive_at, theta = h.clock.next_event()
  assert theta.kind == EventKind.PARAMS_ARRIVED and theta.payload.verdict == "lost" and arrive_at == timeout_at + 3.0


def test_the_budget_side_survives_a_snapshot(tiny_config):
  h = _rounds(tiny_config)
  h.rounds.start_round(h.learners[0])
  again = _rounds(tiny_config).rounds
  again.restore(h.rounds.snapshot())
  assert again.snapshot() == h.rounds.snapshot() and again.tokens_dispatched > 0
