"""rounds.length "time": learners train until the syncs' deadlines, so reports of unequal learners arrive together."""

import numpy as np
import pytest

from invariants import assert_ranges_tile
from runtime.diloco import round_plan
from runtime.diloco.learner import learner as learner_lib, placement
from runtime.experiments import modes
from test_resume import assert_resumes_bit_identical

SPEEDS = (1.0, 1.0, 1.18, 1.18)  # the paper's heterogeneity: two learners 18% slower


@pytest.fixture
def unequal(tiny_config):
  tiny_config.clock.speeds, tiny_config.clock.jitter = SPEEDS, 0.1
  tiny_config.inner_steps, tiny_config.overlap_steps, tiny_config.total_steps = 8, 2, 64
  tiny_config.outer.grace = "adaptive"
  return tiny_config


def _merges(result):
  return [r for r in result.records if r["kind"] == "merge"]


def _round(result, learners):
  """The median batches of the learners' reports merged into Θ (a report: a round's steps)."""
  return np.median([b - a for m, a, b in result.details["merged_ranges"] if m in learners])


def test_fast_learners_take_more_steps_and_the_grace_window_gathers_a_deadlines_reports(unequal, tmp_path):
  steps = modes.train(unequal, tmp_path / "steps")[0]
  unequal.rounds.length = "time"
  timed = modes.train(unequal, tmp_path / "time")[0]
  per_merge = {name: np.mean([r["num_merged"] for r in _merges(result)]) for name, result in
               (("steps", steps), ("time", timed))}
  assert per_merge["time"] >= 2.5 and per_merge["time"] > per_merge["steps"] + 0.5, per_merge
  # A round is H steps for everyone under "steps"; under "time" one period, so the fast learners' have ~18% more.
  assert _round(steps, (0, 1)) == _round(steps, (2, 3)) == 8
  assert 1.08 < _round(timed, (0, 1)) / _round(timed, (2, 3)) < 1.4, (_round(timed, (0, 1)), _round(timed, (2, 3)))
  assert_ranges_tile(timed, learners=range(4))
  assert timed.tokens == steps.tokens


def test_any_round_length_runs_on_the_programs_compiled_for_a_few_lengths(unequal, monkeypatch):
  unequal.rounds.length = "time"
  made, dispatched = [], set()
  build = placement.programs.__wrapped__

  def recording(*args):
    made.append(build(*args))
    return made[-1]

  monkeypatch.setattr(placement, "programs", recording)
  pieces = learner_lib.Learner._run_pieces  # pylint: disable=protected-access

  def recording_pieces(self, staged_pieces, copies):
    dispatched.add(sum(p.shape[0] for p in staged_pieces))
    return pieces(self, staged_pieces, copies)

  monkeypatch.setattr(learner_lib.Learner, "_run_pieces", recording_pieces)
  run = modes.prepare(unequal)
  modes.train(unequal, None)
  compiled = max(program._cache_size() for programs in made for program in programs[:2])  # pylint: disable=W0212
  assert len(dispatched - set(round_plan.part_lengths(run))) >= 3, dispatched  # part lengths of no program...
  assert compiled <= len(round_plan.part_lengths(run)), (compiled, dispatched)  # ...a few programs each


def test_a_crash_mid_round_and_a_rejoin_under_time_resume_bit_identical(unequal, tmp_path, monkeypatch):
  unequal.rounds.length = "time"
  unequal.faults.schedule = "crash:learner=1,time=13"  # mid-round; repaired 5 s later, it rejoins mid-period
  unequal.faults.repair_seconds = 5.0
  unequal.checkpoint_every = 1
  result = assert_resumes_bit_identical(unequal, tmp_path, monkeypatch, kills=(2, 5))
  assert any(r["kind"] == "fault" for r in result.records)
  assert_ranges_tile(result, learners=range(4))


def test_under_the_real_clock_rounds_end_on_measured_deadlines(unequal, tmp_path):
  unequal.clock.kind, unequal.clock.speeds, unequal.clock.jitter = "real", (), 0.0
  unequal.rounds.length = "time"
  result = modes.train(unequal, tmp_path)[0]
  assert_ranges_tile(result, learners=range(4))
  assert result.tokens == modes.prepare(unequal).token_budget and np.isfinite(result.final_eval_loss)


def test_the_defaults_rounds_gather_a_deadlines_reports_where_rounds_of_h_steps_merge_one_at_a_time(unequal, tmp_path):
  """configs/default.py's rounds (deadlines, τ = 4: the asynchrony study's winner) let K=1 + grace merge most of a
  deadline's reports at once; the rounds every earlier result was recorded with (default.fixed_rounds: H steps, no
  overlap, hence no grace window) merge them one at a time."""
  from configs import default  # pylint: disable=g-import-not-at-top
  defaults = default.get_config()
  unequal.rounds.length, unequal.overlap_steps = defaults.rounds.length, defaults.overlap_steps
  ours = modes.train(unequal, tmp_path / "defaults")[0]
  default.fixed_rounds(unequal)
  fixed = modes.train(unequal, tmp_path / "fixed")[0]
  per_merge = {name: np.mean([r["num_merged"] for r in _merges(result)]) for name, result in
               (("defaults", ours), ("fixed", fixed))}
  assert per_merge["defaults"] >= 2.5 and per_merge["fixed"] == 1, per_merge  # (2.7 and 1 when written)
  assert ours.extras["goodput"] > fixed.extras["goodput"]  # the overlap hides the syncs (0.968 and 0.948)
  assert ours.tokens == fixed.tokens
