"""Where a learner trains: the mesh over its slices, its shardings, and its programs compiled there.

A learner of one slice (slices_per_learner = 1) trains on a one-axis ('data') mesh; a learner of several on a
two-axis ('slice', 'data') mesh, its batch split over both axes, its parameters replicated across slices (and,
with fsdp, split along 'data' within each). With mesh.tensor > 1 each slice's devices form ('data', 'tensor'):
parameters split across 'tensor' by their logical axes (models/lm.py), the batch across 'data' only. Such a learner
that reconfigures around a lost slice (faults.learner_recovery = 'reconfigure') keeps the state it had before the
part in flight: its round program does not donate that state, at the cost of a second copy of it while a part runs.
"""

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from models import lm
from models.config import ModelConfig
from runtime.cluster import devices as devices_lib
from runtime.config.run import InnerOptConfig, RunConfig
from runtime.diloco import round_plan
from runtime.diloco.learner import receive as receive_lib
from runtime.faults import injection
from runtime.train import tree_transfer
from runtime.train.optim import inner_optimizer
from runtime.train.programs import init_state, make_round

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Placement:
  """A learner's mesh over `slices`, the shardings of its parameters and batches, and its programs there."""

  slices: tuple[int, ...]
  mesh: Mesh
  param_sharding: PyTree
  batch_sharding: NamedSharding
  round_program: Callable
  report_program: Callable  # the round program that also returns a copy of its final parameters (the report's)
  init: Callable
  keeps_state: bool  # the round program leaves its input state intact (the state before a part survives it)


class Placements:
  """A learner's placements, one per set of slices it trains on (or may: warmed up before), each placed once."""

  def __init__(self, learner: int, run: RunConfig, injector: injection.Injector | None):
    self._learner, self._run, self._injector = learner, run, injector
    self._placed: dict[tuple[int, ...], Placement] = {}

  def at(self, slices: tuple[int, ...], groups: Sequence[Sequence[jax.Device]]) -> Placement:
    if slices not in self._placed:
      self._placed[slices] = place(self._learner, slices, groups, self._run, self._injector)
    return self._placed[slices]


def keeps_state(run: RunConfig) -> bool:
  """Whether a learner keeps its state across a lost slice: several slices per learner, reconfiguring."""
  return run.slices_per_learner > 1 and run.faults.learner_recovery == "reconfigure"


def place(learner: int, slices: tuple[int, ...], groups: Sequence[Sequence[jax.Device]], run: RunConfig,
          injector: injection.Injector | None) -> Placement:
  """The learner's placement on `slices` (the devices of each in `groups`), its programs compiled there."""
  if run.slices_per_learner == 1:
    mesh, batch_axes = devices_lib.slice_mesh(groups[0], run.mesh.tensor), "data"
  else:
    mesh, batch_axes = devices_lib.learner_mesh(groups, run.mesh.tensor), ("slice", "data")
  keep = keeps_state(run)
  return Placement(slices, mesh, lm.param_shardings(run.model, mesh, run.fsdp),
                   NamedSharding(mesh, P(None, batch_axes)),
                   *programs(run.model, run.inner, run.total_steps, learner if injector else None, mesh, keep), keep)


@functools.lru_cache(maxsize=64)
def programs(model: ModelConfig, inner: InnerOptConfig, total_steps: int, checked_learner: int | None, mesh: Mesh,
             keep: bool) -> tuple[Callable, Callable, Callable]:
  """A learner's round program, its round program that also copies the report, and its state's init: jitted once
  per process for each model, inner optimizer, learner mesh and state keeping, and shared by every run that trains
  them (a sweep, a comparison, the tests), so a run after the first traces and compiles none of them again. With
  `checked_learner` the part checks for an injected crash of that learner (through injection.ROUTER): at every inner
  step, or on a mesh of one device at the part's end (see `_checked_at_end`)."""
  tx = inner_optimizer(inner, total_steps)
  checked = checked_learner is not None
  per_step = checked and mesh.devices.size > 1
  hook = injection.device_check(injection.ROUTER, checked_learner, mesh) if per_step else None
  donate = () if keep else 0
  rounds = (jax.jit(make_round(model, tx, hook, mesh=mesh), donate_argnums=donate),
            jax.jit(make_round(model, tx, hook, copy_params=True, mesh=mesh), donate_argnums=donate))
  if checked and not per_step:
    gate = _end_check(checked_learner, mesh)
    rounds = tuple(_checked_at_end(program, gate) for program in rounds)
  return (*rounds, jax.jit(lambda p, step: init_state(p, tx, step)))


def _end_check(learner: int, mesh: Mesh) -> Callable:
  """A program that checks for the learner's injected crash at the last inner step of the part whose outputs it
  takes, and returns them (donated: the same buffers)."""
  check = injection.device_check(injection.ROUTER, learner, mesh)

  def passed(outputs):
    state = outputs[0]
    return (state.replace(step=check(state.step - 1) + 1), *outputs[1:])

  return jax.jit(passed, donate_argnums=0)


def _checked_at_end(program: Callable, gate: Callable) -> Callable:
  """The part `program` without a host call, then the `gate` that checks it.

  XLA:CPU runs a one-device program that calls the host on the thread that dispatches it, whenever its inputs are
  ready (`python -m launch.bench_dispatch`): a part checked at every inner step would then train on the controller's
  thread. The part alone is dispatched asynchronously, and the gate waits for its outputs, so neither holds the
  caller. An armed crash fails the gate, and with it every output of the part, at the part's end rather than at the
  armed step: the device error surfaces the same way, at most a part later.
  """
  return lambda state, batches: gate(program(state, batches))


def moved(tree: PyTree, mesh: Mesh) -> PyTree:
  """`tree` laid out the same way on another learner mesh of the same axes (fewer or more slices)."""
  return jax.device_put(tree, jax.tree.map(lambda x: NamedSharding(mesh, x.sharding.spec), tree))


def warm_up(where: Placement, theta_host: PyTree, host_sharding: jax.sharding.Sharding | None, run: RunConfig,
            batch_size: int, main_copies_report: bool) -> None:
  """Compiles the programs a learner runs there by running each once on a throwaway state and zero batches of
  `batch_size` sequences: the round of its main part (copying the report, if `main_copies_report`) and of its
  overlap part (the main part's program if as long), a report's copy to the host (none without a host sharding: a
  gang's member reads its report as NumPy), Θ's copy onto the slices and the adoption. Under the real clock a part
  dispatched before would make the device idle while its program compiles."""
  params = tree_transfer.copy_to(theta_host, where.param_sharding)
  state = where.init(params, 0)
  main, lengths = round_plan.main_steps(run), round_plan.part_lengths(run)
  parts = {(steps, main_copies_report and steps == main) for steps in lengths}
  if main_copies_report and run.rounds.length == "time":  # (a main part's last piece may be of any length)
    parts |= {(steps, True) for steps in lengths}
  for steps, copies in sorted(parts):
    program = where.report_program if copies else where.round_program
    batches = np.zeros((steps, batch_size, run.data.seq_len + 1), np.int32)
    state = program(state, jax.device_put(batches, where.batch_sharding))[0]
  landed = None
  if host_sharding is not None:
    landed = tree_transfer.copy_to(tree_transfer.fresh_copy(state.params), host_sharding)
  adopted = receive_lib.carry(tree_transfer.copy_to(theta_host, where.param_sharding), state.params,
                              tree_transfer.fresh_copy(state.params))
  jax.block_until_ready((landed, adopted))
