"""The data-parallel baselines: synchronous DP, and DP under a fault trace (elastic, or restarting)."""

import jax
import numpy as np
import pytest

from runtime.trained import load_model
from runtime.experiments import modes
from runtime.faults import plan
from runtime.train.harness import Experiment


def _run(config, workdir=None):
  run = modes.prepare(config)
  return modes.train_one(run, Experiment(run), workdir, "dp")


def test_dp_on_8_devices_matches_1_device_at_the_same_global_batch(tiny_config):
  tiny_config.mode = "dp"
  tiny_config.total_steps = 6
  tiny_config.num_devices = 8
  eight = _run(tiny_config)
  tiny_config.num_devices = 1
  one = _run(tiny_config)
  losses = lambda r: [x["loss"] for x in r.records if x["kind"] == "train"]
  assert len(losses(eight)) == 6
  np.testing.assert_allclose(losses(eight), losses(one), rtol=2e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), eight.params, one.params)


def test_dp_loss_falls_on_the_real_corpus_and_writes_metrics(tiny_config, tmp_path):
  tiny_config.mode = "dp"
  tiny_config.total_steps = 40
  tiny_config.eval_every = 20
  tiny_config.log_every = 5
  tiny_config.tensorboard = True
  result = _run(tiny_config, tmp_path)
  train_losses = [x["loss"] for x in result.records if x["kind"] == "train"]
  evals = [x["eval_loss"] for x in result.records if x["kind"] == "eval"]
  assert train_losses[0] > 5.0  # ~ln 256 at init
  assert result.final_eval_loss < train_losses[0] - 1.0
  assert evals == sorted(evals, reverse=True)
  assert (tmp_path / "dp" / "metrics.jsonl").stat().st_size > 0
  assert list((tmp_path / "dp" / "tb").iterdir())
  _, params, _ = load_model(tmp_path / "dp")  # every mode ends with its model
  jax.tree.map(np.testing.assert_array_equal, params, result.params)


@pytest.fixture
def one_crash(tiny_config, monkeypatch):
  """Four slices, 1 s steps; slice 1 alone fails, once, at t=5.5 (during step 6), and is back at 10.5."""
  monkeypatch.setattr(plan, "crash_times", lambda cfg, s, seed: iter([(5.5, cfg.repair_seconds)] if s == 1 else []))
  tiny_config.total_steps = 24
  tiny_config.faults.repair_seconds = 5.0
  tiny_config.faults.reconfig_seconds = 8.0
  tiny_config.faults.restart_seconds = 30.0
  tiny_config.faults.restart_checkpoint_every = 10
  return tiny_config


def test_elastic_dp_pays_a_reconfiguration_to_drop_and_to_readd_the_slice(one_crash):
  one_crash.mode = "dp_elastic"
  result = _run(one_crash)
  # 5 steps; crash at 5.5 (step 6 lost); drop the slice (+8 s), 1 step on 3 slices; re-add (+8 s) at 14.5,
  # then 18 full steps to pass the 24-step budget: 5.5 + 8 + 1 + 8 + 1 + 18 = 41.5.
  assert result.virtual_seconds == pytest.approx(41.5)
  assert result.extras["faults"] == 1
  # Slice time of the steps taken (20 + 3 + 4 + 72) over 4 slices × 41.5 s.
  assert result.extras["goodput"] == pytest.approx(99 / (4 * 41.5))


def test_dp_without_elasticity_restarts_from_its_checkpoint(one_crash):
  one_crash.mode = "dp_restart"
  result = _run(one_crash)
  # 5 steps, crash at 5.5, no spare: wait for the repair (10.5), restart (+30 s) from the step-0 checkpoint, then
  # all 24 steps: 64.5 s.
  assert result.virtual_seconds == pytest.approx(64.5)
  assert result.extras["goodput"] == pytest.approx((29 - 5) * 4 / (4 * 64.5))
  assert result.extras["uptime"] == pytest.approx(24 / 64.5)


def test_dp_restart_restores_its_checkpoint_from_disk_and_ends_as_if_never_crashed(one_crash, tmp_path, monkeypatch):
  # Slice 1 fails at 12.5 (during step 13): the job restarts from the step-10 checkpoint, written by orbax.
  monkeypatch.setattr(plan, "crash_times", lambda cfg, s, seed: iter([(12.5, cfg.repair_seconds)] if s == 1 else []))
  one_crash.mode = "dp_restart"
  crashed = _run(one_crash, tmp_path)
  assert crashed.extras["restores"] == 1 and crashed.extras["checkpoint_saves"] == 3  # steps 0, 10, 20
  assert crashed.virtual_seconds == pytest.approx(12.5 + 5 + 30 + 14)  # failed, repaired, restarted, 14 more steps
  assert not list((tmp_path / "dp").glob("restart-checkpoints-*"))  # removed with the run's end
  monkeypatch.setattr(plan, "crash_times", lambda cfg, s, seed: iter([]))
  calm = _run(one_crash)
  assert calm.extras["restores"] == 0
  jax.tree.map(np.testing.assert_array_equal, crashed.params, calm.params)


@pytest.fixture
def wall_crash(tiny_config, monkeypatch):
  """The real clock; slice 1 fails as the job starts (its first step's program fails) and is back 0.3 s later."""
  monkeypatch.setattr(plan, "crash_times",
                      lambda cfg, s, seed: iter([(0.0, 0.3)] if s == 1 and cfg.mtbi_chip_seconds else []))
  tiny_config.faults.mtbi_chip_seconds = 1.0  # (its trace is the one above)
  tiny_config.clock.kind = "real"
  tiny_config.total_steps = 12
  tiny_config.faults.restart_seconds = 0.2
  tiny_config.faults.reconfig_seconds = 0.1
  tiny_config.faults.restart_checkpoint_every = 4
  tiny_config.eval_every = 400  # (an evaluation at the end only)
  return tiny_config


def _crash_records(result):
  return [r for r in result.records if r["kind"] == "fault"]


def test_under_the_real_clock_dp_restart_fails_by_a_device_error_waits_in_wall_time_and_ends_as_if_never_crashed(
    wall_crash, tmp_path, monkeypatch):
  wall_crash.mode = "dp_restart"
  crashed = _run(wall_crash, tmp_path)
  [fault] = _crash_records(crashed)
  assert fault["slice"] == 1 and fault["time"] == 0.0 and "SliceCrash" in fault["error"]  # a genuine device error
  assert crashed.extras["restores"] == 1
  # Down from the failure until the repair (0.3 s), then the restart (0.2 s): no step before 0.5 s of wall time.
  first = min(r["time"] for r in crashed.records if r["kind"] == "train")
  assert first >= 0.5
  assert crashed.extras["run_seconds"] >= first and crashed.extras["goodput"] < 1 - 0.5 / crashed.extras["run_seconds"]
  monkeypatch.setattr(plan, "crash_times", lambda cfg, s, seed: iter([]))
  calm = _run(wall_crash)
  assert calm.extras["restores"] == 0 and not _crash_records(calm)
  jax.tree.map(np.testing.assert_array_equal, crashed.params, calm.params)  # nothing lost, nothing trained twice


@pytest.mark.slow  # CI time (~30 s; two compiles of the step in wall time); the real-clock restart is above
def test_under_the_real_clock_elastic_dp_drops_the_failed_slice_and_takes_it_back_after_its_repair(wall_crash):
  wall_crash.mode = "dp_elastic"
  wall_crash.total_steps = 200  # long enough in wall time for slice 1's repair (0.3 s) to end before the budget
  result = _run(wall_crash)
  [fault] = _crash_records(result)
  assert fault["slice"] == 1 and "SliceCrash" in fault["error"]
  trained = [(r["time"], r["slices"]) for r in result.records if r["kind"] == "train"]
  assert trained[0][1] == 3 and trained[0][0] >= 0.1  # on the survivors, after the reconfiguration
  back = [at for at, slices in trained if slices == 4]
  assert back and back[0] >= 0.3 + 0.1  # the repaired slice rejoins after its repair and another reconfiguration
  assert result.tokens >= wall_crash.total_steps * wall_crash.data.batch_size * wall_crash.data.seq_len  # the budget


@pytest.mark.slow  # four real-clock runs, ~55 s; the restart mode's real-clock faults are in the default suite
def test_the_chaos_comparison_runs_every_mode_on_one_wall_clock_trace_with_real_failures(wall_crash):
  wall_crash.learners = 4
  results = {r.run: r for r in modes.chaos(wall_crash, None)}
  assert list(results) == ["decoupled", "dp_elastic", "dp_restart", "decoupled_no_faults"]
  for name in ("dp_elastic", "dp_restart"):
    [fault] = _crash_records(results[name])
    assert fault["slice"] == 1 and "SliceCrash" in fault["error"]
  faults = [(f["fault"], f["learner"]) for f in results["decoupled"].details["faults"]]
  assert faults[0] == ("crash", 1) and set(faults[1:]) <= {("rejoin", 1)}  # (back if its repair ends in time)
  assert results["decoupled_no_faults"].extras["faults"] == 0
  for result in results.values():
    assert result.time_kind == "wall" and result.extras["run_seconds"] > 0 and 0 < result.extras["goodput"] <= 1
    assert result.tokens >= wall_crash.total_steps * wall_crash.data.batch_size * wall_crash.data.seq_len
