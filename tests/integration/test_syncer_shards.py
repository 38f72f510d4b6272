"""A run whose syncer is split across host CPU devices (`syncer.shards`) trains to the same bits as one syncer, under
faults of the wire and across a kill and resume; bad shard counts are refused naming the field."""

import jax
import numpy as np
import pytest

from runtime.errors import ConfigError, UsageError
from runtime.experiments import modes
from test_resume import assert_resumes_bit_identical


def _staggered(config):
  """3 learners at different speeds merging one at a time (K = 1), Θ compressed both ways: staggered versions,
  mirrors, and compressed reports rebuilt from them."""
  config.learners, config.num_devices, config.data.batch_size = 3, 3, 12
  config.total_steps, config.inner_steps = 12, 2
  config.outer.quorum = 1
  config.clock.speeds = (1.0, 1.3, 1.6)
  config.compression.up = config.compression.down = "int4"
  return config


@pytest.mark.parametrize("rule", ["nesterov", "delayed_nesterov",
                                  pytest.param("momentum_per_round", marks=pytest.mark.slow)])
def test_a_syncer_in_four_shards_trains_to_the_same_bits_as_one(make_tiny_config, tmp_path, rule):
  runs = {}
  for shards in (1, 4):
    config = _staggered(make_tiny_config())
    config.syncer.shards, config.outer.rule = shards, rule
    runs[shards] = modes.train(config, tmp_path / rule / str(shards))[0]
  one, four = runs[1], runs[4]
  records = lambda result: [{k: v for k, v in r.items() if k != "wall_time"} for r in result.records]
  assert records(one) == records(four)
  for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(four.params), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  merges = [r for r in four.records if r["kind"] == "merge"]
  assert len(merges) >= 6 and all(len(r["merged"]) == 1 for r in merges)  # K = 1, learners at staggered versions
  full = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(four.params))
  assert four.extras["bytes_down"] < 0.3 * full * len(merges)  # Θ went down compressed


@pytest.mark.slow  # CI time (~20 s on the 2-core host); `pytest -m slow` runs it
def test_a_sharded_syncer_killed_and_resumed_ends_bit_identical(tiny_config, tmp_path, monkeypatch):
  config = _staggered(tiny_config)
  config.syncer.shards, config.checkpoint_every = 2, 1
  config.inner_steps, config.overlap_steps, config.clock.latency_s = 2, 1, 0.3
  assert_resumes_bit_identical(config, tmp_path, monkeypatch, kills=(5,))


def test_resuming_with_another_number_of_syncer_shards_is_refused_naming_the_field(tiny_config, tmp_path):
  tiny_config.syncer.shards, tiny_config.total_steps, tiny_config.checkpoint_every = 2, 8, 1
  modes.train(tiny_config, tmp_path)
  tiny_config.syncer.shards = 1
  with pytest.raises(UsageError, match="syncer.shards: 2 there, 1 now"):
    modes.train(tiny_config, tmp_path)


@pytest.mark.parametrize("mode,shards,allowed", [("decoupled", 0, "an integer >= 1"), ("dp", 2, "1 in mode dp"),
                                                 ("decoupled", 64, r"at most the \d+ host CPU devices")])
def test_a_bad_number_of_syncer_shards_is_one_line_naming_the_field(tiny_config, mode, shards, allowed):
  tiny_config.mode, tiny_config.syncer.shards = mode, shards
  with pytest.raises(ConfigError, match=f"syncer.shards.*{allowed}"):
    modes.train(tiny_config, None)
