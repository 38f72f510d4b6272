"""Compressed outer gradients: codec error bounds, error feedback, payload integrity and byte accounting, and
decoupled runs whose compressed reports train like full ones and survive corruption."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from configs import default
from runtime.experiments import modes
from runtime.config.run import from_config_dict
from runtime.errors import ConfigError
from runtime.train.harness import Experiment
from runtime.wire import codecs
from runtime.wire import payload as payload_lib
from runtime.wire.config import CompressionConfig
from runtime.wire.uplink import Uplink

PROPERTY = settings(max_examples=30, deadline=None)
_VALUES = st.floats(-1e4, 1e4, allow_nan=False, allow_subnormal=False, width=32)
# Few lengths (each compiles its programs once): one value, and partial blocks of every block size used.
_VECTORS = hnp.arrays(np.float32, st.sampled_from([1, 300]), elements=_VALUES)


def _codec(x, **cfg):
  return _programs(x.size, **cfg)[0]


@functools.cache
def _programs(n, **cfg):
  """The codec of an n-vector, its quantizing program and the learner's decoding program."""
  codec = codecs.Codec(CompressionConfig(**cfg), {"x": jax.ShapeDtypeStruct((n,), jnp.float32)})
  return codec, jax.jit(codec.encode), jax.jit(lambda p: codec.decode(p, jnp))


def _round_trip(x, **cfg):
  """(host decode of the payload, the payload, the learner's own decode of the same parts)."""
  codec, encode, decode = _programs(x.size, **cfg)
  parts = encode({"x": jnp.asarray(x)})
  payload = payload_lib.pack(jax.device_get(parts))
  return codec.open(payload)["x"], payload, np.asarray(decode(parts)["x"])


@PROPERTY
@given(_VECTORS, st.sampled_from(["int8", "int4"]), st.sampled_from([7, 256]))
def test_int_formats_err_by_at_most_half_a_block_scale_per_element(x, fmt, block):
  decoded, _, on_learner = _round_trip(x, up=fmt, block_size=block)
  blocks = np.pad(np.abs(x), (0, -x.size % block)).reshape(-1, block)
  levels = {"int8": 127, "int4": 7}[fmt]
  scale = np.repeat(blocks.max(axis=1) / levels, block)[:x.size]
  flushed = levels * np.finfo(np.float32).tiny  # XLA:CPU flushes a subnormal scale (a block this small) to zero
  assert np.all(np.abs(decoded - x) <= scale / 2 * (1 + 1e-5) + flushed)
  np.testing.assert_array_equal(decoded, on_learner)  # the syncer decodes what the learner's feedback assumed


@PROPERTY
@given(_VECTORS)
def test_bf16_errs_by_at_most_two_to_the_minus_8_relative(x):
  decoded, _, on_learner = _round_trip(x, up="bf16")
  assert np.all(np.abs(decoded - x) <= np.abs(x) * 2.0**-8)
  np.testing.assert_array_equal(decoded, on_learner)


@PROPERTY
@given(_VECTORS, st.sampled_from([0.001, 0.03, 0.5, 1.0]), st.sampled_from(["fp32", "bf16", "int8", "int4"]))
def test_topk_sends_exactly_ceil_k_n_of_the_largest_values(x, fraction, values):
  decoded, payload, _ = _round_trip(x, up="topk", topk_fraction=fraction, topk_values=values, block_size=16)
  k = math.ceil(fraction * x.size)
  codec = _codec(x, up="topk", topk_fraction=fraction, topk_values=values, block_size=16)
  index = payload_lib.unpack(payload, codec.specs)[0]
  assert index.size == k == len(set(index.tolist()))
  assert np.all(np.abs(x[index]).min() >= np.delete(np.abs(x), index, 0).max(initial=0))
  assert np.all(decoded[np.setdiff1d(np.arange(x.size), index)] == 0)
  if values == "fp32":
    np.testing.assert_array_equal(decoded[index], x[index])


@pytest.mark.parametrize("up,extra", [("int4", {}), ("int8", {}), ("bf16", {}),
                                      ("topk", dict(topk_values="fp32")), ("topk", dict(topk_values="int4"))])
def test_error_feedback_conserves_what_was_sent_plus_the_residual(up, extra):
  rng = np.random.default_rng(0)
  theta = {"w": jnp.asarray(rng.normal(size=(40, 9)), jnp.float32), "b": jnp.asarray(rng.normal(size=5), jnp.float32)}
  uplink = Uplink(CompressionConfig(up=up, block_size=32, topk_fraction=0.1, **extra))
  uplink.start(theta)
  previous = jax.tree.map(np.zeros_like, theta)
  for step in range(3):
    params = jax.tree.map(lambda t: t - 0.1 * (step + 1) * jnp.asarray(rng.normal(size=t.shape), jnp.float32), theta)
    sent = uplink.codec.open(uplink.encode(params))
    original = jax.tree.map(lambda t, p, r: np.asarray(t) - np.asarray(p) + r, theta, params, previous)
    residual = jax.tree.map(np.asarray, uplink.residual)
    total = jax.tree.map(np.add, sent, residual)
    exact = up == "topk" and extra["topk_values"] == "fp32"  # the residual is Δ where nothing was sent, else 0
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0 if exact else 1e-6,
                                                         atol=0 if exact else 1e-6), total, original)
    assert any(np.abs(r).max() > 0 for r in jax.tree.leaves(residual))
    previous = residual
  uplink.start(theta)  # a restart from Θ drops the residual explicitly
  assert all(np.abs(np.asarray(r)).max() == 0 for r in jax.tree.leaves(uplink.residual))


@PROPERTY
@given(_VECTORS, st.sampled_from(["bf16", "int8", "int4", "topk"]), st.data())
def test_any_damaged_byte_or_length_is_detected(x, up, data):
  _, payload, _ = _round_trip(x, up=up, block_size=32, topk_fraction=0.2)
  specs = _codec(x, up=up, block_size=32, topk_fraction=0.2).specs
  at = data.draw(st.integers(0, payload.nbytes - 1))
  blob = bytearray(payload.blob)
  blob[at] ^= data.draw(st.integers(1, 255))
  cut = data.draw(st.integers(1, payload.nbytes))
  for damaged in (bytes(blob), payload.blob[:-cut], payload.blob + b"\0"):
    with pytest.raises(payload_lib.CorruptPayload):
      payload_lib.unpack(payload_lib.Payload(damaged), specs)


@pytest.mark.parametrize("up,per_tensor", [
    ("bf16", lambda n: 2 * n), ("int8", lambda n: n + 4 * -(-n // 256)),
    ("int4", lambda n: (n + 1) // 2 + 4 * -(-n // 256)), ("topk", lambda n: 2 * 2 * math.ceil(0.01 * n))])
def test_payload_bytes_are_the_header_plus_each_tensors_parts(up, per_tensor):
  tree = {"a": jnp.ones((129, 7)), "b": jnp.ones(3), "c": jnp.ones((64, 64))}
  codec = codecs.Codec(CompressionConfig(up=up), tree)
  payload = payload_lib.pack(jax.device_get(jax.jit(codec.encode)(tree)))
  assert payload.nbytes == len(payload.blob) == 4 + 4 * len(codec.specs) + sum(per_tensor(x.size) for x in
                                                                               jax.tree.leaves(tree))


@pytest.mark.parametrize("path,value,names", [
    ("compression.up", "int2", "compression.up"), ("compression.block_size", 0, "compression.block_size"),
    ("compression.topk_fraction", 0.0, "compression.topk_fraction"),
    ("compression.topk_values", "int2", "compression.topk_values")])
def test_invalid_compression_fields_name_the_field_and_what_is_allowed(path, value, names):
  config = default.get_config()
  config.compression[path.split(".")[1]] = value
  with pytest.raises(ConfigError) as err:
    from_config_dict(config)
  assert err.value.field == names and "allowed" in str(err.value)


def test_compression_is_refused_outside_diloco():
  config = default.get_config()
  config.compression.up, config.mode = "int4", "dp"
  with pytest.raises(ConfigError, match="modes decoupled") as err:
    from_config_dict(config)
  assert err.value.field == "compression.up"


def test_payload_faults_need_a_compressed_payload():
  config = default.get_config()
  config.faults.schedule = "corrupt:learner=0,time=5,how=flip"
  with pytest.raises(ConfigError, match="flip|truncate") as err:
    from_config_dict(config)
  assert err.value.field == "faults.schedule"


def _run(config):
  run = modes.prepare(config)
  return modes.train_one(run, Experiment(run), None, "run")


def test_a_damaged_compressed_report_is_quarantined_and_the_run_finishes(tiny_config, sent_payloads):
  tiny_config.clock.speeds = (1.0, 1.1, 1.2, 1.3)  # one report per merge, so the quarantine is isolated
  tiny_config.compression.up = "topk"
  tiny_config.compression.topk_fraction = 0.1
  tiny_config.faults.schedule = "corrupt:learner=0,time=5,how=flip"
  result = _run(tiny_config)
  quarantine, = [f for f in result.details["faults"] if f["fault"] == "quarantine"]
  assert quarantine["learner"] == 0 and "corrupt payload" in quarantine["detail"]
  merges = [r for r in result.records if r["kind"] == "merge"]
  assert any(0 in r["merged"] and r["time"] > quarantine["time"] for r in merges)  # it trains on after a reset
  assert result.tokens == modes.prepare(tiny_config).token_budget
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(result.params))
  assert result.extras["bytes_up"] == sum(p.nbytes for p in sent_payloads)  # exactly the payloads produced
  assert merges[-1]["bytes_up"] == result.extras["bytes_up"]
  assert result.extras["bytes_per_report"] < 0.2 * 4 * sum(x.size for x in jax.tree.leaves(result.params))


@pytest.mark.slow
def test_int4_and_topk_reports_train_about_as_well_as_full_ones(tiny_config):
  tiny_config.total_steps = 32
  losses, sizes = {}, {}
  for up in ("none", "int4", "topk"):
    tiny_config.compression.up = up
    tiny_config.compression.topk_fraction = 0.1
    result = _run(tiny_config)
    evals = [r["eval_loss"] for r in result.records if r["kind"] == "eval"]
    assert evals[-1] < evals[0] - 0.5, (up, evals)
    losses[up], sizes[up] = result.final_eval_loss, result.extras["bytes_per_report"]
  assert losses["int4"] == pytest.approx(losses["none"], rel=0.01)
  assert losses["topk"] == pytest.approx(losses["none"], rel=0.08)
  assert sizes["none"] > 7 * sizes["int4"] and sizes["none"] > 9 * sizes["topk"]  # top-k: 10% as bf16 + uint16
