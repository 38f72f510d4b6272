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


def _view(newest="", has_theta=False, in_flight=False, steps_left=100, unreported=0):
  return View(newest=newest, has_theta=has_theta, in_flight=in_flight, steps_left=steps_left,
              unreported_tokens=unreported)


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
