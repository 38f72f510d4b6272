"""The Llama model on a (data, tensor) mesh inside each slice: the same training as one axis, under both clocks,
with a crash recovered and a killed run resumed bit-identical."""

import math

import jax
import numpy as np
import pytest

from invariants import assert_ranges_tile
from test_feature_matrix import _assert_recorded, _base
from test_resume import assert_resumes_bit_identical
from models import lm
from runtime.errors import ConfigError
from runtime.experiments import modes


def _llama(config, tensor: int, mode: str = "decoupled"):
  config.model.kind = "llama"  # the tiny preset's 4 query heads share 2 key/value heads
  config.mode = mode
  config.num_devices, config.learners = 8, 2  # a slice of 4 devices per learner: 2 x 2 with tensor = 2
  config.mesh.tensor = tensor
  return config


def _several_slices(config):
  config.slices_per_learner = 2  # two slices of 2 devices per learner: ('slice', 'data', 'tensor') = 2 x 1 x 2
  return config


@pytest.mark.parametrize("mode, layout", [("decoupled", _llama), ("dp", _llama),
                                          ("decoupled", lambda c, t, m: _several_slices(_llama(c, t, m)))])
def test_llama_on_a_2x2_mesh_trains_as_on_4x1_to_float_tolerance(make_tiny_config, mode, layout):
  one_axis, two_axes = (modes.train(layout(make_tiny_config(), t, mode), None)[0] for t in (1, 2))
  losses = [[r["eval_loss"] for r in result.records if "eval_loss" in r] for result in (one_axis, two_axes)]
  np.testing.assert_allclose(losses[0], losses[1], rtol=2e-5)
  assert losses[0][-1] < losses[0][0]
  for a, b in zip(jax.tree.leaves(one_axis.params), jax.tree.leaves(two_axes.params), strict=True):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def test_a_learners_parameters_are_split_across_tensor_by_their_logical_axes(make_tiny_config):
  run = modes.prepare(_llama(make_tiny_config(), 2))
  specs = lm.param_specs(run.model, {"data": 2, "tensor": 2}, fsdp=False)
  block = specs["block_0"]
  assert tuple(block["attn"]["query"]["kernel"]) == (None, "tensor", None)  # heads
  assert tuple(block["attn"]["key"]["kernel"]) == (None, "tensor", None)  # key/value heads
  assert tuple(block["attn"]["out"]["kernel"]) == ("tensor", None, None)
  assert tuple(block["gate"]["kernel"]) == (None, "tensor") and tuple(block["down"]["kernel"]) == ("tensor", None)
  assert tuple(specs["embed"]["embedding"]) == ("tensor", None)  # vocabulary
  assert tuple(block["attn_norm"]["scale"]) == ()  # replicated


@pytest.mark.parametrize("clock", ["virtual", "real"])
def test_llama_on_2x2_meshes_recovers_a_crash_under_either_clock_losing_no_token(tiny_config, clock):
  config = _llama(_base(tiny_config, clock), 2)
  config.num_devices, config.slices = 8, 2
  config.faults.schedule = "crash:learner=1,time=0.5"
  run = modes.prepare(config)
  result = modes.train(config, None)[0]
  assert result.tokens == run.token_budget
  assert_ranges_tile(result, learners=range(run.learners))
  assert "crash" in {f["fault"] for f in result.details["faults"]}
  _assert_recorded(run, result, clock)
  assert math.isfinite(result.final_eval_loss)


def test_llama_on_2x2_meshes_killed_twice_resumes_bit_identical(tiny_config, tmp_path, monkeypatch):
  config = _llama(tiny_config, 2)
  config.checkpoint_every = 1
  config.faults.schedule = "crash:learner=1,time=6,repair=3"
  assert_resumes_bit_identical(config, tmp_path, monkeypatch, kills=(2, 3))


def test_a_tensor_width_that_does_not_divide_a_slice_is_refused_naming_the_field(tiny_config):
  config = _llama(tiny_config, 3)
  with pytest.raises(ConfigError, match=r"mesh.tensor.*a divisor of the devices per slice \(4\)"):
    modes.prepare(config)
