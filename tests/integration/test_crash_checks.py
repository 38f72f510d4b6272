"""A learner's part on one device, checked for injected crashes: dispatched without running while the caller waits,
and failed by a crash armed at any of its inner steps (and by none armed past them) with a lost-slice error."""

import threading

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from models import lm
from runtime.cluster import devices as devices_lib
from runtime.diloco import placement
from runtime.experiments import modes
from runtime.faults import injection

STEPS = 16


class _Recording(injection.Injector):
  """An injector that records, at each check, whether the program's dispatch had returned."""

  def __init__(self):
    super().__init__(1)
    self.returned, self.seen = threading.Event(), []

  def check(self, learner, step):
    self.seen.append(self.returned.is_set())
    super().check(learner, step)


@pytest.fixture
def one_device(tiny_config):
  """The learner's round and report programs on a mesh of one device, a fresh state, a part's batches."""
  run = modes.prepare(tiny_config)
  mesh = devices_lib.slice_mesh(jax.devices()[:1])
  round_program, report_program, init = placement.programs(run.model, run.inner, run.total_steps, 0, mesh, False)
  params = jax.device_put(lm.init_params(run.model, jax.random.key(0)), lm.param_shardings(run.model, mesh, run.fsdp))
  batches = jax.device_put(np.zeros((STEPS, run.data.batch_size, run.data.seq_len + 1), np.int32),
                           NamedSharding(mesh, P(None, "data")))
  return round_program, report_program, lambda: jax.block_until_ready(init(params, 0)), jax.block_until_ready(batches)


def test_a_one_device_part_is_checked_after_its_dispatch_has_returned(one_device):
  """XLA:CPU runs a one-device program that calls the host on the dispatching thread when its inputs are ready: a
  part checked at every step trained on the controller's thread under the real clock."""
  round_program, report_program, fresh, batches = one_device
  injector = _Recording()
  with injection.ROUTER.routing(injector):
    for program in (round_program, report_program):
      jax.block_until_ready(program(fresh(), batches))  # (compiles)
      injector.returned.clear()
      injector.seen.clear()
      outputs = program(fresh(), batches)  # (its inputs ready as it is dispatched)
      injector.returned.set()
      jax.block_until_ready(outputs)
      assert injector.seen and all(injector.seen), injector.seen


@pytest.mark.parametrize("armed,fails", [(0, True), (STEPS - 1, True), (STEPS, False)])
def test_a_crash_armed_at_a_parts_step_fails_it_as_a_lost_slice_and_one_past_its_last_step_does_not(
    one_device, armed, fails):
  round_program, _, fresh, batches = one_device
  injector = injection.Injector(1)
  with injection.ROUTER.routing(injector):
    injector.arm(0, armed)
    try:
      if fails:
        with pytest.raises(jax.errors.JaxRuntimeError) as failed:
          jax.block_until_ready(round_program(fresh(), batches))
        assert injection.slice_lost(failed.value) and "SliceCrash" in injection.describe(failed.value)
      else:
        state, _ = jax.block_until_ready(round_program(fresh(), batches))
        assert int(state.step) == STEPS
    finally:
      injection.settle(injector, [jax.devices()[:1]])
