"""Compressed Θ down: the syncer's mirror of each learner's Θ equals what the learner adopted, bytes down are the
payloads produced, a damaged update is sent again whole, and int4 both ways trains like full transfers."""

import jax
import numpy as np
import pytest

from configs import default
from runtime.experiments import modes
from runtime.config.run import from_config_dict
from runtime.errors import ConfigError
from runtime.train.harness import Experiment
from runtime.wire import downlink as downlink_lib
from runtime.wire import payload as payload_lib


def _run(config):
  run = modes.prepare(config)
  return modes.train_one(run, Experiment(run), None, "run")


def _param_bytes(result):
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(result.params))


@pytest.fixture
def sent(monkeypatch):
  """Every (learner, mirror number, payload, Θ̃ after it) the syncer's mirrors send, in order."""
  log = []
  send = downlink_lib.Mirrors.send

  def recording(self, learner, theta, base):
    payload, number = send(self, learner, theta, base)
    log.append((learner, number, payload, jax.device_get(self.get(learner, number))))
    return payload, number

  monkeypatch.setattr(downlink_lib.Mirrors, "send", recording)
  return log


@pytest.mark.parametrize("fmt", ["int4", "topk"])
def test_every_theta_a_learner_adopts_equals_the_syncers_mirror_bit_for_bit(tiny_config, sent, monkeypatch, fmt):
  tiny_config.compression.up = tiny_config.compression.down = fmt
  adopted = []
  receive = downlink_lib.Downlink.receive
  monkeypatch.setattr(downlink_lib.Downlink, "receive", lambda self, d: adopted.append(
      (d.mirror, jax.tree.map(np.copy, receive(self, d)))) or adopted[-1][1])
  result = _run(tiny_config)
  mirrors = {number: theta for _, number, _, theta in sent}
  compressed = [(number, theta) for number, theta in adopted if number != downlink_lib.NO_MIRROR]
  assert len(compressed) >= 3 * tiny_config.learners and len({n for n, _ in compressed}) == len(compressed)
  for number, theta in compressed:
    for mine, theirs in zip(jax.tree.leaves(theta), jax.tree.leaves(mirrors[number])):
      np.testing.assert_array_equal(mine, theirs)
  assert not [f for f in result.details["faults"] if f["fault"] in ("quarantine", "theta_resent")]


def test_bytes_down_are_the_payloads_sent_and_int4_is_about_an_eighth_of_fp32(tiny_config, sent):
  tiny_config.compression.down = "int4"
  result = _run(tiny_config)
  sizes = [p.nbytes for _, _, p, _ in sent]
  assert result.extras["bytes_down"] == sum(sizes)
  merges = [r for r in result.records if r["kind"] == "merge"]
  assert len(sizes) == sum(len(r["merged"]) for r in merges)  # one update per merged report, none whole
  assert 7.0 < _param_bytes(result) / np.mean(sizes) < 8.0  # 4 bits a value and one fp32 scale per 256


def test_a_damaged_theta_update_is_never_adopted_and_theta_goes_again_whole(tiny_config, sent, monkeypatch):
  tiny_config.compression.down = "int8"
  send = downlink_lib.Mirrors.send
  damaged = []

  def damaging(self, learner, theta, base):
    payload, number = send(self, learner, theta, base)
    if len(sent) == 5:
      damaged.append(learner)
      payload = payload_lib.corrupted(payload, "flip")
    return payload, number

  monkeypatch.setattr(downlink_lib.Mirrors, "send", damaging)
  result = _run(tiny_config)
  resent, = [f for f in result.details["faults"] if f["fault"] == "theta_resent"]
  assert resent["learner"] == damaged[0] and "checksum" in resent["detail"]
  assert result.extras["bytes_down"] == sum(p.nbytes for _, _, p, _ in sent) + _param_bytes(result)
  merges = [r for r in result.records if r["kind"] == "merge"]
  assert any(damaged[0] in r["merged"] and r["time"] > resent["time"] for r in merges)  # it trains on
  assert result.tokens == modes.prepare(tiny_config).token_budget
  assert not [f for f in result.details["faults"] if f["fault"] == "quarantine"]


@pytest.mark.slow  # CI time; the mirror and damaged-update tests stay in the default suite
def test_int4_up_and_down_trains_about_as_well_as_full_transfers(tiny_config):
  tiny_config.total_steps = 32
  losses = {}
  for fmt in ("none", "int4"):
    tiny_config.compression.up = tiny_config.compression.down = fmt
    result = _run(tiny_config)
    evals = [r["eval_loss"] for r in result.records if r["kind"] == "eval"]
    assert evals[-1] < evals[0] - 0.5, (fmt, evals)
    losses[fmt] = result.final_eval_loss
  assert losses["int4"] == pytest.approx(losses["none"], rel=0.01)


@pytest.mark.parametrize("fields,allowed", [
    (dict(), "one of"), (dict(mode="dp"), "modes decoupled")])
def test_invalid_or_unsupported_down_compression_names_the_field(fields, allowed):
  config = default.get_config()
  config.compression.down = "int2" if not fields else "int4"
  config.update(fields)
  with pytest.raises(ConfigError, match=allowed) as err:
    from_config_dict(config)
  assert err.value.field == "compression.down"
