"""The real (wall-time) clock: the same controller, completions taken in the order they really happen."""

import numpy as np
import pytest

from runtime.experiments import modes
from runtime.diloco.controller import Controller
from runtime.train.harness import Experiment


def _real(config):
  config.clock.kind = "real"
  config.learners = 2
  config.total_steps = 16
  config.eval_every = 16
  run = modes.prepare(config)
  return run, Controller(run, Experiment(run), None, "real").train()


def _assert_ranges_tile(result):
  for m in (0, 1):
    ranges = sorted((a, b) for l, a, b in result.details["merged_ranges"] if l == m)
    assert ranges and ranges[0][0] == 0
    assert all(prev[1] == nxt[0] for prev, nxt in zip(ranges, ranges[1:])), f"learner {m}: {ranges}"


def test_real_clock_run_spends_the_budget_and_learns(tiny_config):
  run, result = _real(tiny_config)
  merges = [r for r in result.records if r["kind"] == "merge"]
  assert result.tokens == run.token_budget
  _assert_ranges_tile(result)
  assert merges and all(r["time"] > 0 for r in merges)
  assert [r["time"] for r in merges] == sorted(r["time"] for r in merges)
  assert result.final_eval_loss < min(merges[0]["loss"], np.log(256))  # below uniform over bytes


def test_real_clock_survives_a_crash_raised_inside_the_device_program(tiny_config):
  tiny_config.faults.schedule = "crash:learner=1,step=6"
  tiny_config.faults.repair_seconds = 0.0  # back at once: the survivor cannot spend the budget first
  run, result = _real(tiny_config)
  faults = result.details["faults"]
  crash, = [f for f in faults if f["fault"] == "crash"]
  assert "JaxRuntimeError" in crash["detail"]
  assert any(f["fault"] == "rejoin" and f["learner"] == 1 for f in faults)
  assert result.tokens == run.token_budget
  _assert_ranges_tile(result)
  assert np.isfinite(result.final_eval_loss)


@pytest.mark.slow  # timed on real wall clocks (noisy on a shared box); ~40 s
def test_evaluating_after_every_merge_does_not_idle_the_learners(tiny_config):
  # Regression: the controller evaluated Θ itself after merges, and every learner whose round ended
  # meanwhile waited for it. Learners here never wait for Θ (they keep training until it arrives), so only
  # a controller that is busy elsewhere can idle them; a part's busy time ends when its program finished.
  tiny_config.clock.kind = "real"
  tiny_config.learners = 2
  tiny_config.model.d_model = 128
  tiny_config.model.mlp_dim = 512
  tiny_config.eval_batches = 16  # an evaluation costs about as much as a learner's round
  tiny_config.data.eval_fraction = 0.1
  tiny_config.total_steps = 32
  tiny_config.inner_steps = 8
  tiny_config.overlap_steps = 2
  tiny_config.outer.keep_training = True

  def busy(eval_every):
    tiny_config.eval_every = eval_every
    run = modes.prepare(tiny_config)
    result = Controller(run, Experiment(run), None, "run").train()
    evals, merges = ([r for r in result.records if r["kind"] == kind] for kind in ("eval", "merge"))
    assert len(evals) == 1 if eval_every > 100 else len(evals) >= len(merges) >= 6
    return result.extras["busy_mean"]

  busy(10_000)  # compiles every program first
  never, every = zip(*((busy(10_000), busy(1)) for _ in range(2)))  # alternating: the host's load hits both
  assert np.mean(every) >= np.mean(never) - 0.02, (never, every)


def test_the_multislice_support_is_imported_before_the_real_clock_starts(tiny_config, monkeypatch):
  """pathwaysutils takes about a second to import: at the first error classified or slice repaired, the run stalled."""
  from runtime.cluster import multislice  # pylint: disable=g-import-not-at-top
  from runtime.diloco import clock as clock_lib  # pylint: disable=g-import-not-at-top
  multislice._elastic.cache_clear()  # pylint: disable=protected-access
  looked_up_at_start = []
  resume = clock_lib.RealClock.resume

  def recording_resume(clock):
    looked_up_at_start.append(multislice._elastic.cache_info().currsize)  # pylint: disable=protected-access
    resume(clock)

  monkeypatch.setattr(clock_lib.RealClock, "resume", recording_resume)
  _real(tiny_config)
  assert looked_up_at_start[0] == 1
