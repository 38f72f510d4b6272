"""The rounds on their own: parts dispatched within the token budget, reports up, Θ down, write-offs."""

import math
import types

from controller_fakes import FakeLearner, FakeLog, FakeSyncer
from runtime.diloco.budget import Budget
from runtime.diloco.clock import EventKind, make_clock
from runtime.diloco.learner.lifecycle import DONE, WAITING
from runtime.diloco.ledger import Ledger
from runtime.diloco.rounds import Rounds
from runtime.diloco.theta_post import ThetaPost
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


def _rounds(tiny_config, drop=False):
  run = modes.prepare(tiny_config)
  clock = make_clock(run.clock, run.learners, run.seed)
  learners = [FakeLearner(m, (m,), tokens_per_batch=run.learner_batch(m) * run.data.seq_len)
              for m in range(run.learners)]
  slices = types.SimpleNamespace(regroup_due=lambda learner, kind: False, step_scale=lambda learner: 1.0,
                                 arm_crash=lambda learner, steps, modeled: None, failed=None,
                                 crashed_idle=lambda learner: False, doomed=lambda learner: False,
                                 hold_stop=lambda learner, where, error: False, stop_held=lambda learner: False)
  log, links, ledger, syncer = FakeLog(), _Links(drop), Ledger(run.num_slices), FakeSyncer()
  post = ThetaPost(clock, links)
  budget = Budget(run, clock, learners, syncer, post, ledger, log)
  rounds = Rounds(run, clock, learners, syncer, links, budget, post, log, slices)
  return types.SimpleNamespace(run=run, clock=clock, learners=learners, log=log, links=links, syncer=syncer,
                               ledger=ledger, budget=budget, rounds=rounds)


def test_a_round_is_dispatched_its_report_sent_and_its_arrival_handed_to_the_syncer(tiny_config):
  h = _rounds(tiny_config)
  learner = h.learners[1]
  h.rounds.start_round(learner)
  steps = h.run.round_steps - h.run.overlap_steps
  assert h.budget.tokens_dispatched == steps * learner.tokens_per_batch
  at, done = h.clock.next_event()
  assert done.kind == EventKind.PART_DONE and at == steps * h.run.clock.step_seconds
  h.rounds.on_part_done(done, at)
  assert h.budget.reports_in_transit == 1 and learner.reports_out == 1 and learner.status == WAITING
  _, arrived = h.clock.next_event()
  assert arrived.kind == EventKind.REPORT_ARRIVED
  h.rounds.on_report_arrived(arrived)
  assert h.budget.reports_in_transit == 0 and h.syncer.pending == [arrived.payload]


def test_a_part_beyond_the_token_budget_is_not_dispatched_and_its_learner_is_done(tiny_config):
  h = _rounds(tiny_config)
  learner = h.learners[0]
  while h.budget.work_left():
    h.rounds.start_round(learner)
    learner.parts.clear()  # (its part is done; a learner with one in flight settles when it is)
  dispatched = h.budget.tokens_dispatched
  assert dispatched == h.run.token_budget  # (the budget is a whole number of this learner's parts)
  h.rounds.start_round(learner)
  assert learner.status == DONE and h.budget.tokens_dispatched == dispatched


def test_lost_tokens_go_back_into_the_budget_and_a_finished_learner_pulls_theta_to_train_them(tiny_config):
  h = _rounds(tiny_config)
  h.learners[2].finish(0.0)
  h.rounds.start_round(h.learners[0])
  dispatched = h.budget.tokens_dispatched
  h.budget.lose(100, 2.5, ("crash", 0, "test"))
  assert h.budget.tokens_dispatched == dispatched - 100 and h.learners[2].status == WAITING
  assert h.ledger.lost_seconds == 2.5 and h.ledger.lost_tokens == 100 and h.log.kinds() == ["crash"]
  assert h.log.faults[0]["tokens_written_off"] == 100 and h.log.faults[0]["slice_seconds_lost"] == 2.5
  assert h.links.sent_down == [(2, 0.0)]
  events = [h.clock.next_event()[1] for _ in range(h.clock.pending())]
  assert [(e.kind, e.learner) for e in events if e.kind == EventKind.PARAMS_ARRIVED] == [(EventKind.PARAMS_ARRIVED, 2)]


def test_a_report_dropped_by_its_link_times_out_and_its_learner_pulls_the_current_theta(tiny_config):
  h = _rounds(tiny_config, drop=True)
  h.rounds.start_round(h.learners[3])
  at, done = h.clock.next_event()
  h.rounds.on_part_done(done, at)
  assert h.budget.reports_in_transit == 0 and h.log.kinds() == ["link_drop"] and h.ledger.lost_seconds == 2.0
  timeout_at, timeout = h.clock.next_event()
  assert timeout.kind == EventKind.REPORT_TIMEOUT and timeout_at == at + h.run.faults.report_timeout_seconds
  h.rounds.on_report_timeout(timeout)
  arrive_at, theta = h.clock.next_event()
  assert theta.kind == EventKind.PARAMS_ARRIVED and theta.payload.verdict == "lost" and arrive_at == timeout_at + 3.0


def test_the_budget_survives_a_snapshot_with_its_ledger(tiny_config):
  h = _rounds(tiny_config)
  h.rounds.start_round(h.learners[0])
  h.budget.lose(40, 1.5)
  again = _rounds(tiny_config).budget
  again.restore(h.budget.snapshot(None), None)
  assert again.snapshot(None) == h.budget.snapshot(None) and again.tokens_dispatched > 0
  assert again.ledger.lost_seconds == 1.5 and again.ledger.lost_tokens == 40
  older = h.budget.snapshot(None)  # (a checkpoint from before the ledger counted tokens: unknown, not 0)
  del older["ledger"]["lost_tokens"]
  again.restore(older, None)
  assert math.isnan(again.ledger.lost_tokens) and again.ledger.lost_seconds == 1.5
