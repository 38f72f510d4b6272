"""A learner in a Ray actor (`backend="ray"`): the actor owns its devices, train state, data stream, parts in flight,
report capture and fault injection; the controller keeps the clock, syncer, budget, rounds, membership and run log,
and reaches the learner through the same LearnerPort (runtime/diloco/learner/interface.py) as one in its process.

The actor runs the in-process Learner itself, so every program, batch and report is the one the in-process learner
would make: under the virtual clock a run is the same, bit for bit. Host values cross: Θ goes down as one `ray.put`
of NumPy arrays shared by reference by every learner it goes to (laid out on the actor's host device there, as the
syncer holds it), a report comes back as NumPy arrays, a part as its record. Each call returns the learner's book
figures with its result, so reading them costs no round trip.

What is built: learners of one slice each on simulated CPU devices, both clocks (under the real one a part's future
is the actor's `part_done`, awaited off the actor's thread), crashes of a learner or its slice (armed in the actor's
own injector) and their rejoin on the same slice. Refused with a named field (the run's config check): several
slices per learner, spare or lent slices, the data service, compression, fragments and crash traces. Checkpoints:
the actor packs its learner's part and the controller's packer takes it in, so a killed driver's rerun resumes with
new actors.
"""

import asyncio
import atexit
import dataclasses
import itertools
import os
import tempfile
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from runtime.checkpoint import snapshot as snapshot_lib
from runtime.cluster import devices as devices_lib
from runtime.config.run import RunConfig
from runtime.diloco.learner.interface import Failure
from runtime.diloco.learner.learner import Learner
from runtime.diloco.learner.parts import RoundPart
from runtime.diloco.sync import messages
from runtime.diloco.sync.messages import Delivery, Report
from runtime.faults import injection

PyTree = Any

# The book's figures each call brings back (completions and intervals, which grow, are asked for when read)
_FIGURES = ("status", "round", "tokens", "reports_out", "total_steps", "busy_seconds")
_ONE_SLICE = "backend 'ray': a learner keeps its one slice (the config check refuses the rest)"


@dataclasses.dataclass(frozen=True)
class PartRecord:
  """A part dispatched in the actor, as the controller sees it (interface.Part)."""

  kind: str
  steps: int
  tokens: int
  started_at: float
  modeled_seconds: float
  queued_seconds: float
  serial: int = -1  # (real clock) the actor's number for the part, whose end `future` awaits
  future: Any = None  # (the virtual clock awaits nothing)


class _PartDone:
  """A part's future on the controller's side (real clock): the clock's waiter blocks on it as on a part's device
  arrays (jax.block_until_ready calls `block_until_ready` on it), and it returns when the part has finished in the
  actor, raising its device error if it failed."""

  def __init__(self, done: Any):
    self._done = done  # the ObjectRef of the actor's `part_done`

  def block_until_ready(self) -> "_PartDone":
    import ray  # pylint: disable=g-import-not-at-top
    ray.get(self._done)
    return self


@dataclasses.dataclass(frozen=True)
class _Theta:
  """Θ on its way to the actor: the object store's reference to its NumPy arrays."""

  ref: Any


class ThetaPut:
  """Θ put in the object store once and shared by reference by every learner it goes to (the newest two, known by
  identity: the syncer hands each merged learner the same tree)."""

  def __init__(self):
    self._held: list[tuple[PyTree, Any]] = []  # (Θ, its reference): holding Θ keeps its identity its own

  def shared(self, theta: PyTree) -> _Theta:
    import ray  # pylint: disable=g-import-not-at-top
    ref = next((ref for held, ref in self._held if held is theta), None)
    if ref is None:
      ref = ray.put(_host_tree(theta))
      self._held = [*self._held, (theta, ref)][-2:]
    return _Theta(ref)


def _host_tree(tree: PyTree) -> PyTree:
  return None if tree is None else jax.tree.map(np.asarray, jax.device_get(tree))


class LearnerHost:
  """The actor's side: one in-process Learner on the actor's own devices, and its fault injector."""

  def __init__(self, index: int, slices: tuple[int, ...], num_devices: int, run: RunConfig, stream: Any, absent: bool):
    f = run.faults
    self._injector = (injection.Injector(run.learners + run.lent_slices, f.schedule)
                      if f.schedule or f.mtbi_chip_seconds > 0 else None)
    # The actor's programs check its own injector for as long as the actor lives (its process trains no other run):
    # the routing is entered and held here (let go of, the context would end and route back to none)
    self._routing = injection.ROUTER.routing(self._injector)
    self._routing.__enter__()  # pylint: disable=unnecessary-dunder-call
    self._devices = jax.devices()[:num_devices]
    self._host = NamedSharding(devices_lib.slice_mesh([devices_lib.host_device()]), P())
    self._schedule = f.schedule
    self._running: dict[int, Any] = {}  # (real clock) serial -> the device results of a part not yet awaited
    self._serials = itertools.count() if run.clock.kind == "real" else None
    self._learner = Learner(index, slices, [self._devices], run, stream, self._injector, absent=absent)

  def call(self, name: str, args: tuple, kwargs: dict) -> tuple[Any, dict]:
    """Runs the learner's method with Θ laid out on the host as the syncer holds it; its result as host values, and
    the book's figures after it."""
    args = tuple(self._inbound(a) for a in args)
    return self._outbound(getattr(self._learner, name)(*args, **kwargs)), self.figures()

  def dispatch(self, *args, **kwargs) -> tuple[PartRecord, dict]:
    """The learner's dispatch; under the real clock its part is numbered for `part_done`."""
    part = self._learner.dispatch(*args, **kwargs)
    record = self._outbound(part)
    if self._serials is not None:
      record = dataclasses.replace(record, serial=next(self._serials))
      self._running[record.serial] = part.future
    return record, self.figures()

  def rejoin(self, slice_index: int, theta: "_Theta", version: int, now: float) -> tuple[None, dict]:
    """The learner's rejoin, on its slice's devices (the actor's)."""
    self._learner.rejoin(slice_index, self._devices, self._theta(theta), version, now)
    return None, self.figures()

  def warm_up(self, theta: "_Theta") -> tuple[None, dict]:
    """The learner's warm-up, for the host here."""
    self._learner.warm_up(self._theta(theta), self._host)
    return None, self.figures()

  async def part_done(self, serial: int) -> None:
    """(Real clock) Returns when part `serial` has finished (raising its device error if it failed); it waits off
    the actor's thread, so the controller's calls go on meanwhile."""
    running = self._running.pop(serial)
    await asyncio.get_running_loop().run_in_executor(None, jax.block_until_ready, running)

  def read(self, name: str) -> Any:
    return getattr(self._learner, name)

  def figures(self) -> dict:
    learner = self._learner
    return dict({k: getattr(learner.book, k) for k in _FIGURES}, slices=learner.slices,
                slice_index=learner.slice_index, parts=tuple(p.kind for p in learner.parts),
                has_theta=learner.inbox is not None)

  def arm(self, how: str, *args) -> None:
    """The controller's arming of a crash, done in the injector the actor's programs check."""
    getattr(self._injector, how)(*args)

  def snapshot(self, treedefs: dict) -> tuple[dict, dict[str, np.ndarray], dict[str, str]]:
    """The learner's part of a checkpoint, packed here: its JSON, its arrays on the host, and the groups whose
    program failed (the controller's packer takes them in: snapshot.Packer.fetched)."""
    packer = snapshot_lib.Packer(self._schedule, treedefs, messages.CODECS)
    saved = self._learner.snapshot(packer)
    arrays, failed = snapshot_lib.fetch(packer.groups)
    return saved, arrays, failed

  def restore(self, saved: dict, arrays: dict[str, np.ndarray], failed: dict[str, str], treedefs: dict,
              theta: "_Theta") -> tuple[None, dict]:
    """The learner as its checkpoint saw it, from the arrays its part names; the book's figures after."""
    unpacker = snapshot_lib.Unpacker(arrays, failed, self._schedule, treedefs, self._host, messages.CODECS)
    self._learner.restore(saved, unpacker, self._theta(theta))
    return None, self.figures()

  def settle(self) -> None:
    """The run is over: one clean check program on the actor's slice, so an error token a crashed program left there
    is replaced now, not raised at the actor's exit (on a slice that never crashed it changes nothing)."""
    if self._injector is not None:
      self._injector.settle([self._devices])

  def _inbound(self, value: Any) -> Any:
    if isinstance(value, Delivery) and value.params is not None:
      return dataclasses.replace(value, params=self._theta(value.params))
    return self._theta(value) if isinstance(value, _Theta) else value

  def _theta(self, theta: _Theta) -> PyTree:
    """Θ from the object store, laid out on the host here as the syncer holds it."""
    import ray  # pylint: disable=g-import-not-at-top
    return jax.device_put(ray.get(theta.ref), self._host)

  @staticmethod
  def _outbound(result: Any) -> Any:
    if isinstance(result, Report):
      return dataclasses.replace(result, params=_host_tree(result.params))
    if isinstance(result, RoundPart):  # its record
      return PartRecord(result.kind, result.steps, result.tokens, result.started_at, result.modeled_seconds,
                        result.queued_seconds)
    return result


class RayLearner:
  """The controller's side of a learner in an actor: a LearnerPort whose calls run there, in the order made."""

  def __init__(self, index: int, slices: tuple[int, ...], num_devices: int, run: RunConfig, stream: Any,
               puts: ThetaPut, absent: bool = False):
    import ray  # pylint: disable=g-import-not-at-top
    self._ray, self._puts = ray, puts
    self.index, self.tokens_per_batch = index, stream.tokens_per_batch
    env = dict(XLA_FLAGS=f"--xla_force_host_platform_device_count={num_devices}", JAX_PLATFORMS="cpu")
    actor = ray.remote(LearnerHost).options(num_cpus=0, runtime_env=dict(env_vars=env))
    self._actor = actor.remote(index, slices, num_devices, run, stream, absent)
    self._delivered: Delivery | None = None
    self._figures: dict = ray.get(self._actor.figures.remote())

  # The book's figures, as of the last call
  status = property(lambda self: self._figures["status"])
  round = property(lambda self: self._figures["round"])
  tokens = property(lambda self: self._figures["tokens"])
  reports_out = property(lambda self: self._figures["reports_out"])
  total_steps = property(lambda self: self._figures["total_steps"])
  busy_seconds = property(lambda self: self._figures["busy_seconds"])
  slices = property(lambda self: tuple(self._figures["slices"]))
  slice_index = property(lambda self: self._figures["slice_index"])
  completions = property(lambda self: self._read("completions"))
  intervals = property(lambda self: self._read("intervals"))

  @property
  def inbox(self) -> Delivery | None:
    return self._delivered if self._figures["has_theta"] else None

  def _read(self, name: str) -> Any:
    return self._ray.get(self._actor.read.remote(name))

  def _ask(self, method: Any, *args, **kwargs) -> Any:
    """The actor's `method` run with these arguments: its result, the book's figures kept."""
    try:
      result, self._figures = self._ray.get(method.remote(*args, **kwargs))
    except self._ray.exceptions.RayTaskError as error:
      raise error.cause from None  # the learner's own error, as the controller handles it in process
    return result

  def _call(self, name: str, *args, **kwargs) -> Any:
    return self._ask(self._actor.call, name, args, kwargs)

  def arm(self, how: str, *args) -> None:
    self._ray.get(self._actor.arm.remote(how, *args))

  def settle(self) -> None:
    self._ray.get(self._actor.settle.remote())

  # Parts in flight
  def parts_in_flight(self) -> int:
    return len(self._figures["parts"])

  def newest_part(self) -> str:
    return self._figures["parts"][-1] if self._figures["parts"] else ""

  def resume_kind(self) -> str:
    return self._figures["parts"][0] if self._figures["parts"] else ""

  def has_theta(self) -> bool:
    return self._figures["has_theta"]

  def parts_end_at(self, seconds_per_step: float) -> float:
    return self._call("parts_end_at", seconds_per_step)

  def seconds_per_step(self, part: Any) -> float:
    return self._call("seconds_per_step", part)

  def needs_theta_at(self, now: float, seconds_per_step: float) -> float:
    return self._call("needs_theta_at", now, seconds_per_step)

  def busy_fraction(self, now: float) -> float:
    return self._call("busy_fraction", now)

  def device_idle(self) -> float:
    return self._call("device_idle")

  def dispatch(self, kind: str, steps: int, now: float, modeled_seconds: float, armed: bool = False,
               schedule_at: int | None = None, ahead: int | None = None) -> PartRecord:
    part = self._ask(self._actor.dispatch, kind, steps, now, modeled_seconds, armed=armed, schedule_at=schedule_at,
                     ahead=ahead)
    if part.serial < 0:
      return part
    return dataclasses.replace(part, future=_PartDone(self._actor.part_done.remote(part.serial)))

  def collect(self, now: float) -> PartRecord:
    return self._call("collect", now)

  # Reports up, Θ down
  def corrupt_next_report(self, how: str) -> None:
    self._call("corrupt_next_report", how)

  def capture_report(self) -> None:
    self._call("capture_report")

  def report(self, now: float) -> Report:
    return self._call("report", now)

  def report_sent(self, report: Report) -> None:
    self._call("report_sent", dataclasses.replace(report, params=None))  # (its book reads the counts only)

  def report_settled(self, report: Report, merged: bool) -> None:
    self._call("report_settled", dataclasses.replace(report, params=None), merged)

  def owed_fragment(self) -> int:
    return self._call("owed_fragment")

  def live_bases(self) -> tuple[tuple[int, int], ...]:
    return self._call("live_bases")

  def theta_landing(self) -> Callable[[PyTree], Any] | None:
    return None  # (the actor lays Θ out itself when it adopts it)

  def deliver(self, delivery: Delivery) -> bool:
    params = None if delivery.params is None else self._puts.shared(delivery.params)
    kept = self._call("deliver", dataclasses.replace(delivery, params=params, placed=None))
    if kept:
      self._delivered = delivery
    return kept

  def adopt(self, now: float) -> int:
    return self._call("adopt", now)

  # Its status, when nothing runs
  def finish(self, now: float) -> None:
    self._call("finish", now)

  def wait(self, now: float) -> None:
    self._call("wait", now)

  def reconfigure(self, now: float) -> None:
    self._call("reconfigure", now)

  def await_repair(self, now: float) -> None:
    self._call("await_repair", now)

  # Placement, failure and return (the actor's devices are its one slice's)
  def move_to(self, slices: int | tuple[int, ...], devices: list) -> None:
    del slices, devices
    raise NotImplementedError(_ONE_SLICE)

  def warm_up(self, theta_host: PyTree, host_sharding: Any, where: tuple | None = None) -> None:
    del host_sharding  # (the actor's own host)
    if where is not None:
      raise NotImplementedError(_ONE_SLICE)
    self._ask(self._actor.warm_up, self._puts.shared(theta_host))

  def reset(self, theta_host: PyTree, version: int, now: float) -> None:
    self._call("reset", self._puts.shared(theta_host), version, now)

  def regroup(self, slices: tuple[int, ...], groups: list[list[Any]]) -> None:
    del slices, groups
    raise NotImplementedError(_ONE_SLICE)

  def fail(self, now: float, status: str = "down") -> Failure:
    return self._call("fail", now, status)

  def lose_part(self, now: float) -> Failure:
    return self._call("lose_part", now)

  def leave(self, now: float) -> Failure:
    return self._call("leave", now)

  def rejoin(self, slice_index: int, devices: list[Any], theta_host: PyTree, version: int, now: float) -> None:
    del devices  # (the actor's own)
    self._ask(self._actor.rejoin, slice_index, self._puts.shared(theta_host), version, now)

  def give_back_unreported(self) -> None:
    self._call("give_back_unreported")

  def join_schedule(self, total_steps: int) -> None:
    self._call("join_schedule", total_steps)

  def served(self, start: int, end: int) -> Any:
    return self._call("served", start, end)

  def leases(self) -> list[int]:
    return self._call("leases")

  # Checkpoints: the actor packs its part, the controller's packer takes it in under the learner's own keys
  def snapshot(self, packer: snapshot_lib.Packer) -> dict:
    saved, arrays, failed = self._ray.get(self._actor.snapshot.remote(packer.treedefs))
    return packer.fetched(saved, arrays, failed, prefix=f"learner{self.index}:")

  def restore(self, saved: dict, unpacker: snapshot_lib.Unpacker, theta_host: PyTree) -> None:
    self._ask(self._actor.restore, saved, unpacker.arrays_named(saved), unpacker.failed, unpacker.treedefs,
              self._puts.shared(theta_host))
    self._delivered = unpacker.value(saved["inbox"])  # (its Θ, should it have to go again)

  def close(self) -> None:
    """Its data stream stops; the actor answers for its book until the last handle to it goes (Ray ends it then). An
    actor already gone has nothing to stop (the run's own error, if any, is the one raised)."""
    try:
      self._call("close")
    except self._ray.exceptions.RayActorError:
      pass


class RemoteArming:
  """The controller's fault injector under backend "ray": arming a learner's crash arms it in that learner's actor,
  whose programs check it there."""

  def __init__(self, learners: list[RayLearner]):
    self._learners = learners

  def arm(self, learner: int, step: int | None) -> None:
    self._learners[learner].arm("arm", learner, step)

  def arm_next(self, learner: int) -> None:
    self._learners[learner].arm("arm_next", learner)

  def disarm(self, learner: int) -> None:
    self._learners[learner].arm("disarm", learner)

  def settle(self, slices: list) -> None:
    del slices  # (the controller's devices ran none of the learners' programs: each actor settles its own)
    for learner in self._learners:
      learner.settle()


def ensure_cluster(address: str = "") -> None:
  """The Ray cluster the learners' actors run on, unless this process is connected to one: the running cluster at
  `address` (config field ray.address), or a local one started for the process (sized to the machine, no dashboard,
  its files in a temporary directory). The process leaves it (a local one stops) when it ends."""
  import ray  # pylint: disable=g-import-not-at-top
  if ray.is_initialized():
    return
  if address:
    ray.init(address=address, log_to_driver=False, configure_logging=False)
  else:
    ray.init(include_dashboard=False, num_cpus=os.cpu_count(), log_to_driver=False, configure_logging=False,
             _temp_dir=tempfile.mkdtemp(prefix="ray-"))
  atexit.register(ray.shutdown)
