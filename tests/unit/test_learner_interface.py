"""The one interface the controller drives learners through (runtime/diloco/learner/interface.py): the in-process
learner and the tests' stand-in match its signatures, the controller's collaborators reach a learner through
nothing else, and what crosses it works as host values."""

import dataclasses
import inspect
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from controller_fakes import FakeLearner
from models import lm
from runtime.cluster import devices as devices_lib
from runtime.config.run import OuterConfig
from runtime.diloco.learner.interface import LearnerPort
from runtime.diloco.learner.learner import Learner
from runtime.diloco.learner.ray_learner import RayLearner
from runtime.diloco.sync.messages import Delivery, Report
from runtime.diloco.sync.syncer import Syncer
from runtime.experiments import modes
from runtime.train.harness import Experiment

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The modules that drive learners (the learner's own package, and the factory that builds it, excepted)
COLLABORATORS = ("runtime/diloco/rounds.py", "runtime/diloco/merge_schedule.py", "runtime/diloco/membership.py",
                 "runtime/diloco/budget.py", "runtime/diloco/run_log.py", "runtime/diloco/profiling.py",
                 "runtime/diloco/controller.py", "runtime/diloco/slices/lifecycle.py",
                 "runtime/diloco/slices/one_slice.py", "runtime/diloco/slices/several_slices.py")
# What the stand-in keeps for the tests themselves: what was done to it, and its parts as a plain list
FAKE_ONLY = {"calls", "unmerged_tokens", "device", "parts", "lost"}


def _members() -> dict[str, object]:
  """The interface's members: methods and properties by name, attributes as None."""
  members = {name: value for name, value in vars(LearnerPort).items()
             if not name.startswith("_") and (callable(value) or isinstance(value, property))}
  members.update({name: None for name in LearnerPort.__annotations__})
  return members


def _shape(function) -> list[tuple[str, bool]]:
  """A signature as (parameter name, has a default) after self."""
  parameters = list(inspect.signature(function).parameters.values())[1:]
  return [(p.name, p.default is not inspect.Parameter.empty) for p in parameters]


@pytest.mark.parametrize("implementation", [Learner, RayLearner, FakeLearner],
                         ids=["Learner", "RayLearner", "FakeLearner"])
def test_every_method_the_interface_names_has_its_signature(implementation):
  for name, member in _members().items():
    if not callable(member) or isinstance(member, property):
      continue
    if implementation is FakeLearner and not hasattr(implementation, name):
      continue  # (the stand-in has only what the collaborators under test ask of it)
    assert _shape(getattr(implementation, name)) == _shape(member), f"{implementation.__name__}.{name}"
  for name in _members():  # the learners themselves have every one
    if implementation is not FakeLearner and _members()[name] is not None:
      assert hasattr(implementation, name), f"{implementation.__name__}.{name}"


def test_the_stand_in_learner_offers_nothing_the_interface_lacks():
  fake = FakeLearner(0, slices=(0,))
  offered = {name for name in dir(fake) if not name.startswith("_")} - FAKE_ONLY
  assert offered <= set(_members()), sorted(offered - set(_members()))


def test_the_controllers_collaborators_reach_a_learner_only_through_the_interface():
  names = set(_members())
  reach = re.compile(r"\b(?:learner|l|self\._learners\[[^\]]+\]|learners\[[^\]]+\])\.(\w+)")
  stray = []
  for path in COLLABORATORS:
    for number, line in enumerate((ROOT / path).read_text().splitlines(), 1):
      if line.lstrip().startswith(("from ", "import ", "#")):
        continue
      stray += [f"{path}:{number}: .{name}" for name in reach.findall(line) if name not in names]
  assert not stray, "\n".join(stray)


def test_a_report_sent_as_numpy_arrays_merges_as_the_same_report_on_device():
  # A learner in another process sends its tensors as NumPy arrays; the syncer lands either on its host.
  cfg = OuterConfig(lr=0.7, momentum=0.9, nesterov=True, merge="rda", token_weighting=True)
  theta = {"w": jnp.zeros(4), "b": jnp.ones(2)}
  local = [{"w": jnp.arange(4.0), "b": jnp.full(2, 3.0)}, {"w": -jnp.arange(4.0) / 2, "b": jnp.zeros(2)}]
  merged = []
  for as_host in (False, True):
    syncer = Syncer(cfg, theta, num_learners=2)
    reports = [Report(m, jax.tree.map(np.asarray, p) if as_host else p, 100 * (m + 1), 10, 0, loss=1.0, sent_at=0.0)
               for m, p in enumerate(local)]
    landed = [dataclasses.replace(r, params=syncer.land(r.params)) for r in reports]
    assert {d for r in landed for leaf in jax.tree.leaves(r.params) for d in leaf.devices()} == {
        devices_lib.host_device()}
    merged.append(jax.device_get(syncer.compute(landed).params))
  jax.tree.map(np.testing.assert_array_equal, merged[0], merged[1])


@pytest.fixture
def learner(tiny_config):
  tiny_config.learners = 1
  tiny_config.num_devices = 2
  run = modes.prepare(tiny_config)
  learner = Learner(0, 0, jax.devices()[:1], run, Experiment(run).shard(0, 1, run.data.batch_size))
  host = NamedSharding(devices_lib.slice_mesh([devices_lib.host_device()]), P())
  theta = jax.device_put(lm.init_params(run.model, jax.random.key(0)), host)
  learner.reset(theta, 0, 0.0)
  yield learner, theta
  learner.close()


def _round_with_theta(learner, theta, placed):
  learner.dispatch("main", 2, 0.0, 2.0)
  learner.collect(2.0)
  report = learner.report(2.0)
  learner.report_sent(report)
  learner.report_settled(report, merged=True)
  moved = jax.tree.map(lambda x: x + 1.0, theta)
  assert learner.deliver(Delivery(version=1, params=moved, round=learner.round, placed=placed(moved)))
  learner.adopt(3.0)
  return moved


def test_theta_laid_out_by_the_learners_landing_is_adopted_as_laid_out(learner):
  learner, theta = learner
  land = learner.theta_landing()  # asked on the controller's thread; the merge worker calls it
  laid_out = {}
  moved = _round_with_theta(learner, theta, lambda tree: laid_out.setdefault("placed", land(tree)))
  leaves = jax.tree.leaves(learner.state.params)
  assert all(a is b for a, b in zip(leaves, jax.tree.leaves(laid_out["placed"][1])))  # no second copy
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(learner.state.params), jax.device_get(moved))


def test_a_landing_from_before_the_learner_moved_is_ignored_and_theta_copied_where_it_is(learner):
  learner, theta = learner
  land = learner.theta_landing()
  learner.regroup((1,), [jax.devices()[1:2]])
  moved = _round_with_theta(learner, theta, land)
  for leaf in jax.tree.leaves(learner.state.params):
    assert leaf.devices() == {jax.devices()[1]}
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(learner.state.params), jax.device_get(moved))


def test_a_learner_without_slices_has_no_landing(tiny_config):
  run = modes.prepare(tiny_config)
  absent = Learner(1, -1, [], run, Experiment(run).shard(1, 2, run.data.batch_size), absent=True)
  try:
    assert absent.theta_landing() is None
  finally:
    absent.close()
