"""The goodput simulator obeys closed forms and exact hand-worked traces, replays its own traces, prints the table."""

import dataclasses
import json
import math
import os
import re
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
from runtime.sim import trace as trace_lib
from runtime.sim.timeline import downtime_starts
from runtime.errors import ConfigError

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_YEAR = sim_config.SECONDS_PER_YEAR
_DATA_PARALLEL = sim_config.Setup("data-parallel", "data-parallel", 1)
_ELASTIC = sim_config.Setup("elastic data-parallel", "elastic", 1)
# No repair, no spares, no syncer failures: the closed forms of a single renewal process apply.
_BARE = {"repair_s": 0.0, "spare_fraction": 0.0, "syncer_mtbi_days": 0.0}


def _decoupled(learners: int) -> sim_config.Setup:
  return sim_config.Setup(f"Decoupled M={learners}", "decoupled", learners)


def _config(**overrides: object) -> sim_config.ClusterSimConfig:
  config = goodput.get_config()
  config.update({"horizon_days": 2.0, "seeds": 4, **overrides})
  return sim_config.from_config_dict(config)


def _trace(setup: sim_config.Setup, slices: int, failures: list[tuple[int, float, float]], spares: int = 0,
           horizon_s: float = 10_000.0, syncer: tuple = ()) -> trace_lib.FailureTrace:
  """A hand-written trace of 256-chip slices and 1 s steps; failures are (slice, t_fail, t_repaired)."""
  rows = sorted(failures, key=lambda f: (f[0] // (slices // setup.learners), f[1]))
  column = lambda i, kind: np.array([r[i] for r in rows], kind)
  return trace_lib.FailureTrace(setup, slices, spares, 256.0, 1.0, horizon_s, column(0, np.int64),
                                column(1, np.float64), column(2, np.float64), np.array(syncer).reshape(-1, 2))


def _renewal_goodput(chips: int, downtime_s: float, save_s: float) -> float:
  """Goodput of one unit that restarts for downtime_s and loses work since its last save point."""
  rate = chips / _YEAR
  x = rate * save_s
  kept = x * math.exp(-x) / -math.expm1(-x)  # E[saved work per up-period] · rate
  return kept / (1.0 + rate * downtime_s)


def _down_fraction(chips: int, downtime_s: float) -> float:
  rate = chips / _YEAR
  return rate * downtime_s / (1.0 + rate * downtime_s)


def test_no_failures_give_goodput_one_and_spares_only_cost_their_share_of_the_allocation():
  config = _config(mtbi_years=1e9, syncer_mtbi_days=0.0, spare_fraction=0.0, learners=(2, 16))
  for result in table.run_table(config):
    assert result.goodput.min() == 1.0 and result.uptime.min() == 1.0, result.setup.name
  spared = model.simulate(_config(mtbi_years=1e9, spare_fraction=0.05), _DATA_PARALLEL, 256_000)
  np.testing.assert_array_equal(spared.goodput, 1000 / 1050)  # 1000 slices, ceil(50) spares


def test_data_parallel_loses_rate_times_restart_plus_half_a_checkpoint_interval():
  restart_s, every = 30.0, 20
  config = _config(**_BARE, mtbi_years=30.0, restart_s=restart_s, checkpoint_every_steps=every, seeds=8)
  chips = 300_000
  rate = chips / (30.0 * _YEAR)
  loss = 1.0 - model.simulate(config, _DATA_PARALLEL, chips).goodput.mean()
  assert loss == pytest.approx(rate * (restart_s + every / 2.0), rel=0.1)
  assert 1.0 - loss == pytest.approx(_renewal_goodput(chips // 30, restart_s, every), abs=0.002)


def test_one_units_uptime_is_mtbi_over_mtbi_plus_downtime():
  chips, restart_s = 600_000, 60.0
  result = model.simulate(_config(**_BARE, restart_s=restart_s), _DATA_PARALLEL, chips)
  mtbi_unit = _YEAR / chips
  assert result.uptime.mean() == pytest.approx(mtbi_unit / (mtbi_unit + restart_s), abs=0.01)


def test_data_parallel_without_spares_waits_for_the_repair_as_well():
  chips, restart_s, repair_s = 150_000, 60.0, 600.0
  config = _config(**{**_BARE, "repair_s": repair_s}, restart_s=restart_s, mtbi_years=30.0, seeds=8,
                   horizon_days=4.0)
  mtbi_unit = 30.0 * _YEAR / chips  # λ·(repair + restart) = 0.1: a second failure in a repair is rare
  result = model.simulate(config, _DATA_PARALLEL, chips)
  assert result.uptime.mean() == pytest.approx(mtbi_unit / (mtbi_unit + restart_s + repair_s), abs=0.01)
  spared = model.simulate(dataclasses.replace(config, spare_fraction=0.05), _DATA_PARALLEL, chips)
  assert spared.uptime.mean() == pytest.approx(mtbi_unit / (mtbi_unit + restart_s), abs=0.005)


def test_restarting_learners_pay_the_restart_and_lose_the_work_since_their_last_sync():
  config = _config(**_BARE, learner_recovery="restart", restart_s=20.0, reconfig_s=500.0, sync_every_steps=24)
  result = model.simulate(config, _decoupled(2), 600_000)
  assert result.goodput.mean() == pytest.approx(_renewal_goodput(300_000, 20.0, 24.0), abs=0.01)


def test_syncer_with_quorum_one_stalls_only_when_every_learner_is_down():
  config = _config(**_BARE, reconfig_s=22.0, quorum=1, learners=(2,))
  result = model.simulate(config, _decoupled(2), 2_400_000)
  assert result.uptime.mean() == pytest.approx(1.0 - _down_fraction(1_200_000, 22.0) ** 2, abs=0.01)


def test_syncer_with_full_quorum_stalls_whenever_any_learner_is_down():
  config = _config(**_BARE, reconfig_s=22.0, quorum=4, learners=(4,))
  full = model.simulate(config, _decoupled(4), 1_200_000)
  assert full.uptime.mean() == pytest.approx((1.0 - _down_fraction(300_000, 22.0)) ** 4, abs=0.01)
  one = model.simulate(_config(**_BARE, reconfig_s=22.0, quorum=1), _decoupled(4), 1_200_000)
  assert full.goodput.mean() < one.goodput.mean() - 0.05


def test_slice_failures_never_fall_in_a_repair_and_their_rate_is_one_over_mtbi_plus_repair():
  config = _config(mtbi_years=256 * 600.0 / _YEAR, repair_s=600.0, horizon_days=5.0)  # a slice: MTBI = repair
  drawn = trace_lib.draw(config, _ELASTIC, 64 * 256, 0)
  for index in range(drawn.slices):
    mine = drawn.slice_of == index
    assert np.all(drawn.fail_s[mine][1:] >= drawn.repaired_s[mine][:-1])
  expected = drawn.slices * config.horizon_s / (600.0 + 600.0)
  assert drawn.fail_s.size == pytest.approx(expected, rel=0.05)


def test_elastic_drop_repair_and_rejoin_cost_exactly_two_reconfigurations_and_the_slices_repair():
  config = _config(reconfig_s=20.0)
  trace = _trace(_ELASTIC, 4, [(0, 1000.0, 1600.0)])
  lost = 4 * 20.0 + (600.0 - 20.0) + 4 * 20.0  # slice-seconds: drop, the slice's repair minus the drop, rejoin
  assert model.evaluate(config, trace)[0] == pytest.approx(1.0 - lost / (4 * 10_000.0), abs=1e-12)


def test_a_learner_with_every_slice_in_repair_is_down_and_loses_no_more_than_its_chips():
  config = _config(reconfig_s=10.0)
  trace = _trace(_decoupled(2), 4, [(0, 100.0, 700.0), (1, 200.0, 800.0)])
  # Learner 0 (slices 0, 1): drop at 100 and 200 (10 s each), out 200-700, rejoins at 700 and 800.
  lost = 2 * 10.0 + (200.0 - 110.0) + 2 * 500.0 + 2 * 10.0 + (800.0 - 710.0) + 2 * 10.0
  goodput, uptime = model.evaluate(config, trace)
  assert goodput == pytest.approx(1.0 - lost / (4 * 10_000.0), abs=1e-12)
  assert uptime == 1.0


def test_data_parallel_restarts_its_checkpoint_phase_when_the_job_comes_back():
  config = _config(restart_s=30.0, checkpoint_every_steps=100)
  trace = _trace(_DATA_PARALLEL, 4, [(0, 150.0, 160.0), (1, 230.0, 240.0)], spares=1)
  # 150: 50 s since the checkpoint at 100 lost, back at 180; 230: 50 s since the restart lost, back at 260.
  lost = 4 * (30.0 + 50.0 + 30.0 + 50.0)
  assert model.evaluate(config, trace)[0] == pytest.approx((4 * 10_000.0 - lost) / (5 * 10_000.0), abs=1e-12)


def test_up_learners_finish_their_round_during_a_quorum_stall_then_wait():
  config = _config(reconfig_s=50.0, quorum=2, learners=(2,), sync_every_steps=24)
  trace = _trace(_decoupled(2), 2, [(0, 1000.0, 1000.5)])
  # Stall 1000-1050 (learner 0 reconfigures). Learner 1 is 1000 mod 24 = 16 s into its round: trains 8 s more.
  goodput, uptime = model.evaluate(config, trace)
  lost = 50.0 + (50.0 - 8.0)  # learner 0's rejoin at 1000.5 falls in its reconfiguration, which handles it
  assert goodput == pytest.approx(1.0 - lost / (2 * 10_000.0), abs=1e-12)
  assert uptime == pytest.approx(1.0 - 50.0 / 10_000.0)


def test_a_syncer_failure_stalls_every_learner_after_its_round():
  config = _config(quorum=1, learners=(2,), sync_every_steps=24)
  trace = _trace(_decoupled(2), 2, [], syncer=((100.0, 400.0),))
  goodput, uptime = model.evaluate(config, trace)
  assert goodput == pytest.approx(1.0 - 2 * (300.0 - (24 - 100 % 24)) / (2 * 10_000.0), abs=1e-12)
  assert uptime == pytest.approx(1.0 - 300.0 / 10_000.0)


def test_jitter_costs_a_synchronous_group_its_wait_for_the_slowest_slice_and_lone_slices_nothing():
  config = _config(mtbi_years=1e9, spare_fraction=0.0, syncer_mtbi_days=0.0, speed_jitter=0.1, learners=(16,))
  data_parallel = model.simulate(config, _DATA_PARALLEL, 16 * 256)
  expected = (1.0 + 0.1 * math.sqrt(2 / math.pi)) / (1.0 + 0.1 * model.expected_max_abs_normal(16))
  np.testing.assert_allclose(data_parallel.goodput, expected, rtol=1e-12)
  assert expected < 0.95
  np.testing.assert_array_equal(model.simulate(config, _decoupled(16), 16 * 256).goodput, 1.0)


def test_a_learner_blocked_each_round_keeps_steps_over_steps_plus_the_wait():
  config = _config(mtbi_years=1e9, syncer_mtbi_days=0.0, round_wait_s=6.0, sync_every_steps=24, learners=(4,))
  np.testing.assert_allclose(model.simulate(config, _decoupled(4), 4096).goodput, 24.0 / 30.0, rtol=1e-12)
  np.testing.assert_array_equal(model.simulate(config, _ELASTIC, 4096).goodput, 1.0)


def test_expected_max_of_abs_normals_matches_closed_forms():
  assert model.expected_max_abs_normal(1) == pytest.approx(math.sqrt(2 / math.pi))
  assert model.expected_max_abs_normal(2) == pytest.approx(2 / math.sqrt(math.pi), rel=1e-6)
  assert model.straggler_efficiency(1, 0.3) == 1.0


def test_same_seed_reproduces_exactly_and_another_seed_differs():
  first = model.simulate(_config(seed=7), _decoupled(4), 600_000)
  again = model.simulate(_config(seed=7), _decoupled(4), 600_000)
  other = model.simulate(_config(seed=8), _decoupled(4), 600_000)
  np.testing.assert_array_equal(first.goodput, again.goodput)
  np.testing.assert_array_equal(first.uptime, again.uptime)
  assert not np.array_equal(first.goodput, other.goodput)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 100.0), max_size=40), st.floats(0.0, 30.0), st.randoms())
def test_downtime_starts_match_a_sequential_scan(times: list[float], downtime_s: float, rand):
  times = sorted(times)
  ends = [t + downtime_s * rand.uniform(0.0, 2.0) for t in times]
  expected, end = [], -math.inf
  for index, time in enumerate(times):
    if time >= end:
      expected.append(index)
      end = ends[index]
  assert downtime_starts(np.array(times), np.array(ends)).tolist() == expected


def test_a_drawn_trace_round_trips_through_json_and_replays_to_the_same_goodput():
  config = _config(mtbi_years=0.01, horizon_days=1.0, seeds=3, learner_recovery="restart")
  for setup in (_DATA_PARALLEL, _ELASTIC, _decoupled(4)):
    drawn = trace_lib.draw(config, setup, 4096, 2)
    back = trace_lib.from_json(trace_lib.to_json(drawn))
    assert drawn.fail_s.size > 20 and back.setup == setup and back.spares == drawn.spares
    for field in ("slice_of", "fail_s", "repaired_s", "syncer_failures"):
      np.testing.assert_array_equal(getattr(back, field), getattr(drawn, field))
    assert model.evaluate(config, back) == model.evaluate(config, drawn)
    assert model.evaluate(config, back)[0] == model.simulate(config, setup, 4096).goodput[2]


@pytest.mark.parametrize("edit, field", [
    (lambda d: "{not json", "trace"),
    (lambda d: {**d, "kind": "ring"}, "trace.kind"),
    (lambda d: {**d, "horizon_s": -1}, "trace.horizon_s"),
    (lambda d: {**d, "learners": 3}, "trace.slices"),
    (lambda d: {**d, "slices": [{**d["slices"][0], "failures": [[5.0, 1.0]]}] + d["slices"][1:]},
     r"trace.slices\[0\].failures"),
    (lambda d: {**d, "slices": d["slices"][:1] + [{**d["slices"][1], "failures": [[1, 9], [5, 12]]}]
                + d["slices"][2:]}, r"trace.slices\[1\].failures"),
    (lambda d: {**d, "slices": d["slices"][::-1]}, r"trace.slices\[0\].slice"),
])
def test_a_malformed_trace_names_its_field(edit, field: str):
  data = json.loads(trace_lib.to_json(_trace(_decoupled(2), 4, [(0, 1.0, 2.0)])))
  edited = edit(data)
  with pytest.raises(ConfigError, match=field):
    trace_lib.from_json(edited if isinstance(edited, str) else json.dumps(edited))


def test_student_t_quantile_matches_tables():
  assert table.student_t_quantile(0.975, 1) == pytest.approx(12.706, abs=2e-3)
  assert table.student_t_quantile(0.975, 4) == pytest.approx(2.776, abs=1e-3)


@pytest.mark.parametrize("field, value", [("quorum", 3), ("repair_s", -1.0), ("step_s", 0.0),
                                          ("learner_recovery", "pause"), ("chips", ()),
                                          ("calibration_chips", 123), ("spare_fraction", -0.1),
                                          ("learners", (2, 1024))])
def test_invalid_config_names_the_field(field: str, value: object):
  config = goodput.get_config()
  config.update({"learners": (2, 4), field: value})
  with pytest.raises(ConfigError, match=field):
    sim_config.from_config_dict(config)


def test_committed_costs_reproduce_their_calibration_cells_on_held_out_seeds():
  config = _config(seed=1234)
  column = sim_config.PAPER_CHIPS.index(config.calibration_chips)
  for setup in (_DATA_PARALLEL, _ELASTIC):
    ours = 100.0 * model.simulate(config, setup, config.calibration_chips).goodput.mean()
    assert ours == pytest.approx(sim_config.PAPER_GOODPUT[setup.name][column], abs=1.0)


def test_calibrate_fits_costs_that_hold_on_held_out_seeds():
  config = table.calibrate(_config(horizon_days=0.5, seeds=2, restart_s=1.0, reconfig_s=1.0))
  assert 60.0 < config.restart_s < 110.0 and 5.0 < config.reconfig_s < 20.0
  held_out = dataclasses.replace(config, seed=99, seeds=4, horizon_days=2.0)
  for setup, paper in ((_DATA_PARALLEL, 0.38), (_ELASTIC, 0.69)):
    assert model.simulate(held_out, setup, 600_000).goodput.mean() == pytest.approx(paper, abs=0.015)


def test_command_prints_the_numbers_it_simulates_and_writes_the_png(tmp_path):
  overrides = {"horizon_days": 0.2, "seeds": 2}
  command = [sys.executable, "-m", "launch.simulate", "--config=configs/goodput.py", f"--workdir={tmp_path}"]
  command += [f"--config.{k}={v}" for k, v in overrides.items()]
  output = subprocess.run(command, cwd=_REPO, capture_output=True, text=True, check=True, timeout=120).stdout
  config = _config(**overrides)
  results = table.run_table(config)
  rows = {}
  for line in output.splitlines():  # the goodput table comes before the uptime table
    rows.setdefault(line.split("|")[0].strip(), line)
  within = 0
  for result in results:
    cell = rows[result.setup.name].split("|")[1 + config.chips.index(result.chips)].split()
    mean, half = table.mean_and_ci(100.0 * result.goodput)
    assert cell[0] == f"{mean:5.1f}±{half:<4.1f}".strip()
    paper = sim_config.PAPER_GOODPUT[result.setup.name][sim_config.PAPER_CHIPS.index(result.chips)]
    assert float(cell[2].rstrip("*!")) == pytest.approx(mean - paper, abs=0.051)
    calibration = result.setup.kind != "decoupled" and result.chips == config.calibration_chips
    within += not calibration and abs(mean - paper) <= 3.0
  assert re.search(rf"within ±3 points: {within} of 28", output)
  assert (tmp_path / "goodput.png").stat().st_size > 10_000


def test_command_writes_the_trace_it_simulates(tmp_path):
  path = tmp_path / "trace.json"
  command = [sys.executable, "-m", "launch.simulate", "--config=configs/goodput.py", "--config.mtbi_years=0.01",
             "--config.horizon_days=1", "--config.seeds=2", f"--trace={path}", "--trace_setup=Decoupled M=2",
             "--trace_chips=2048", "--trace_seed=1"]
  subprocess.run(command, cwd=_REPO, capture_output=True, text=True, check=True, timeout=120)
  replayed = trace_lib.from_json(path.read_text())
  assert replayed.slices == 8 and replayed.setup == _decoupled(2)
  config = _config(mtbi_years=0.01, horizon_days=1.0, seeds=2)
  assert model.evaluate(config, replayed)[0] == model.simulate(config, _decoupled(2), 2048).goodput[1]
  bad = subprocess.run(command[:-3] + ["--trace_setup=Decoupled M=3"], cwd=_REPO, capture_output=True, text=True,
                       timeout=120)
  assert bad.returncode == 2 and "--trace_setup=Decoupled M=3" in bad.stderr
