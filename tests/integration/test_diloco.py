"""Decoupled DiLoCo under the controller: equivalences, reproducibility, heterogeneity, grace window."""

import subprocess
import sys

import jax
import numpy as np
import optax
import pytest
from invariants import assert_ranges_tile

from models import lm
from runtime.experiments import modes
from runtime.errors import TrainingDiverged
from runtime.train.harness import Experiment
from runtime.reporting.metrics import without_wall_time
from runtime.train.optim import inner_optimizer
from runtime.train.programs import init_state, make_train_step


def _run(config, workdir=None, name="run"):
  run = modes.prepare(config)
  return modes.train_one(run, Experiment(run), workdir, name)


def _assert_trees_close(a, b, rtol=1e-4, atol=1e-5):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol), a, b)


def _unit_outer_sgd(config):
  config.outer.lr = 1.0
  config.outer.momentum = 0.0
  config.outer.nesterov = False


def test_one_learner_one_step_rounds_and_unit_outer_sgd_reproduce_plain_adamw(tiny_config):
  tiny_config.learners = 1
  tiny_config.num_devices = 1
  tiny_config.inner_steps = 1
  tiny_config.total_steps = 8
  _unit_outer_sgd(tiny_config)
  diloco = _run(tiny_config)
  tiny_config.mode = "dp"
  dp = _run(tiny_config)
  merge_losses = [r["loss"] for r in diloco.records if r["kind"] == "merge"]
  dp_losses = [r["loss"] for r in dp.records if r["kind"] == "train"]
  assert len(merge_losses) == 8
  np.testing.assert_allclose(merge_losses, dp_losses, rtol=1e-5)
  _assert_trees_close(diloco.params, dp.params)


def test_quorum_of_all_with_equal_weights_and_mean_matches_a_synchronous_diloco_reference(tiny_config):
  tiny_config.mode = "diloco_sync"
  tiny_config.learners = 2
  tiny_config.inner_steps = 3
  tiny_config.total_steps = 6
  tiny_config.outer.merge = "mean"
  tiny_config.outer.token_weighting = False
  result = _run(tiny_config)

  run = modes.prepare(tiny_config)
  exp = Experiment(run)
  tx = inner_optimizer(run.inner, run.total_steps)
  step = jax.jit(make_train_step(run.model, tx))
  theta = lm.init_params(run.model, jax.random.key(run.seed))
  outer = optax.sgd(run.outer.lr, momentum=run.outer.momentum, nesterov=True)
  outer_state = outer.init(theta)
  states = [init_state(theta, tx) for _ in range(2)]
  shards = [exp.shard(m, 2, run.data.batch_size // 2) for m in range(2)]
  for _ in range(run.total_steps // run.inner_steps):
    for m in range(2):
      for _ in range(run.inner_steps):
        states[m], _ = step(states[m], next(shards[m]))
    delta = jax.tree.map(lambda t, a, b: t - (a + b) / 2, theta, states[0].params, states[1].params)
    updates, outer_state = outer.update(delta, outer_state, theta)
    theta = optax.apply_updates(theta, updates)
    states = [s.replace(params=theta) for s in states]

  assert result.extras["merges"] == 2 and result.extras["learners_per_merge"] == 2
  _assert_trees_close(result.params, theta)


@pytest.mark.slow  # CI time; tests/integration/test_bit_identity.py guards the same promise
def test_virtual_clock_gives_identical_metrics_for_one_seed(tiny_config, tmp_path):
  tiny_config.clock.jitter = 0.3
  tiny_config.clock.speeds = (1.0, 1.3, 0.8, 1.1)
  _run(tiny_config, tmp_path / "a")
  _run(tiny_config, tmp_path / "b")
  first = (tmp_path / "a" / "run" / "metrics.jsonl").read_text()
  second = (tmp_path / "b" / "run" / "metrics.jsonl").read_text()
  assert first.count('"kind": "merge"') >= 4 and first.count('"wall_time"') == first.count("\n")
  assert without_wall_time(first) == without_wall_time(second) and '"wall_time"' not in without_wall_time(first)


def test_quorum_one_keeps_fast_learners_busy_while_quorum_all_idles_them(tiny_config):
  tiny_config.clock.speeds = (1.0, 1.0, 1.0, 2.0)
  tiny_config.total_steps = 24
  asynchronous = _run(tiny_config)
  tiny_config.mode = "diloco_sync"
  synchronous = _run(tiny_config)
  fast_async = asynchronous.details["busy"][:3]
  fast_sync = synchronous.details["busy"][:3]
  assert min(fast_async) >= 0.99, fast_async
  assert all(0.4 <= b <= 0.6 for b in fast_sync), fast_sync
  assert asynchronous.extras["learners_per_merge"] < synchronous.extras["learners_per_merge"] == 4


@pytest.mark.slow  # ~35 s: two runs of 4 learners
def test_grace_window_merges_more_learners_without_lowering_busy_fraction(tiny_config):
  tiny_config.clock.jitter = 0.3
  tiny_config.inner_steps = 6
  tiny_config.overlap_steps = 2
  tiny_config.total_steps = 36
  tiny_config.outer.grace = "none"
  no_grace = _run(tiny_config)
  tiny_config.outer.grace = "adaptive"
  grace = _run(tiny_config)
  assert grace.extras["learners_per_merge"] > no_grace.extras["learners_per_merge"] + 0.5
  assert grace.extras["busy_min"] >= no_grace.extras["busy_min"] - 0.01
  for result in (no_grace, grace):  # overlap steps carried onto Θ reach it in the next report
    assert_ranges_tile(result, learners=range(4))
    assert result.tokens == modes.prepare(tiny_config).token_budget


def test_merge_starts_as_soon_as_the_quorum_has_reported(tiny_config):
  tiny_config.clock.speeds = (1.0, 1.1, 1.2, 1.3)
  tiny_config.outer.quorum = 2
  tiny_config.outer.grace = "none"
  tiny_config.total_steps = 8
  result = _run(tiny_config)
  first = next(r for r in result.records if r["kind"] == "merge")
  assert first["merged"] == [0, 1] and first["quorum"] == 2
  assert first["time"] == pytest.approx(4.4, abs=1e-3)  # learner 1's report: 4 steps × 1.1 s


def test_a_learner_finishing_its_budget_lowers_the_quorum_and_the_last_reports_merge(tiny_config):
  # Regression: with K=2 the learner that went DONE lowered the effective quorum but nobody re-checked
  # the waiting report; the clock ran dry (IndexError) and the last report was never merged.
  tiny_config.learners = 3
  tiny_config.num_devices = 3
  tiny_config.data.batch_size = 12
  tiny_config.outer.quorum = 2
  tiny_config.clock.latency_s = 1.0
  tiny_config.clock.speeds = (1.0, 1.0, 1.2)
  tiny_config.inner_steps = 3
  tiny_config.total_steps = 3
  result = _run(tiny_config)
  assert result.tokens == modes.prepare(tiny_config).token_budget
  assert_ranges_tile(result, learners=range(3))


def test_a_diverging_outer_step_stops_the_run_naming_the_field(tiny_config):
  # Regression: Θ went NaN at the first merge, then every report was quarantined and served again forever.
  tiny_config.outer.lr = 1e9
  tiny_config.outer.divergence_merges = 3
  with pytest.raises(TrainingDiverged, match=r"outer\.lr \(now 1e\+09\)"):
    _run(tiny_config)


@pytest.mark.slow  # CI time: a subprocess; the in-process divergence test stays
def test_the_launcher_reports_divergence_in_one_line_with_a_non_zero_exit(tmp_path):
  # Overrides as a researcher would type them; the run stops at the third merge that commits nothing.
  command = [sys.executable, "-m", "launch.train", "--config=configs/smoke.py", f"--workdir={tmp_path}",
             "--config.outer.lr=1e9", "--config.outer.divergence_merges=3",
             "--config.data.max_bytes=300000", "--config.total_steps=40",
             "--config.progress=False", "--config.tensorboard=False"]
  done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 1, done.stderr[-2000:]
  assert done.stderr.strip().splitlines()[-1].startswith("error: training diverged"), done.stderr[-2000:]
  assert "Traceback" not in done.stderr


def test_learners_with_different_batches_get_different_weights_and_the_weighting_acts(tiny_config):
  # Regression: every report covered H − τ steps of one batch size, so w = c_tokens²/c_steps never differed.
  tiny_config.learners = 2
  tiny_config.num_devices = 2
  tiny_config.data.learner_batches = (12, 4)
  tiny_config.outer.quorum = 2
  tiny_config.clock.speeds = (1.0, 1.0)
  weighted = _run(tiny_config)
  merge = next(r for r in weighted.records if r["kind"] == "merge")
  weights = dict(zip(merge["merged"], merge["weights"]))
  assert weights.keys() == {0, 1} and weights[0] == pytest.approx(9 * weights[1])
  assert merge["time"] == pytest.approx(4 * 12 / 8, abs=1e-3)  # the larger batch's steps take 1.5× as long
  assert_ranges_tile(weighted, learners=range(2))
  assert weighted.tokens == modes.prepare(tiny_config).token_budget
  tiny_config.outer.token_weighting = False
  unweighted = _run(tiny_config)
  differs = jax.tree.map(lambda a, b: not np.allclose(a, b, rtol=1e-3), weighted.params, unweighted.params)
  assert any(jax.tree.leaves(differs))


@pytest.mark.slow  # CI time (~20 s); `pytest -m slow` runs it
def test_a_budget_that_ends_inside_a_round_is_trained_to_the_last_token(tiny_config):
  # Regression: 17 steps × 4 learners = 68 learner-steps of H=8 left 4 steps no learner could start.
  tiny_config.inner_steps = 8
  tiny_config.total_steps = 17
  result = _run(tiny_config)
  assert result.tokens == modes.prepare(tiny_config).token_budget
  assert_ranges_tile(result, learners=range(4))
