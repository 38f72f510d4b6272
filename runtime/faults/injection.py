"""Fault injection into device programs, and what the controller learns from a device error.

A crash is injected from inside the learner's device program: a host callback in every inner
step raises once the step reaches the armed one, so the controller sees a genuine JAX runtime
error, either at dispatch or when it awaits the result (XLA:CPU reports every host callback's error
as INTERNAL). On a slice of one device the check runs once, in a program queued behind the part
(runtime/diloco/learner/placement.py says why), and fails the part's outputs at its end instead. A program
bug is injected at dispatch, as the INVALID_ARGUMENT error a broken program raises there, every
time: it is no lost slice. A crash that ends its process (a learner in a Ray actor, `ends=process`) kills the
process from the same check, so the controller learns of it as of any process that died: `ProcessLost`; one that
hangs it (`ends=hang`) stops there for good, until the controller's deadline kills the process.
"""

import contextlib
import logging
import os
import signal
import threading
from typing import Any, Iterator, Sequence

import jax
import numpy as np
from jax.experimental import io_callback
from jax.sharding import NamedSharding, PartitionSpec as P

from runtime.cluster import devices as devices_lib
from runtime.cluster import multislice
from runtime.config.faults import Fault
from runtime.faults.plan import program_bug

PyTree = Any
_NEVER = np.iinfo(np.int64).max


class SliceCrash(RuntimeError):
  """Raised inside a learner's device program to fail its slice."""


class ProcessLost(RuntimeError):
  """A learner's process ended (killed, or died) and took its device state with it: read as a lost slice. Raised by
  the controller's side of a learner in another process (runtime/diloco/learner/ray_learner.py) where the learner
  had to answer; `learner` names it."""

  def __init__(self, learner: int, description: str):
    super().__init__(f"learner {learner}'s process ended: {description}")
    self.learner = learner


class _InjectedCrashesUnlogged(logging.Filter):
  """JAX logs every exception of a host callback with its traceback; an injected crash is no bug, and the run
  reports it in one line of its own."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.exc_info and isinstance(record.exc_info[1], SliceCrash))


class Injector:
  """Arms crashes inside device programs: each learner's program fails at its armed inner step; scheduled program
  bugs fail every dispatch of their learner from their time on."""

  def __init__(self, num_learners: int, schedule: Sequence[Fault] = ()):
    callbacks = logging.getLogger("jax._src.callback")
    if not any(isinstance(f, _InjectedCrashesUnlogged) for f in callbacks.filters):
      callbacks.addFilter(_InjectedCrashesUnlogged())
    self._lock = threading.Lock()  # (checks run on the devices' threads, arming on the controller's)
    self._armed = [_NEVER] * num_learners
    self._reached = [-1] * num_learners  # the furthest inner step any device of the learner's programs checked
    self._ends = ["program"] * num_learners  # what its armed crash ends (config.faults: crash's `ends`)
    self._schedule = tuple(schedule)

  def arm(self, learner: int, step: int | None, ends: str = "program") -> None:
    """The learner's program raises when it reaches inner step `step` (its global step count); None disarms. For a
    program not yet dispatched: one in flight may have devices on either side of `step` (see `arm_next`). `ends`
    "process": instead of raising, the program ends its own process there; "hang": it stops there and never
    answers (a learner in a process of its own: the config check allows either with backend 'ray' only)."""
    with self._lock:
      self._armed[learner] = _NEVER if step is None else step
      self._ends[learner] = ends

  def arm_next(self, learner: int, ends: str = "program") -> None:
    """Arms the learner's programs in flight to raise at the inner step after the furthest any of their devices has
    checked. Every device of a program then raises at that same step: armed at a step that one device had passed and
    another not, the second would raise while the first waited for it, forever, in that step's collective."""
    with self._lock:
      self._armed[learner], self._ends[learner] = self._reached[learner] + 1, ends

  def disarm(self, learner: int) -> None:
    """Nothing armed; the learner's programs are gone (its next may start at a lower step, after a rejoin)."""
    with self._lock:
      self._armed[learner], self._reached[learner], self._ends[learner] = _NEVER, -1, "program"

  def settle(self, slices: Sequence[Sequence[jax.Device]]) -> None:
    """Runs one clean effectful program on each slice whose program crashed, so the failed program's
    error token is replaced now rather than re-raised by JAX at interpreter exit."""
    for devices in slices:
      mesh = devices_lib.slice_mesh(devices)
      self.disarm(0)
      check = jax.jit(device_check(self, 0, mesh))
      jax.block_until_ready(check(jax.device_put(np.int32(-1), NamedSharding(mesh, P()))))

  def check(self, learner: int, step: np.ndarray) -> None:
    """Host callback run by every device at every inner step of an armed-capable program."""
    step = int(step)
    with self._lock:
      self._reached[learner] = max(self._reached[learner], step)
      fails, ends = step >= self._armed[learner], self._ends[learner]
    if fails and ends == "process":
      os.kill(os.getpid(), signal.SIGKILL)  # the process ends here, as a machine's loss ends it
    if fails and ends == "hang":
      threading.Event().wait()  # it stops here and never answers, as a wedged device does (its process is killed)
    if fails:
      raise SliceCrash(f"injected crash of learner {learner}'s slice at inner step {step}")

  def check_program(self, learner: int, now: float) -> None:
    """Raises the learner's scheduled program bug, if one is due by `now` (called at every dispatch)."""
    bug = program_bug(self._schedule, learner, now)
    if bug is not None:
      raise jax.errors.JaxRuntimeError(f"INVALID_ARGUMENT: injected program bug in learner {learner}'s round "
                                       f"program ({bug.text}): it fails the same way at every dispatch")


def injects(run) -> bool:
  """Whether the run's programs check an injector: crashes scheduled or drawn (random traces), or a replayed trace's
  under the real clock (under the virtual clock its crashes are modeled where they fall)."""
  f = run.faults
  return bool(f.schedule) or f.mtbi_chip_seconds > 0 or (bool(f.trace) and run.clock.kind == "real")


class Router:
  """Where the learners' programs send their step checks: to the injector of the controller training now.

  A learner's programs are shared by every run in the process with the same model, optimizer and mesh
  (runtime/diloco/learner/placement.py), so their host callback cannot hold one run's injector; a controller routes the
  checks to its own for as long as it trains. With none routed, nothing is armed and every check passes.
  """

  def __init__(self):
    self._injector: Injector | None = None

  @contextlib.contextmanager
  def routing(self, injector: Injector | None) -> Iterator[None]:
    before, self._injector = self._injector, injector
    try:
      yield
    finally:
      self._injector = before

  def check(self, learner: int, step: np.ndarray) -> None:
    if self._injector is not None:
      self._injector.check(learner, step)


ROUTER = Router()


class RecordedFailure(jax.errors.JaxRuntimeError):
  """A program's device error, recorded where it surfaced (at dispatch, or in a checkpoint), raised where the run
  awaits the program; it describes itself as the original error, and is classified by that description."""

  def __init__(self, description: str):
    super().__init__(description)
    self.description = description


def corrupt(params: PyTree, how: str) -> PyTree:
  """A corrupted copy of a report's parameters: NaN, Inf, or an absurdly scaled update."""
  scale = {"nan": float("nan"), "inf": float("inf"), "huge": 1e9}[how]
  return jax.tree.map(lambda x: x * scale, params)


def device_check(injector: Injector | Router, learner: int, mesh: jax.sharding.Mesh):
  """A step hook that runs the injector's check on every device of the slice.

  Each device calls the host itself (shard_map), so an injected crash fails every device's
  program at the same step; a single host call would leave the other devices waiting forever
  in the next collective.
  """

  def per_device(step):
    io_callback(lambda s: injector.check(learner, s), None, step, ordered=False)
    return step

  return lambda step: jax.shard_map(per_device, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)(step)


def describe(error: Exception) -> str:
  """The error's type and the last line of its message (callback errors carry a whole traceback)."""
  if isinstance(error, RecordedFailure):
    return error.description
  lines = str(error).strip().splitlines() or [""]
  return f"{type(error).__name__}: {lines[-1]}"


def fired(error: Exception, ends: str) -> bool:
  """Whether `error` is what a crash armed here raises where it ends `ends`: a SliceCrash from its program, or (ending
  its process, or hanging it until killed) its process lost."""
  if ends == "program":
    return isinstance(error, jax.errors.JaxRuntimeError) and f"{SliceCrash.__name__}: " in str(error)
  return isinstance(error, ProcessLost)


def slice_lost(error: Exception) -> bool:
  """True when the error lost the learner's slice: a crash injected here, the learner's process ended, or pathwaysutils
  reads it so (DATA_LOSS, DEADLINE_EXCEEDED, NOT_FOUND, INTERNAL); any other error is a program error, which no other
  slice would cure."""
  return fired(error, "program") or isinstance(error, ProcessLost) or multislice.slice_lost(error)
