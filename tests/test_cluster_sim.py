"""The goodput simulator obeys its model's closed forms, reproduces a seed, prints the table."""

import math
import os
import subprocess
import sys

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np
import pytest

from configs import goodput
from runtime.sim import config as sim_config
from runtime.sim import model
from runtime.sim import table
from runtime.errors import ConfigError

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DATA_PARALLEL = sim_config.Setup("data-parallel", "data-parallel", 1)
_ELASTIC = sim_config.Setup("elastic data-parallel", "elastic", 1)


def _decoupled(learners: int) -> sim_config.Setup:
  return sim_config.Setup(f"Decoupled M={learners}", "decoupled", learners)


def _config(**overrides: object) -> sim_config.ClusterSimConfig:
  config = goodput.get_config()
  config.update({"horizon_days": 2.0, "seeds": 4, **overrides})
  return sim_config.from_config_dict(config)


def _renewal_goodput(chips: int, downtime_s: float, save_s: float) -> float:
  """Goodput of one unit that restarts for downtime_s and loses work since its last save point."""
  rate = chips / sim_config.SECONDS_PER_YEAR
  x = rate * save_s
  kept = x * math.exp(-x) / -math.expm1(-x)  # E[saved work per up-period] · rate
  return kept / (1.0 + rate * downtime_s)


def _down_fraction(chips: int, downtime_s: float) -> float:
  rate = chips / sim_config.SECONDS_PER_YEAR
  return rate * downtime_s / (1.0 + rate * downtime_s)


def test_zero_costs_give_full_goodput_and_uptime():
  config = _config(restart_s=0.0, reconfig_s=0.0, repair_s=0.0, step_s=1e-6, learners=(2, 16))
  for result in table.run_table(config):
    assert result.goodput.min() > 0.99999, result.setup.name
    assert result.uptime.min() == 1.0


def test_data_parallel_goodput_is_one_over_one_plus_cost_over_cluster_mtbf():
  chips, restart_s = 600_000, 60.0
  result = model.simulate(_config(restart_s=restart_s, step_s=1e-3), _DATA_PARALLEL, chips)
  mtbf_cluster = sim_config.SECONDS_PER_YEAR / chips
  assert result.goodput.mean() == pytest.approx(1.0 / (1.0 + restart_s / mtbf_cluster), abs=0.01)


def test_data_parallel_loses_the_work_since_its_last_checkpoint():
  config = _config(restart_s=30.0, step_s=1.0, checkpoint_every_steps=20)
  result = model.simulate(config, _DATA_PARALLEL, 300_000)
  assert result.goodput.mean() == pytest.approx(_renewal_goodput(300_000, 30.0, 20.0), abs=0.01)
  assert result.goodput.mean() < _renewal_goodput(300_000, 30.0, 1.0) - 0.05


def test_m_learners_on_n_chips_match_elastic_data_parallel_on_n_over_m_chips():
  config = _config()
  learners = model.simulate(config, _decoupled(4), 1_200_000).goodput.mean()
  elastic = model.simulate(config, _ELASTIC, 300_000).goodput.mean()
  assert learners == pytest.approx(elastic, abs=0.005)


def test_restarting_learners_lose_the_work_since_their_last_sync():
  config = _config(learner_recovery="restart", reconfig_s=20.0, sync_every_steps=24, step_s=1.0)
  result = model.simulate(config, _decoupled(2), 600_000)
  assert result.goodput.mean() == pytest.approx(_renewal_goodput(300_000, 20.0, 24.0), abs=0.01)


def test_syncer_with_quorum_one_stalls_only_when_every_learner_is_down():
  config = _config(reconfig_s=22.0, quorum=1, learners=(2,))
  result = model.simulate(config, _decoupled(2), 2_400_000)
  assert result.uptime.mean() == pytest.approx(1.0 - _down_fraction(1_200_000, 22.0) ** 2, abs=0.01)


def test_syncer_with_full_quorum_stalls_whenever_any_learner_is_down():
  config = _config(reconfig_s=22.0, quorum=4, learners=(4,))
  full = model.simulate(config, _decoupled(4), 1_200_000)
  assert full.uptime.mean() == pytest.approx((1.0 - _down_fraction(300_000, 22.0)) ** 4, abs=0.01)
  one = model.simulate(_config(reconfig_s=22.0, quorum=1), _decoupled(4), 1_200_000)
  assert full.goodput.mean() < one.goodput.mean() - 0.1


def test_slices_in_repair_idle_their_chips_by_littles_law():
  horizon_s, repair_s, slice_chips = 2.0 * sim_config.SECONDS_PER_DAY, 3600.0, 256
  config = _config(reconfig_s=0.0, step_s=1e-6, repair_s=repair_s, slice_chips=slice_chips)
  result = model.simulate(config, _ELASTIC, 150_000)
  # Repairs that would end after the horizon are cut at it, hence the repair_s² / 2T term.
  clipped_repair_s = repair_s - repair_s**2 / (2.0 * horizon_s)
  idle = slice_chips / sim_config.SECONDS_PER_YEAR * clipped_repair_s
  assert result.goodput.mean() == pytest.approx(1.0 - idle, abs=0.002)


def test_same_seed_reproduces_exactly_and_another_seed_differs():
  first = model.simulate(_config(seed=7), _decoupled(4), 600_000)
  again = model.simulate(_config(seed=7), _decoupled(4), 600_000)
  other = model.simulate(_config(seed=8), _decoupled(4), 600_000)
  np.testing.assert_array_equal(first.goodput, again.goodput)
  np.testing.assert_array_equal(first.uptime, again.uptime)
  assert not np.array_equal(first.goodput, other.goodput)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 100.0), max_size=40), st.floats(0.0, 30.0))
def test_downtime_starts_match_a_sequential_scan(times: list[float], downtime_s: float):
  times = sorted(times)
  expected, end = [], -math.inf
  for index, time in enumerate(times):
    if time >= end:
      expected.append(index)
      end = time + downtime_s
  starts = model.downtime_starts(np.array(times, dtype=np.float64), downtime_s)
  assert starts.tolist() == expected


def test_straggler_efficiency_is_one_without_jitter_and_falls_with_group_size():
  assert model.straggler_efficiency(10_000, 0.0) == 1.0
  # One slice: the mean of |z| is sqrt(2 / pi).
  one_slice = 1.0 / (1.0 + 0.1 * math.sqrt(2 / math.pi))
  assert model.straggler_efficiency(1, 0.1) == pytest.approx(one_slice)
  assert model.straggler_efficiency(10, 0.1) > model.straggler_efficiency(1000, 0.1)


def test_student_t_quantile_matches_tables():
  assert table.student_t_quantile(0.975, 1) == pytest.approx(12.706, abs=2e-3)
  assert table.student_t_quantile(0.975, 4) == pytest.approx(2.776, abs=1e-3)


@pytest.mark.parametrize("field, value", [("quorum", 3), ("repair_s", -1.0), ("step_s", 0.0),
                                          ("learner_recovery", "pause"), ("chips", ()),
                                          ("calibration_chips", 123)])
def test_invalid_config_names_the_field(field: str, value: object):
  config = goodput.get_config()
  config.update({"learners": (2, 4), field: value})
  with pytest.raises(ConfigError, match=field):
    sim_config.from_config_dict(config)


def test_committed_costs_reproduce_their_calibration_cells():
  config = _config()
  column = sim_config.PAPER_CHIPS.index(config.calibration_chips)
  for setup in (_DATA_PARALLEL, _ELASTIC):
    ours = 100.0 * model.simulate(config, setup, config.calibration_chips).goodput.mean()
    assert ours == pytest.approx(sim_config.PAPER_GOODPUT[setup.name][column], abs=1.0)


def test_calibrate_fits_both_costs_to_the_paper_cells():
  config = table.calibrate(_config(horizon_days=0.5, seeds=2, restart_s=1.0, reconfig_s=1.0))
  assert 60.0 < config.restart_s < 110.0 and 15.0 < config.reconfig_s < 30.0
  for setup, paper in ((_DATA_PARALLEL, 0.38), (_ELASTIC, 0.69)):
    ours = model.simulate(config, setup, 600_000).goodput.mean()
    assert ours == pytest.approx(paper, abs=1e-3)


def test_command_prints_the_table_beside_the_paper_and_writes_the_png(tmp_path):
  command = [sys.executable, "-m", "launch.simulate", "--config=configs/goodput.py",
             "--config.horizon_days=0.2", "--config.seeds=2", f"--workdir={tmp_path}"]
  output = subprocess.run(command, cwd=_REPO, capture_output=True, text=True, check=True,
                          timeout=120).stdout
  lines = output.splitlines()
  for name in sim_config.PAPER_GOODPUT:
    assert sum(line.startswith(f"{name:<22}|") for line in lines) == 2  # goodput and uptime rows
  assert "Predicted cells within ±3 points" in output
  assert (tmp_path / "goodput.png").stat().st_size > 10_000
