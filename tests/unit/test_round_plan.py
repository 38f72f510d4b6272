"""The round plan on its own: what a learner runs next and for how long, from what it is doing and the config."""

import dataclasses

import pytest

from runtime.diloco import round_plan
from runtime.diloco.round_plan import ADOPT, MAIN, OVERLAP, REPORT, WAIT, Next, View, next_part
from runtime.experiments import modes


@pytest.fixture
def run(tiny_config):
  tiny_config.inner_steps, tiny_config.overlap_steps = 6, 2  # H = 6, τ = 2: main parts of 4 steps
  return modes.prepare(tiny_config)


def _keeping(run):
  """The run under outer.keep_training."""
  return dataclasses.replace(run, outer=dataclasses.replace(run.outer, keep_training=True))


def _view(newest="", has_theta=False, in_flight=False, steps_left=100, unreported=0, deadline=None):
  return View(newest=newest, has_theta=has_theta, in_flight=in_flight, steps_left=steps_left,
              unreported_tokens=unreported, deadline=deadline)


def test_a_round_is_a_main_part_of_h_minus_tau_steps_then_tau_steps_of_overlap_then_theta(run):
  assert next_part(run, _view()) == Next(MAIN, 4)
  assert next_part(run, _view(MAIN)) == Next(OVERLAP, 2)
  assert next_part(run, _view(MAIN, has_theta=True)) == Next(OVERLAP, 2)  # the overlap part first, whatever came
  assert next_part(run, _view(OVERLAP)) == Next(WAIT)  # Θ has not come: it waits
  assert next_part(run, _view(OVERLAP, has_theta=True)) == Next(ADOPT)
  assert next_part(run, _view(OVERLAP, has_theta=True, in_flight=True)) == Next(ADOPT)  # queued behind its part
  assert round_plan.part_lengths(run) == (2, 4) and round_plan.main_steps(run) == 4


def test_the_budgets_last_main_part_is_what_is_left_and_with_nothing_left_the_carried_work_is_reported(run):
  assert next_part(run, _view(steps_left=3)) == Next(MAIN, 3)
  assert next_part(run, _view(steps_left=0, unreported=512)) == Next(REPORT)
  assert next_part(run, _view(steps_left=0)) == Next(MAIN, 1)  # nothing to report: the budget refuses it, it finishes
  # Behind parts in flight, Θ is adopted only while a main part's steps are left: the last report waits for them.
  assert next_part(run, _view(OVERLAP, has_theta=True, in_flight=True, steps_left=0)) == Next(WAIT)
  assert next_part(run, _view(OVERLAP, has_theta=True, steps_left=0)) == Next(ADOPT)


def test_keep_training_trains_tau_more_steps_until_theta_and_without_overlap_a_learner_waits(run, tiny_config):
  assert next_part(_keeping(run), _view(OVERLAP)) == Next(OVERLAP, 2)
  tiny_config.inner_steps, tiny_config.overlap_steps = 6, 0
  no_overlap = modes.prepare(tiny_config)
  assert next_part(no_overlap, _view()) == Next(MAIN, 6)
  assert next_part(no_overlap, _view(MAIN)) == Next(WAIT)
  assert round_plan.part_lengths(no_overlap) == (6,)


def test_a_learner_stages_the_data_of_the_part_the_plan_runs_after_the_one_it_dispatches(run):
  assert round_plan.staged_after(run, MAIN, has_theta=False) == 2  # the overlap part
  assert round_plan.staged_after(run, OVERLAP, has_theta=False) == 4  # the next round's main part, after Θ
  keeps = _keeping(run)
  assert round_plan.staged_after(keeps, OVERLAP, has_theta=False) == 2  # another overlap part, until Θ
  assert round_plan.staged_after(keeps, OVERLAP, has_theta=True) == 4


def test_with_fragments_a_round_is_h_over_p_steps(tiny_config):
  tiny_config.inner_steps, tiny_config.fragments, tiny_config.overlap_steps = 8, 2, 1
  run = modes.prepare(tiny_config)
  assert next_part(run, _view()) == Next(MAIN, 3) and next_part(run, _view(MAIN)) == Next(OVERLAP, 1)


def _timed(tiny_config, inner=8, overlap=2):
  tiny_config.inner_steps, tiny_config.overlap_steps = inner, overlap
  tiny_config.rounds.length = "time"
  return modes.prepare(tiny_config)


def test_under_time_a_main_part_trains_until_the_first_deadline_at_least_half_a_period_away(tiny_config):
  run = _timed(tiny_config)  # deadlines every 8 s (H = 8 steps of the slowest learner, 1 s each)
  def main(start, xi):
    return next_part(run, _view(deadline=round_plan.Deadline(start, xi, origin=0.0, period=8.0)))
  assert main(0.0, 1.0) == Next(MAIN, 8)  # the first round: to the first deadline
  assert main(10.0, 1.0) == Next(MAIN, 6)  # adopted Θ 2 s after a deadline (τ steps): H − τ to the next
  assert main(10.0, 0.5) == Next(MAIN, 12)  # twice as fast: twice the steps, reporting at the same deadline
  assert main(11.0, 1.0) == Next(MAIN, 5)  # a rejoin 5 s before the next deadline: a short round
  assert main(11.0, 0.8) == Next(MAIN, 6)  # (rounded to the nearest step)
  assert main(12.0, 1.0) == Next(MAIN, 4)  # half a period away: still that one
  assert main(12.0001, 1.0) == Next(MAIN, 12)  # less than half a period away: the one after
  assert next_part(run, _view(steps_left=5, deadline=round_plan.Deadline(0.0, 0.5, 0.0, 8.0))) == Next(MAIN, 5)
  assert main(10.0, 0.0) == Next(MAIN, 6)  # no step time known yet: H − τ
  assert round_plan.Deadline(17.0, 1.0, origin=3.0, period=8.0).next() == 27.0  # the grid keeps its phase


def test_under_time_any_length_runs_as_compiled_programs_and_under_steps_as_one(tiny_config):
  steps_run = modes.prepare(tiny_config)
  assert round_plan.chunks(steps_run, 13) == (13,) and round_plan.part_lengths(steps_run) == (4,)
  run = _timed(tiny_config, inner=12, overlap=2)  # H − τ = 10 and τ = 2 compiled, and 1, 2, 4, 8 below 10
  assert round_plan.part_lengths(run) == (1, 2, 4, 8, 10)
  assert round_plan.chunks(run, 10) == (10,) and round_plan.chunks(run, 2) == (2,)
  for steps in range(1, 40):
    pieces = round_plan.chunks(run, steps)
    assert sum(pieces) == steps and set(pieces) <= set(round_plan.part_lengths(run))
    assert len(pieces) <= steps // 10 + 3  # (a few programs, never one per step)


def test_time_is_refused_with_fragments_or_lent_capacity_naming_the_field(tiny_config):
  tiny_config.rounds.length, tiny_config.inner_steps, tiny_config.fragments = "time", 8, 2
  with pytest.raises(Exception, match="rounds.length"):
    modes.prepare(tiny_config)
