"""Overlap steps that hide the sync: their work reaches Θ, no token is skipped or trained twice."""

import pytest
from invariants import assert_ranges_tile

from runtime.experiments import modes
from runtime.train.harness import Experiment


def _run(config):
  run = modes.prepare(config)
  return run, modes.train_one(run, Experiment(run), None, "run")


@pytest.fixture
def hidden_sync(tiny_config):
  """H=4, τ=2, and a link whose round trip (2 × 0.9 s) fits inside the two overlap steps."""
  tiny_config.inner_steps = 4
  tiny_config.overlap_steps = 2
  tiny_config.total_steps = 32
  tiny_config.clock.latency_s = 0.9
  tiny_config.outer.grace = "none"
  return tiny_config


def _inner_steps(result):
  return sum(steps for learner in result.details["completions"] for _, steps in learner)


@pytest.mark.parametrize("receive", ["carry", "mix"])
def test_overlap_work_reaches_theta_and_learners_never_idle(hidden_sync, receive):
  # Regression: "overwrite" threw the overlap steps away and trained their data again (60 inner steps for
  # a 32-step budget, busy 0.74); "mix" dropped them from the token accounting (gaps in the merged ranges).
  hidden_sync.outer.receive = receive
  run, result = _run(hidden_sync)
  assert result.tokens == run.token_budget
  assert_ranges_tile(result, learners=range(4))
  assert _inner_steps(result) == run.total_steps * run.learners  # every step trained once, none again
  assert result.extras["busy_min"] >= 0.98, result.details["busy"]


def test_overwrite_still_trains_the_overlap_data_again_as_an_ablation(hidden_sync):
  hidden_sync.outer.receive = "overwrite"
  run, result = _run(hidden_sync)
  assert result.tokens == run.token_budget
  assert_ranges_tile(result, learners=range(4))
  assert _inner_steps(result) > run.total_steps * run.learners


def test_carried_rounds_differ_in_steps_so_token_weights_differ(hidden_sync):
  # The first round reports H − τ steps, later ones H (the carried overlap included): weights follow.
  _, result = _run(hidden_sync)
  weights = {w for r in result.records if r["kind"] == "merge" for w in r["weights"]}
  assert len(weights) >= 2, weights


def test_keep_training_fills_a_slow_link_and_keeps_every_token(hidden_sync):
  hidden_sync.clock.latency_s = 3.0  # round trip 6 s: three times the overlap
  hidden_sync.outer.keep_training = True
  run, result = _run(hidden_sync)
  assert result.tokens == run.token_budget
  assert_ranges_tile(result, learners=range(4))
  assert result.extras["busy_min"] >= 0.98, result.details["busy"]
