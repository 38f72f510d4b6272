"""Checkpoints of compressed runs: the learners' residuals and held Θ, the syncer's mirrors and the payloads on the
wire are saved, so a compressed run killed and resumed ends bit-identical to one never killed."""

import jax
import pytest

from configs import default
from runtime.config.run import from_config_dict
from runtime.errors import ConfigError
from test_resume import assert_resumes_bit_identical


@pytest.fixture
def compressed(tiny_config):
  """3 learners at different speeds, K=2, overlap and latency: at the checkpoint resumed from, a compressed report
  and compressed Θ updates are on their way, one learner waits for its Θ and the others train."""
  tiny_config.learners = tiny_config.num_devices = 3
  tiny_config.data.batch_size = 12
  tiny_config.total_steps = 12
  tiny_config.inner_steps, tiny_config.overlap_steps = 2, 1
  tiny_config.outer.quorum = 2
  tiny_config.clock.latency_s = 0.3
  tiny_config.clock.speeds = (1.0, 1.3, 1.6)
  tiny_config.compression.topk_fraction = 0.1
  tiny_config.checkpoint_every = 1
  return tiny_config


# Top-k (error feedback, a large residual) in the default suite; int4 (~50 s on 2 busy cores) with -m slow.
@pytest.mark.slow  # CI time (~55 s on the 2-core host); `pytest -m slow` runs it
@pytest.mark.parametrize("fmt", ["int4", "topk"])
def test_a_run_compressed_both_ways_killed_and_resumed_ends_bit_identical(compressed, tmp_path, monkeypatch, fmt):
  compressed.compression.up = compressed.compression.down = fmt
  result = assert_resumes_bit_identical(compressed, tmp_path, monkeypatch, kills=(6,))
  reports = sum(len(r["merged"]) for r in result.records if r["kind"] == "merge")
  full = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(result.params))
  assert result.extras["bytes_down"] < 0.3 * full * reports  # every Θ went down compressed


@pytest.mark.parametrize("field", ["up", "down"])
def test_compression_with_checkpoints_is_accepted_and_bad_values_still_name_the_field(field):
  config = default.get_config()
  config.checkpoint_every, config.checkpoint_seconds = 2, 30.0
  config.compression[field] = "int4"
  assert getattr(from_config_dict(config).compression, field) == "int4"
  config.compression[field] = "int2"
  with pytest.raises(ConfigError, match="one of") as err:
    from_config_dict(config)
  assert err.value.field == f"compression.{field}"
