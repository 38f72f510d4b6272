"""Learners of several slices: a two-level mesh, and a lost slice survived by reconfiguring or restarting."""

import jax
import numpy as np
import pytest

from invariants import assert_data_accounted
from models import lm
from runtime.cluster import devices as devices_lib
from runtime.experiments import modes
from runtime.train import tree_transfer
from runtime.config.run import from_config_dict
from runtime.diloco.controller import Controller
from runtime.errors import ConfigError
from runtime.train.harness import Experiment
from runtime.config import faults as plan
from runtime.sim import config as sim_config
from test_resume import assert_resumes_bit_identical

BUDGET = 24 * 8 * 32  # total_steps × batch × seq_len


@pytest.fixture
def two_slice_learners(tiny_config):
  """Two learners of two one-device slices each; slice 1 of learner 1 (slice 3) fails at t=5 and is back at t=11."""
  tiny_config.learners, tiny_config.slices_per_learner = 2, 2
  tiny_config.num_devices = 4
  tiny_config.data.batch_size = 8
  tiny_config.data.assignment = "service"
  tiny_config.total_steps = 24
  tiny_config.inner_steps, tiny_config.overlap_steps = 2, 1
  tiny_config.clock.latency_s = 0.2
  tiny_config.faults.schedule = "crash:learner=1,time=5,slice=1,repair=6"
  tiny_config.faults.reconfig_seconds = 1.0
  return tiny_config


def _faults(result, learner=1):
  return [(f["fault"], f["time"], f["detail"]) for f in result.details["faults"] if f["learner"] == learner]


def _trains_from(result, at, learner=1):
  """True if the learner started training at time `at`."""
  return any(name == f"learner {learner}" and start == pytest.approx(at) and state == "training"
             for name, start, _, state in result.details["intervals"])


def _assert_trained_everything(result):
  assert result.tokens == BUDGET
  assert_data_accounted(result, seq_len=32)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(result.params))
  evals = [r["eval_loss"] for r in result.records if r["kind"] == "eval"]
  assert evals[-1] < evals[0], evals


def test_a_learner_of_two_slices_trains_on_a_two_level_mesh_over_both(two_slice_learners):
  run = modes.prepare(two_slice_learners)
  learner = Controller(run, Experiment(run), None, "run").learners[1]
  assert learner.slices == (2, 3) and dict(learner.mesh.shape) == {"slice": 2, "data": 1}
  assert learner.batch_sharding.spec == jax.sharding.PartitionSpec(None, ("slice", "data"))
  assert {d.id for d in learner.mesh.devices.flat} == {2, 3}


def test_parameters_reach_a_one_device_slice_that_shards_them_fsdp(two_slice_learners):
  """A learner of two one-device slices with fsdp=True trains on one of them after a shrink: Θ must reach it."""
  run = modes.prepare(two_slice_learners)
  sharding = lm.param_shardings(run.model, devices_lib.learner_mesh([jax.devices()[1:2]]), fsdp=True)
  theta = jax.device_put(lm.init_params(run.model, jax.random.key(0)), devices_lib.host_device())
  copied = tree_transfer.copy_to(theta, sharding)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(copied), jax.device_get(theta))


def test_losing_one_slice_it_trains_on_with_the_other_and_grows_back_when_the_slice_is_repaired(two_slice_learners):
  result = modes.train(two_slice_learners, None)[0]
  faults = _faults(result)
  kinds = [kind for kind, _, _ in faults]
  assert "crash" not in kinds and "rejoin" not in kinds, faults  # never down: it kept its state
  (_, shrunk_at, detail), = [f for f in faults if f[0] == "shrink"]
  assert shrunk_at == pytest.approx(5.0) and "on slices [2] of 2" in detail
  (_, expanded_at, detail), = [f for f in faults if f[0] == "expand"]
  assert expanded_at >= 11.0 and "onto slices [2, 3]" in detail  # the repaired slice, back at t=11
  reconfiguring = [(a, b) for who, a, b, state in result.details["intervals"]
                   if who == "learner 1" and state == "reconfiguring"]
  assert [b - a for a, b in reconfiguring] == pytest.approx([1.0, 1.0])  # faults.reconfig_seconds, each way
  # On one slice its steps take twice as long (the same batch on half the devices): fewer steps than learner 0.
  steps = [sum(n for _, n in c) for c in result.details["completions"]]
  assert steps[1] < steps[0]
  assert any(1 in r["merged"] for r in result.records if r["kind"] == "merge" and r["time"] > expanded_at)
  _assert_trained_everything(result)


@pytest.mark.parametrize("clock", [pytest.param("virtual", marks=pytest.mark.slow), "real"])  # (the defect: real)
def test_a_crash_scheduled_at_an_inner_step_on_one_slice_takes_only_that_slice(two_slice_learners, clock):
  """`step=` with `slice=`: the crash armed in the learner's program fails its slice 1 only, as a timed one does
  (under the real clock its repair may outlast the run)."""
  two_slice_learners.faults.schedule = "crash:learner=1,step=6,slice=1,repair=6"
  two_slice_learners.clock.kind = clock
  result = modes.train(two_slice_learners, None)[0]
  faults = _faults(result)
  assert [kind for kind, _, _ in faults][:1] == ["shrink"] and "crash" not in [f[0] for f in faults], faults
  assert "on slices [2] of 2" in faults[0][2] and "inner step 6" in faults[0][2], faults
  _assert_trained_everything(result)


@pytest.mark.slow  # CI time (~21 s on the 2-core host); `pytest -m slow` runs it
def test_a_compressed_learner_takes_its_theta_and_residual_along_when_it_shrinks_and_grows(two_slice_learners):
  """Regression: the uplink's Θ and error-feedback residual stayed on the old slice set (a JAX device error)."""
  two_slice_learners.compression.up, two_slice_learners.compression.down = "topk", "int4"
  result = modes.train(two_slice_learners, None)[0]
  kinds = [kind for kind, _, _ in _faults(result)]
  assert "shrink" in kinds and "expand" in kinds and "crash" not in kinds, kinds
  _assert_trained_everything(result)


@pytest.mark.slow  # CI time: the shrink/grow and restart tests stay in the default suite
def test_reconfiguring_keeps_the_work_trained_before_the_part_in_flight(two_slice_learners):
  """The shrink loses only the part in flight; the restart loses everything not yet merged."""
  goodput = {}
  for recovery in ("reconfigure", "restart"):
    two_slice_learners.faults.learner_recovery = recovery
    goodput[recovery] = modes.train(two_slice_learners, None)[0].extras["goodput"]
  assert goodput["reconfigure"] > goodput["restart"]


def test_restart_sends_the_learner_down_and_it_rejoins_from_theta_on_a_full_set(two_slice_learners):
  two_slice_learners.faults.learner_recovery = "restart"
  result = modes.train(two_slice_learners, None)[0]
  faults = _faults(result)
  assert [kind for kind, _, _ in faults] == ["crash", "rejoin"], faults
  (_, crashed_at, _), (_, rejoined_at, detail) = faults
  assert crashed_at == pytest.approx(5.0) and rejoined_at >= 11.0 and detail == "on slices [2, 3]"
  _assert_trained_everything(result)


@pytest.mark.slow  # CI time: the shrink/grow and restart tests stay in the default suite
def test_a_spare_slice_takes_the_failed_ones_place(two_slice_learners):
  two_slice_learners.num_devices = two_slice_learners.slices = 5  # slice 4 is spare
  two_slice_learners.faults.spare_swap_seconds = 0.5
  result = modes.train(two_slice_learners, None)[0]
  (_, expanded_at, detail), = [f for f in _faults(result) if f[0] == "expand"]
  assert expanded_at < 11.0 and "[2, 4]" in detail  # the spare, before the failed slice is repaired
  _assert_trained_everything(result)


@pytest.mark.slow  # CI time: the shrink/grow and restart tests stay in the default suite
def test_a_crash_of_the_whole_learner_takes_all_its_slices_down_and_it_restarts(two_slice_learners):
  """Its state is lost with every slice it lived on: it restarts from Θ on the first slice back (reconfigure) and
  grows onto the second."""
  two_slice_learners.faults.schedule = "crash:learner=1,time=5,repair=6"
  result = modes.train(two_slice_learners, None)[0]
  (crash, crashed_at, _), (rejoin, rejoined_at, on), (expand, _, onto) = _faults(result)
  assert (crash, rejoin, expand) == ("crash", "rejoin", "expand")
  assert crashed_at == pytest.approx(5.0) and rejoined_at == pytest.approx(11.0)  # both slices were in repair
  assert on == "on slices [2]" and "onto slices [2, 3]" in onto
  assert _trains_from(result, 12.0)  # when its move onto slice 3 (begun as its Θ was pulled) ends
  _assert_trained_everything(result)


@pytest.mark.slow  # CI time; the default suite keeps the shrink and restart runs of two-slice learners
def test_a_learner_grown_while_its_theta_is_pulled_trains_when_the_move_ends(two_slice_learners):
  """Regression: the pulled Θ arrived during the move and was dropped, so the learner waited for Θ forever."""
  two_slice_learners.total_steps = 8
  two_slice_learners.faults.schedule = "crash:learner=1,time=1.5,repair=1"  # both its slices back at t=2.5
  result = modes.train(two_slice_learners, None)[0]
  assert _faults(result)[1:] == [
      ("rejoin", 2.5, "on slices [2]"), ("expand", 2.5, "onto slices [2, 3] of 2")]  # Θ is pulled until t=2.7
  assert _trains_from(result, 3.5)  # reconfig_seconds after the move began
  assert result.tokens == 8 * 8 * 32


@pytest.mark.parametrize("field, value, named, allowed", [
    ("slices_per_learner", 0, "slices_per_learner", "an integer >= 1"),
    ("slices_per_learner", 3, "slices_per_learner", "every slice needs a device"),
    ("mode", "dp", "slices_per_learner", "1 in mode 'dp'"),
    ("slices", 3, "slices", "at least learners × slices_per_learner (2 × 2)"),
    ("data.batch_size", 6, "data.batch_size", "multiple of learners × devices per learner (2 × 2)"),
    ("faults.learner_recovery", "respawn", "faults.learner_recovery", "one of ('reconfigure', 'restart')"),
    ("faults.schedule", "crash:learner=0,time=3,slice=2", "faults.schedule", "slice in [0, slices_per_learner=2)"),
    ("capacity.schedule", "lend:slices=1,time=1,duration=2", "capacity.schedule", "empty with slices_per_learner"),
])
def test_settings_a_learner_of_several_slices_cannot_run_name_the_field(two_slice_learners, field, value, named,
                                                                       allowed):
  two_slice_learners.faults.schedule = ""
  section, _, name = field.rpartition(".")
  (two_slice_learners[section] if section else two_slice_learners)[name] = value
  with pytest.raises(ConfigError) as err:
    from_config_dict(two_slice_learners)
  assert err.value.field == named and allowed in str(err.value)


def test_a_batch_that_cannot_split_over_every_slice_count_is_refused_when_reconfiguring(two_slice_learners):
  two_slice_learners.slices_per_learner, two_slice_learners.num_devices = 3, 6
  two_slice_learners.data.batch_size = 6  # 3 per learner: splits over 3 slices, not over 2
  with pytest.raises(ConfigError, match="any .1, 2, 3. of them"):
    from_config_dict(two_slice_learners)
  two_slice_learners.faults.learner_recovery = "restart"  # never fewer than 3: accepted
  assert from_config_dict(two_slice_learners).slices_per_learner == 3


def test_the_runtime_offers_the_goodput_simulators_learner_recoveries():
  assert plan.LEARNER_RECOVERIES == sim_config.LEARNER_RECOVERIES


@pytest.mark.slow
def test_a_run_killed_while_a_learner_reconfigures_resumes_bit_identical(two_slice_learners, tmp_path, monkeypatch):
  two_slice_learners.checkpoint_every = 1
  two_slice_learners.faults.schedule = "crash:learner=1,time=4,slice=1,repair=6"
  # Resumed from merge 2 (t=3.8: learner 1's part in flight will fail at t=4, so it shrinks onto the state saved from
  # before that part) and from merge 8 (a learner reconfiguring: a slice lost or given back, its move due).
  result = assert_resumes_bit_identical(two_slice_learners, tmp_path, monkeypatch, kills=(3, 9))
  assert_data_accounted(result, seq_len=32)
