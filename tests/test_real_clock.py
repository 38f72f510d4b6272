"""The real (wall-time) clock: the same controller, completions taken in the order they really happen."""

import numpy as np

from runtime import modes
from runtime.diloco.controller import Controller
from runtime.experiment import Experiment


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


def test_evaluating_after_every_merge_does_not_idle_the_learners(tiny_config):
  # Regression: the controller evaluated Θ itself after merges, and every learner whose round ended
  # meanwhile waited for it.
  tiny_config.eval_batches = 16  # an evaluation costs about as much as a learner's round
  tiny_config.data.eval_fraction = 0.1
  tiny_config.total_steps = 24
  busy = {}
  for name, every in (("never", 10_000), ("every merge", 1)):
    tiny_config.eval_every = every
    tiny_config.clock.kind = "real"
    tiny_config.learners = 2
    prepared = modes.prepare(tiny_config)
    result = Controller(prepared, Experiment(prepared), None, name).train()
    evals, merges = ([r for r in result.records if r["kind"] == kind] for kind in ("eval", "merge"))
    assert len(evals) == 1 if every > 100 else len(evals) >= len(merges) >= 8
    busy[name] = result.extras["busy_mean"]
  assert busy["every merge"] >= busy["never"] - 0.02, busy
