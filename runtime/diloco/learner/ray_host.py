"""The actor's side of a learner under `backend="ray"` (runtime/diloco/learner/ray_learner.py is the controller's):
one in-process Learner on the actor's own devices, its fault injector, and the host values that cross to the
controller (a part's record, a report's arrays, the book's figures).

A learner of several processes (`ray.processes_per_learner`, a gang) is one actor per process, joined by
`jax.distributed` before JAX starts: every member runs the same Learner over the gang's devices, each holding its own
share of them, and the controller makes every call to all of them (the answers of the first are the learner's). Θ
reaches a gang's members as NumPy, each laying out its share of the slice itself (a device array of one process
cannot cross to the others'), and a report comes back from the parameters each member holds whole (replicated over
the slice).
"""

import asyncio
import dataclasses
import itertools
import os
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from runtime.checkpoint import snapshot as snapshot_lib
from runtime.cluster import devices as devices_lib
from runtime.config.run import RunConfig
from runtime.diloco.learner.book import LearnerBook
from runtime.diloco.learner.learner import Learner
from runtime.diloco.learner.parts import RoundPart
from runtime.diloco.sync import messages
from runtime.diloco.sync.messages import Delivery, Report
from runtime.faults import injection
from runtime.train import tree_transfer

PyTree = Any

_ROWS = ("completions", "intervals")  # the book's lists, which only grow: each answer brings the rows added since


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
  step_seconds: float | None = None  # (collected) the time one of its steps took, as Learner.seconds_per_step reads it


@dataclasses.dataclass(frozen=True)
class Theta:
  """Θ on its way to the actor: the object store's reference to its NumPy arrays."""

  ref: Any


def host_tree(tree: PyTree) -> PyTree:
  return None if tree is None else jax.tree.map(np.asarray, jax.device_get(tree_transfer.host_view(tree)))


def join_gang(rank: int, size: int, coordinator: str) -> None:
  """Joins this process to its gang's others (process `rank` of `size`, the first serving at `coordinator`,
  host:port) before JAX starts its backend: jax.devices() are then the whole gang's, and its programs run across the
  processes (CPU collectives over gloo)."""
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator, size, rank, coordinator_bind_address=coordinator,
                             shutdown_timeout_seconds=10)


class LearnerHost:
  """The actor's side: one in-process Learner on the actor's own devices (with `gang`, (rank, size, coordinator),
  on its gang's: see join_gang), and its fault injector."""

  def __init__(self, index: int, slices: tuple[int, ...], home: tuple[int, ...], num_devices: int, run: RunConfig,
               stream: Any, absent: bool, gang: tuple[int, int, str] = (0, 1, "")):
    if gang[1] > 1:
      join_gang(*gang)
    # Its programs from the run's compilation cache: an actor that replaces a lost one loads what the first compiled
    # (their XLA_FLAGS, and so the cache's keys, are the same; a process of another device count keys apart)
    devices_lib.configure_compilation_cache(run.compile_cache)
    f = run.faults
    self._injector = injection.Injector(run.learners + run.lent_slices, f.schedule) if injection.injects(run) else None
    # The actor's programs check its own injector for as long as the actor lives (its process trains no other run):
    # the routing is entered and held here (let go of, the context would end and route back to none)
    self._routing = injection.ROUTER.routing(self._injector)
    self._routing.__enter__()  # pylint: disable=unnecessary-dunder-call
    self._devices = jax.devices()[:num_devices]
    per = num_devices // len(home)  # (its home slices' devices, in order: the controller's slice i is its group i)
    self._groups = {s: self._devices[i * per:(i + 1) * per] for i, s in enumerate(home)}
    # (a gang's members hold Θ as NumPy: a device array of one process cannot be laid out on the others' devices)
    self._host = None if gang[1] > 1 else NamedSharding(devices_lib.slice_mesh([devices_lib.host_device()]), P())
    self._schedule = f.schedule
    self._sent: tuple[Any, dict[str, int]] = (None, {})  # (the book, how many of its rows each list has sent)
    self._running: dict[int, Any] = {}  # (real clock) serial -> the device results of a part not yet awaited
    self._serials = itertools.count() if run.clock.kind == "real" else None
    # (no slices: an actor taking the place of a learner whose process ended while it had none, down or stopped)
    self._learner = Learner(index, slices or -1, self.devices_of(slices) if slices else [], run, stream,
                            self._injector, absent=absent)

  def devices_of(self, slices: int | tuple[int, ...]) -> list:
    """The devices here of one of its home slices (a slice index), or of each of several (a tuple): the controller's
    slice i of its home is its devices' group i."""
    return self._groups[slices] if isinstance(slices, int) else [self._groups[s] for s in slices]

  def joined(self) -> tuple[None, dict]:
    """Its first answer: the book's figures as the actor starts (a gang's member: once the gang has joined)."""
    return None, self.figures()

  def call(self, name: str, args: tuple, kwargs: dict, notes: tuple = ()) -> tuple[Any, dict]:
    """Runs the learner's method with Θ laid out on the host as the syncer holds it (after the book's moves the
    controller noted, `noted`); its result as host values, and the book's figures after it."""
    self._make(notes)
    args = tuple(self._inbound(a) for a in args)
    return self._outbound(getattr(self._learner, name)(*args, **kwargs)), self.figures()

  def noted(self, notes: list[tuple[str, tuple]]) -> tuple[None, dict]:
    """The moves of the learner's book the controller noted (`_make`), on their own; the book's figures after."""
    self._make(notes)
    return None, self.figures()

  def _make(self, notes: list[tuple[str, tuple]]) -> None:
    """The learner's methods that only move its book, called in the order the controller made them (and made on its
    copy of the book then: RayLearner._note); the rows they add go with the answer of the call that carried them."""
    for name, args in notes:
      getattr(self._learner, name)(*args)

  def dispatch(self, *args, grant: np.ndarray | None = None, notes: tuple = (), **kwargs) -> tuple[PartRecord, dict]:
    """The learner's dispatch, with the data service's serials the controller leased for it (`grant`); under the real
    clock its part is numbered for `part_done`."""
    self._make(notes)
    if grant is not None:
      self._learner.leased.grants.grant(grant)
    try:
      part = self._learner.dispatch(*args, **kwargs)
    finally:  # (a dispatch that raised before its lease leaves nothing granted: the controller gives its copy's back)
      if grant is not None:
        self._learner.leased.grants.grant(None)
    record = self._outbound(part)
    if self._serials is not None:
      record = dataclasses.replace(record, serial=next(self._serials))
      self._running[record.serial] = part.future
    return record, self.figures()

  def collect(self, now: float, notes: tuple = ()) -> tuple[PartRecord, dict]:
    """The learner's collect; the part's record carries its step time (read by the controller with no round trip)."""
    self._make(notes)
    part = self._learner.collect(now)
    return dataclasses.replace(self._outbound(part), step_seconds=self._learner.seconds_per_step(part)), self.figures()

  def rejoin(self, slice_index: int | tuple[int, ...], theta: "Theta", version: int, now: float) -> tuple[None, dict]:
    """The learner's rejoin, on its slice's (or slices') devices here."""
    self._learner.rejoin(slice_index, self.devices_of(slice_index), self._theta(theta), version, now)
    return None, self.figures()

  def move_to(self, slices: int | tuple[int, ...], regroup: bool = False) -> tuple[None, dict]:
    """The learner's move_to (or with `regroup`, its state taken along) onto these of its slices' devices here."""
    (self._learner.regroup if regroup else self._learner.move_to)(slices, self.devices_of(slices))
    return None, self.figures()

  def warm_up(self, theta: "Theta", where: tuple[int, ...] | None = None) -> tuple[None, dict]:
    """The learner's warm-up, for the host here (on `where`, a set of its slices, if given)."""
    self._learner.warm_up(self._theta(theta), self._host, None if where is None else (where, self.devices_of(where)))
    return None, self.figures()

  async def part_done(self, serial: int) -> None:
    """(Real clock) Returns when part `serial` has finished (raising its device error if it failed); it waits off
    the actor's thread, so the controller's calls go on meanwhile."""
    running = self._running.pop(serial)
    await asyncio.get_running_loop().run_in_executor(None, jax.block_until_ready, running)

  def figures(self) -> dict:
    """The learner's book (its lists as the rows added since the last figures: a book restored starts them again),
    where it trains, its parts in flight and their live tokens, whether Θ waits in its inbox, and what the merge
    schedule reads of it at every event (the fragment it owes, the Θ it works from)."""
    learner, book = self._learner, self._learner.book
    if self._sent[0] is not book:
      self._sent = (book, dict.fromkeys(_ROWS, 0))
    sent, rows = self._sent[1], {}
    for name in _ROWS:
      kept = getattr(book, name)
      rows[name], sent[name] = (sent[name], kept[sent[name]:]), len(kept)
    scalars = {f.name: getattr(book, f.name) for f in dataclasses.fields(book) if f.name not in _ROWS}
    return dict(book=scalars, rows=rows, slices=learner.slices, slice_index=learner.slice_index,
                parts=tuple(p.kind for p in learner.parts), times=tuple(p.times for p in learner.parts),
                queued_steps=sum(p.steps for p in learner.parts),
                live_tokens=learner.parts.live_tokens(), pid=os.getpid(), processes=jax.process_count(),
                has_theta=learner.inbox is not None, owed_fragment=learner.owed_fragment(),
                live_bases=learner.live_bases(), leased=0 if learner.leased is None else learner.leased.leased)

  def revive(self, book: dict, now: float, status: str, theta: "Theta | None") -> tuple[None, dict]:
    """This new actor takes the place of one whose process ended: the learner's book as of its last answer, then
    failed as a lost slice fails it (no state, no parts, no slice; `status` DOWN, or FAILED), to rejoin from Θ; its
    programs compiled first for `theta`'s shapes, if given, on the slice it will rejoin on. A learner that had nothing
    to lose (down, stopped or absent) keeps its status (`status` ""). One call: an async actor's calls may run out of
    the order they were made in."""
    if theta is not None:
      self.warm_up(theta)
    self._learner.book = LearnerBook.restored(book)
    if status:
      self._learner.fail(now, status)
    return None, self.figures()

  def arm(self, how: str, *args, **kwargs) -> tuple[None, dict]:
    """The controller's arming of a crash, done in the injector the actor's programs check."""
    getattr(self._injector, how)(*args, **kwargs)
    return None, self.figures()

  def snapshot(self, treedefs: dict, with_state: bool | None = None) -> tuple[tuple[dict, dict[str, np.ndarray],
                                                                              dict[str, str]], dict]:
    """The learner's part of a checkpoint, packed here: its JSON, its arrays on the host, and the groups whose
    program failed (the controller's packer takes them in: snapshot.Packer.fetched); its state as Learner.snapshot
    says (`with_state`)."""
    packer = snapshot_lib.Packer(self._schedule, treedefs, messages.CODECS)
    saved = self._learner.snapshot(packer, with_state)
    arrays, failed = snapshot_lib.fetch(packer.groups)
    return (saved, arrays, failed), self.figures()

  def restore(self, saved: dict, arrays: dict[str, np.ndarray], failed: dict[str, str], treedefs: dict,
              theta: "Theta") -> tuple[None, dict]:
    """The learner as its checkpoint saw it, from the arrays its part names; the book's figures after."""
    unpacker = snapshot_lib.Unpacker(arrays, failed, self._schedule, treedefs, self._host, messages.CODECS)
    self._learner.restore(saved, unpacker, self._theta(theta))
    return None, self.figures()

  def hand_over(self) -> tuple[tuple, dict]:
    """The learner packed whole for a new actor that takes it over (`take_over`): its part of a checkpoint, with the
    kinds of its trees to unpack them by (its state's: a learner that reconfigures has one)."""
    state = self._learner.state
    treedefs = snapshot_lib.tree_kinds(state.params, state, self._learner.fragments)
    return (*self.snapshot(treedefs, with_state=True)[0], treedefs), self.figures()

  def take_over(self, carried: tuple, theta: "Theta", slices: tuple[int, ...]) -> tuple[None, dict]:
    """This new actor, made for `slices` (where its learner is placed), takes over the learner its old actor packed
    (`hand_over`): its programs compiled there first, as a revived actor's are; its state restored there, wherever
    it was (mid-reconfiguration its set still names the slice it lost, which no actor holds now); then moved onto
    `slices`, as a regroup in one process moves it (the same values: its arrays copied)."""
    saved, arrays, failed, treedefs = carried
    self.warm_up(theta)
    self.restore(saved, arrays, failed, treedefs, theta)
    return self.move_to(slices, regroup=True)

  def settle(self) -> tuple[None, dict]:
    """The run is over: one clean check program on the actor's slice, so an error token a crashed program left there
    is replaced now, not raised at the actor's exit (on a slice that never crashed it changes nothing)."""
    if self._injector is not None:
      self._injector.settle([self._devices])
    return None, self.figures()

  def _inbound(self, value: Any) -> Any:
    if isinstance(value, Delivery) and value.params is not None:
      return dataclasses.replace(value, params=self._theta(value.params))
    return self._theta(value) if isinstance(value, Theta) else value

  def _theta(self, theta: Theta) -> PyTree:
    """Θ from the object store, laid out on the host here as the syncer holds it (a gang's member: as NumPy)."""
    import ray  # pylint: disable=g-import-not-at-top
    theta = ray.get(theta.ref)
    return theta if self._host is None else jax.device_put(theta, self._host)

  @staticmethod
  def _outbound(result: Any) -> Any:
    if isinstance(result, Report):
      return dataclasses.replace(result, params=host_tree(result.params))
    if isinstance(result, RoundPart):  # its record
      return PartRecord(result.kind, result.steps, result.tokens, result.started_at, result.modeled_seconds,
                        result.queued_seconds)
    return result
