"""Real device sets: slices by `slice_index` (pathwaysutils), health-checked after repair; the core install without."""

import types

import jax
import pytest

from runtime.cluster import devices as devices_lib
from runtime.experiments import modes
from runtime.cluster import multislice
from runtime.diloco.controller import Controller
from runtime.diloco.learner.learner import Learner
from runtime.errors import ConfigError
from runtime.train.harness import Experiment

SHUFFLED = (2, 0, 3, 1, 1, 3, 0, 2)  # slice_index of devices 0..7, as a multislice platform may number them


def _fake_devices(indices):
  """Devices that carry slice_index, as pathwaysutils' own fault-injection tests fake them on CPU."""
  return [types.SimpleNamespace(id=i, slice_index=s) for i, s in enumerate(indices)]


def test_devices_with_shuffled_slice_index_are_grouped_by_it_in_index_order():
  pytest.importorskip("pathwaysutils")
  slices = devices_lib.make_slices(_fake_devices(SHUFFLED), 4)
  assert [[d.id for d in s] for s in slices] == [[1, 6], [3, 4], [0, 7], [2, 5]]
  assert all({d.slice_index for d in s} == {i} for i, s in enumerate(slices))
  with pytest.raises(ConfigError, match="the 4 hardware slices present"):
    devices_lib.make_slices(_fake_devices(SHUFFLED), 2)


def test_without_pathwaysutils_slices_are_consecutive_and_only_a_multislice_device_set_is_refused(monkeypatch):
  monkeypatch.setattr(multislice, "_elastic", lambda: None)
  plain = [types.SimpleNamespace(id=i) for i in range(8)]
  assert [[d.id for d in s] for s in devices_lib.make_slices(plain, 4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
  one_slice = _fake_devices([0] * 8)  # a single accelerator slice: cut like any device set
  assert [[d.id for d in s] for s in devices_lib.make_slices(one_slice, 2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
  with pytest.raises(RuntimeError, match=r"4 slice_index values .* needs the `pathways` extra"):
    devices_lib.make_slices(_fake_devices(SHUFFLED), 4)
  assert multislice.healthy(0, jax.devices()[:1])
  assert not multislice.slice_lost(jax.errors.JaxRuntimeError("DATA_LOSS: slice 3 lost"))


def test_each_learner_trains_on_the_devices_of_its_slice_index(tiny_config, monkeypatch):
  pytest.importorskip("pathwaysutils")
  tiny_config.num_devices = 8
  monkeypatch.setattr(type(jax.devices()[0]), "slice_index", property(lambda d: SHUFFLED[d.id]), raising=False)
  run = modes.prepare(tiny_config)
  controller = Controller(run, Experiment(run), None, "run")
  for m, learner in enumerate(controller.learners):
    assert [d.id for d in learner.mesh.devices.flat] == [i for i, s in enumerate(SHUFFLED) if s == m]


def test_a_repaired_slice_that_fails_its_health_check_is_repaired_again_before_a_learner_gets_it(tiny_config,
                                                                                                monkeypatch):
  elastic = pytest.importorskip("pathwaysutils.elastic.elastic")
  assert multislice.healthy(1, jax.devices()[1:2])  # pathwaysutils' own check, on a healthy CPU device
  tiny_config.faults.repair_seconds = 2.0
  run = modes.prepare(tiny_config)
  controller = Controller(run, Experiment(run), None, "run")
  real_dispatch, real_check, checked, dispatched = Learner.dispatch, elastic.get_active_slice_indices, [], []

  def dispatch(learner, *args, **kwargs):
    dispatched.append(learner.index)
    if dispatched.count(1) == 2 and learner.index == 1:  # its slice is lost as its second round is dispatched
      raise jax.errors.JaxRuntimeError("DATA_LOSS: slice 1 unreachable")
    return real_dispatch(learner, *args, **kwargs)

  def check(slice_to_devices, *args):
    checked.append((controller.clock.now(), sorted(slice_to_devices)))
    return frozenset() if len(checked) == 1 else real_check(slice_to_devices, *args)  # down at the first check

  monkeypatch.setattr(Learner, "dispatch", dispatch)
  monkeypatch.setattr(elastic, "get_active_slice_indices", check)
  result = controller.train()
  crash, = [f for f in result.details["faults"] if f["fault"] == "crash"]
  rejoin, = [f for f in result.details["faults"] if f["fault"] == "rejoin"]
  assert crash["learner"] == 1 and "DATA_LOSS" in crash["detail"]
  assert checked == [(pytest.approx(6.0, abs=1e-3), [1]), (pytest.approx(8.0, abs=1e-3), [1])]
  assert rejoin["learner"] == 1 and rejoin["time"] == pytest.approx(8.0, abs=1e-3)
  assert result.tokens == run.token_budget


def test_the_pathways_backend_is_validated_and_initializes_pathwaysutils_only_when_asked(tiny_config, monkeypatch):
  pathwaysutils = pytest.importorskip("pathwaysutils")
  calls = []
  monkeypatch.setattr(pathwaysutils, "initialize", lambda: calls.append("initialize"))
  modes.prepare(tiny_config)
  tiny_config.backend = "pathways"
  modes.prepare(tiny_config)
  assert calls == ["initialize"]
  tiny_config.backend = "tpu"
  allowed = "allowed one of \\('local', 'pathways', 'ray'\\)"
  with pytest.raises(ConfigError, match=f"'backend' = 'tpu' is invalid: {allowed}"):
    modes.prepare(tiny_config)
  tiny_config.backend = "pathways"
  monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
  with pytest.raises(ConfigError, match="'local' unless pathwaysutils is installed"):
    modes.prepare(tiny_config)
