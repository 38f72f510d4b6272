"""Membership on its own (with the slice lifecycle, no Controller): lent slices bring learners, reclaims take them."""

import types

import jax

from controller_fakes import FakeBudget, FakeLearner, FakeLog, FakePost, FakeSyncer
from runtime.diloco.clock import EventKind, make_clock
from runtime.diloco.learner.lifecycle import ABSENT, WAITING
from runtime.diloco.ledger import Ledger
from runtime.diloco.membership import Membership
from runtime.diloco.slices.lifecycle import SliceLifecycle
from runtime.diloco.slices.one_slice import OneSlice
from runtime.experiments import modes


def _membership(tiny_config, tokens_dispatched=0):
  tiny_config.learners, tiny_config.data.assignment = 2, "service"
  tiny_config.capacity.schedule = "lend:slices=2,time=4,duration=8"
  run = modes.prepare(tiny_config)
  clock = make_clock(run.clock, run.learners + run.lent_slices, run.seed)
  log, ledger, post = FakeLog(), Ledger(run.num_slices), FakePost(clock)
  budget = FakeBudget(clock, log, ledger, tokens_dispatched, run.tokens_per_step)
  learners = [FakeLearner(m, (m,) if m < run.learners else ()) for m in range(run.learners + run.lent_slices)]
  for learner in learners[run.learners:]:
    learner.status = ABSENT
  h = types.SimpleNamespace(run=run, clock=clock, log=log, ledger=ledger, learners=learners, budget=budget, post=post)
  devices = [[d] for d in jax.devices()[:run.num_slices + run.lent_slices]]
  h.slices = SliceLifecycle(run, devices, None, clock, learners, FakeSyncer(), budget, post, log, policy=OneSlice)
  h.membership = Membership(run, clock, learners, budget, h.slices, None, log)
  return h


def test_a_lent_slice_runs_the_lowest_absent_learner_from_the_runs_schedule_position_until_it_is_reclaimed(
    tiny_config):
  h = _membership(tiny_config, tokens_dispatched=10_000)
  h.membership.schedule_lends()
  at, lend = h.clock.next_event()
  assert (at, lend.kind) == (4.0, EventKind.LEND)
  h.membership.on_lend(lend)
  joined = h.learners[2:]
  assert [l.status for l in joined] == [WAITING, WAITING] and [l.slices for l in joined] == [(2,), (3,)]
  assert [l.total_steps for l in joined] == [10_000 // h.run.tokens_per_step] * 2
  assert [m for m, _ in h.post.pulled] == [2, 3]
  assert h.membership.members() == 4 and h.log.kinds() == ["join", "join"] and h.slices.lent == {2: 2, 3: 3}
  joined[0].unmerged_tokens = 64
  at, reclaim = h.clock.next_event()
  assert (at, reclaim.kind) == (12.0, EventKind.RECLAIM)
  h.membership.on_reclaim(reclaim)
  assert [l.status for l in joined] == [ABSENT, ABSENT] and h.membership.members() == 2 and not h.slices.lent
  assert [tokens for tokens, _ in h.budget.lost] == [64, 0] and h.log.kinds()[2:] == ["leave", "leave"]
  assert h.ledger.lent_slice_seconds(12.0) == 2 * 8.0


def test_the_lent_slices_and_the_traces_drawn_survive_a_snapshot_each_with_its_owner(tiny_config):
  h = _membership(tiny_config)
  h.membership.schedule_lends()
  h.membership.on_lend(h.clock.next_event()[1])
  saved, lent = h.membership.snapshot(None), h.slices.snapshot(None)
  again = _membership(tiny_config)
  again.membership.restore(saved, None)
  again.slices.restore(lent, None)
  assert again.slices.lent == {2: 2, 3: 3} and again.membership.snapshot(None) == saved and "lent" not in saved
