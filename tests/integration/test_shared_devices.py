"""Slices that share devices (`share_devices`): M learners on fewer devices than slices, as on one accelerator,
train to the same bits as on separate devices under the virtual clock and spend the budget under the real one;
without the flag the run is refused naming the field."""

import types

import jax
import numpy as np
import pytest

from runtime.cluster import devices as devices_lib
from runtime.errors import ConfigError
from runtime.experiments import modes


def test_with_fewer_devices_than_slices_each_slice_takes_one_device_round_robin():
  two = [types.SimpleNamespace(id=i) for i in range(2)]
  assert [[d.id for d in s] for s in devices_lib.make_slices(two, 4, share=True)] == [[0], [1], [0], [1]]
  assert [[d.id for d in s] for s in devices_lib.make_slices(two, 2, share=True)] == [[0], [1]]  # enough: unshared
  with pytest.raises(ConfigError, match="a multiple of the 2 devices when slices share them"):
    devices_lib.make_slices(two, 3, share=True)
  with pytest.raises(ConfigError, match="a divisor of the 2 devices"):
    devices_lib.make_slices(two, 4)


def _two_learners(config, devices: int):
  config.learners, config.num_devices, config.share_devices = 2, devices, devices < 2
  config.outer.quorum = 1
  config.clock.speeds = (1.0, 1.4)  # staggered: merges of one report, learners at different versions
  return config


def test_two_learners_on_one_device_train_to_the_same_bits_as_on_two(make_tiny_config, tmp_path):
  one = modes.train(_two_learners(make_tiny_config(), 1), tmp_path / "one")[0]
  two = modes.train(_two_learners(make_tiny_config(), 2), tmp_path / "two")[0]
  records = lambda result: [{k: v for k, v in r.items() if k != "wall_time"} for r in result.records]
  assert records(one) == records(two)
  for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(two.params), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  merges = [r for r in one.records if r["kind"] == "merge"]
  assert {m for r in merges for m in r["merged"]} == {0, 1}
  assert one.final_eval_loss < merges[0]["loss"]


def test_learners_sharing_a_device_under_the_real_clock_spend_the_budget_and_learn(tiny_config):
  config = _two_learners(tiny_config, 1)
  config.clock.kind, config.clock.speeds = "real", ()
  run = modes.prepare(config)
  result = modes.train(config, None)[0]
  merges = [r for r in result.records if r["kind"] == "merge"]
  assert result.tokens == run.token_budget
  assert {m for r in merges for m in r["merged"]} == {0, 1}
  assert result.final_eval_loss < min(merges[0]["loss"], np.log(256))


def test_more_learners_than_devices_without_sharing_is_refused_naming_the_field(tiny_config):
  tiny_config.learners, tiny_config.num_devices = 4, 2
  with pytest.raises(ConfigError, match="share_devices=True"):
    modes.prepare(tiny_config)
  tiny_config.learners, tiny_config.num_devices, tiny_config.share_devices = 4, 3, True
  with pytest.raises(ConfigError, match="'num_devices' = 3 is invalid: allowed a divisor of the number of slices"):
    modes.prepare(tiny_config)
  tiny_config.num_devices, tiny_config.mode = 2, "dp_elastic"
  with pytest.raises(ConfigError, match="'share_devices' = True is invalid: allowed False in mode 'dp_elastic'"):
    modes.prepare(tiny_config)
