"""Fragment accounting: a fragment's merge weight counts every step it trained since the learner received it,
the overlap steps carried past its last report included (not the round's share, not only since the receipt)."""

from runtime.experiments import modes
from runtime.train.harness import Experiment


def test_a_fragments_merge_weight_counts_every_step_since_it_was_received_overlap_included(tiny_config):
  tiny_config.learners = tiny_config.num_devices = 1
  tiny_config.inner_steps, tiny_config.fragments, tiny_config.overlap_steps = 8, 2, 1
  tiny_config.total_steps = 12
  run = modes.prepare(tiny_config)
  result = modes.train_one(run, Experiment(run), None, "run")
  merges = [r for r in result.records if r["kind"] == "merge"]
  # A weight is tokens² / steps = steps × (tokens per step)²: the inner steps its fragment trained.
  trained = [(r["fragment"], w / run.tokens_per_step**2) for r in merges for w in r["weights"]]
  # Reports after 3, 7, 11 and 12 steps (H/P = 4 apart; the first closes a main part of H/P − τ = 3): each fragment
  # first counts from the start, then H = 8 steps from its last report (its overlap step carried); the budget's
  # last report counts the 5 steps since fragment 0's.
  assert trained == [(1, 3), (0, 7), (1, 8), (0, 5)]
