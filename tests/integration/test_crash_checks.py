"""A learner's part on one device, checked for injected crashes: dispatched without running while the caller waits,
and failed by a crash armed at any of its inner steps (and by none armed past them) with a lost-slice error."""

import threading

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from models import lm
from runtime.cluster import devices as devices_lib
from runtime.diloco.learner import placement
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
  """The learner's round program on a mesh of one device (its report program is wrapped the same way), a fresh
  state, a part's batches."""
  run = modes.prepare(tiny_config)
  mesh = devices_lib.slice_mesh(jax.devices()[:1])
  round_program, _, init = placement.programs(run.model, run.inner, run.total_steps, 0, mesh, False)
  params = jax.device_put(lm.init_params(run.model, jax.random.key(0)), lm.param_shardings(run.model, mesh, run.fsdp))
  batches = jax.device_put(np.zeros((STEPS, run.data.batch_size, run.data.seq_len + 1), np.int32),
                           NamedSharding(mesh, P(None, "data")))
  return round_program, lambda: jax.block_until_ready(init(params, 0)), jax.block_until_ready(batches)


def test_a_one_device_part_is_checked_after_its_dispatch_has_returned(one_device):
  """XLA:CPU runs a one-device program that calls the host on the dispatching thread when its inputs are ready: a
  part checked at every step trained on the controller's thread under the real clock."""
  round_program, fresh, batches = one_device
  injector = _Recording()
  with injection.ROUTER.routing(injector):
    jax.block_until_ready(round_program(fresh(), batches))  # (compiles)
    injector.seen.clear()
    outputs = round_program(fresh(), batches)  # (its inputs ready as it is dispatched)
    injector.returned.set()
    jax.block_until_ready(outputs)
    assert injector.seen and all(injector.seen), injector.seen


@pytest.mark.parametrize("armed,fails", [(0, True), (STEPS - 1, True), (STEPS, False)])
def test_a_crash_armed_at_a_parts_step_fails_it_as_a_lost_slice_and_one_past_its_last_step_does_not(
    one_device, armed, fails):
  round_program, fresh, batches = one_device
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
      injector.settle([jax.devices()[:1]])


def test_a_crash_armed_while_a_program_runs_fails_every_device_at_the_same_step():
  """Armed at wall time while a learner's program of two devices ran, a crash at "the next step" made the device
  checking after the arming raise at a step the other had already passed: that one then waited for it in the step's
  all-reduce until XLA aborted the process. Armed after the furthest step checked, both raise at the same step."""
  injector = injection.Injector(2)
  injector.check(0, np.int32(4))  # device 0 of learner 0's program passed step 4; device 1 has not checked it yet
  injector.check(1, np.int32(9))  # (another learner's progress is its own)
  injector.arm_next(0)
  injector.check(0, np.int32(4))  # device 1 passes step 4 too, and both go through its collectives
  for _ in range(2):
    with pytest.raises(injection.SliceCrash):
      injector.check(0, np.int32(5))  # both devices raise at step 5, before its collectives
  injector.check(1, np.int32(10))
  injector.disarm(0)
  injector.check(0, np.int32(0))  # a rejoined learner may start again lower; nothing is armed
  injector.arm_next(0)
  with pytest.raises(injection.SliceCrash):
    injector.check(0, np.int32(1))
