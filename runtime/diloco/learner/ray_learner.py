"""A learner in a Ray actor (`backend="ray"`): the actor owns its devices, train state, data stream, parts in flight,
report capture and fault injection; the controller keeps the clock, syncer, budget, rounds, membership and run log,
and reaches the learner through the same LearnerPort (runtime/diloco/learner/interface.py) as one in its process.

The actor runs the in-process Learner itself, so every program, batch and report is the one the in-process learner
would make: under the virtual clock a run is the same, bit for bit. Host values cross: Θ goes down as one `ray.put`
of NumPy arrays shared by reference by every learner it goes to (laid out on the actor's host device there, as the
syncer holds it), a report comes back as NumPy arrays, a part as its record. Each call returns the learner's book
figures with its result, so reading them costs no round trip.

What is built: learners of one slice or several (`slices_per_learner`: the actor holds its home slices' devices, one
group each, and shrinks, grows or restarts among them as in process) on simulated CPU devices, of one process each or
of several (a gang, `ray.processes_per_learner`: see ray_host.py; called, awaited and ended as one), both clocks
(under the real one a part's future is the actor's `part_done`, awaited off the actor's thread), crashes of a learner
or its slice (armed in the actor's own injector) and their rejoin (on the same slice, or a spare). A learner's process
that ends (killed by the injector, `ends=process`, or from outside) is a removed future: found where the learner has
to answer, it is read as the loss of its slice (`injection.ProcessLost`), and a new actor holding the learner's book
as of its last answer takes its place, down, to rejoin from Θ (the proxy keeps that book: each answer brings its
figures and the rows added since); under the real clock one that does not answer by its deadline is hung, and killed.
A spare slice gets a new actor made for the learner's slices: one down (of one slice, or restarting on several)
starts there from the book kept here; one that reconfigures and grows onto it is taken over there from its old actor,
its state carried as its part of a checkpoint (`regroup`). With the data service
(`data.assignment="service"`, also what lent slices use) the service stays here: a dispatch leases what the actor's
stream will take and sends it along (runtime/data/service.py, Grants); the learner's leases are kept here as well,
for a new actor to start from. A learner of lent capacity has an actor holding every slice it may be lent (one group
of devices each, compiled for at start under the real clock), on none of them until one is lent.
Compressed reports and Θ updates cross as their payloads' bytes, a fragment's Θ as its own put.
Checkpoints: the actor packs its learner's part and the controller's packer takes it in, so a killed driver's rerun
resumes with new actors.
"""

import atexit
import collections
import contextlib
import dataclasses
import os
import socket
import tempfile
import time
from typing import Any, Callable, Sequence

import jax

from runtime.checkpoint import snapshot as snapshot_lib
from runtime.config.fragment_plan import WHOLE
from runtime.config.run import RunConfig
from runtime.data.service import LeasedStream
from runtime.diloco.learner.book import LearnerBook
from runtime.diloco.learner.interface import Failure
from runtime.diloco.learner import parts as parts_lib
from runtime.diloco.learner.lifecycle import ABSENT, DONE, DOWN, STATE_LOST, WAITING
from runtime.diloco.learner.ray_host import LearnerHost, PartRecord, Theta, host_tree
from runtime.diloco.sync.messages import Delivery, Report
from runtime.errors import DataError
from runtime.faults import injection

PyTree = Any

# the calls that start its processes or compile (a longer deadline)
_COMPILING = ("joined", "warm_up", "revive", "take_over")
CALLS = collections.Counter()  # calls to learners' actors in this process, by method (a gang's once): launch.bench_ray


class _PartDone:
  """A part's future on the controller's side (real clock): the clock's waiter blocks on it as on a part's device
  arrays (jax.block_until_ready calls `block_until_ready` on it), and it returns when the part has finished in the
  actor, raising its device error if it failed, or its actor's death; a part not done by its deadline is a hang
  (`hung` kills the actor, whose death it then raises)."""

  def __init__(self, done: list[Any], deadline: float | None, hung: Callable[[str], None]):
    self._done = done  # the ObjectRefs of its actors' `part_done`
    self._deadline, self._hung = deadline, hung

  def block_until_ready(self) -> "_PartDone":
    _answer(self._done, self._deadline, lambda: self._hung(f"hung: its part not done in {self._deadline:.1f} s"))
    return self


def _answer(refs: list[Any], deadline: float | None, hung: Callable[[], None]) -> list[Any]:
  """The answers at `refs` (a learner's actors': the first death or error among them raised as soon as it is known);
  if they are not all in by the deadline (seconds), `hung()` kills the actors and their death is raised
  (RayActorError), as for ones that died."""
  import ray  # pylint: disable=g-import-not-at-top
  if len(refs) == 1:  # (one actor: one round trip)
    try:
      return [ray.get(refs[0], timeout=deadline)]
    except ray.exceptions.GetTimeoutError:
      hung()
      return [ray.get(refs[0])]
  pending, end = list(refs), None if deadline is None else time.monotonic() + deadline
  while pending:
    ready, pending = ray.wait(pending, timeout=None if end is None else max(0.0, end - time.monotonic()))
    if not ready:
      hung()
      ray.get(pending)
    ray.get(ready)
  return ray.get(list(refs))


class _Gang:
  """A learner's actors: one, or a gang of `ray.processes_per_learner` joined by jax.distributed (ray_host.join_gang),
  each with its share of the slice's devices; called together (the first's answer is the learner's), ended together."""

  def __init__(self, ray: Any, made: tuple, index: int, slices: tuple[int, ...], absent: bool):
    _, num_devices, run, stream = made
    if isinstance(stream, LeasedStream):  # (its leases as the controller's copy holds them now, granted from there on)
      stream = stream.remote()
    size = run.ray.processes_per_learner
    # (its share of the slices' simulated devices; under the virtual clock one process has as many as the
    # controller, of which it trains on its slices': XLA:CPU's one-device programs were seen computing other bits in
    # a process of 8 devices than of 2 or 4. Not under the real clock, where more devices' threads would contend for
    # the host's cores: docs/known_gaps.md)
    count = num_devices // size
    if size == 1 and run.clock.kind == "virtual":
      count = max(num_devices, jax.device_count())
    env = dict(XLA_FLAGS=f"--xla_force_host_platform_device_count={count}", JAX_PLATFORMS="cpu")
    actor = ray.remote(LearnerHost).options(num_cpus=0, runtime_env=dict(env_vars=env))
    coordinator = _free_loopback_address() if size > 1 else ""
    self._ray = ray
    self.members = [actor.remote(index, slices, made[0], num_devices, run, stream, absent, (rank, size, coordinator))
                    for rank in range(size)]

  def call(self, name: str, *args, **kwargs) -> list[Any]:
    CALLS[args[0] if name == "call" else name] += 1
    return [getattr(member, name).remote(*args, **kwargs) for member in self.members]

  def kill(self) -> None:
    for member in self.members:
      self._ray.kill(member, no_restart=True)


def _free_loopback_address() -> str:
  """host:port for a gang's coordinator (the local cluster's: gangs across hosts are not built)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return f"127.0.0.1:{s.getsockname()[1]}"


class ThetaPut:
  """Θ put in the object store once and shared by reference by every learner it goes to (the newest two, known by
  identity: the syncer hands each merged learner the same tree)."""

  def __init__(self):
    self._held: list[tuple[PyTree, Any]] = []  # (Θ, its reference): holding Θ keeps its identity its own
    self._whole: Any = None  # the reference of the newest Θ put whole (not one fragment's tensors)

  def newest(self) -> Theta | None:
    """The newest Θ put whole (None before the first): the shapes a new actor compiles for."""
    return None if self._whole is None else Theta(self._whole)

  def shared(self, theta: PyTree, whole: bool = True) -> Theta:
    """Θ's reference (put now, unless held); `whole`: all of Θ, not one fragment's tensors."""
    import ray  # pylint: disable=g-import-not-at-top
    ref = next((ref for held, ref in self._held if held is theta), None)
    if ref is None:
      ref = ray.put(host_tree(theta))
      self._held = [*self._held, (theta, ref)][-2:]
    if whole:
      self._whole = ref
    return Theta(ref)


class RayLearner:
  """The controller's side of a learner in an actor: a LearnerPort whose calls run there, in the order made.

  It keeps the learner's book as of the last answer. When the actor's process is found ended, the learner is lost:
  calls that need its devices raise `injection.ProcessLost` (read as its slice's loss; the controller crashes a lost
  learner after the event that found it), those of its book are answered from the copy kept here, and `fail` puts a
  new actor in its place (`_replaced`)."""

  def __init__(self, index: int, slices: tuple[int, ...], num_devices: int, run: RunConfig, stream: Any,
               puts: ThetaPut, absent: bool = False, join: bool = True):
    import ray  # pylint: disable=g-import-not-at-top
    self._ray, self._puts = ray, puts
    self.index, self.tokens_per_batch = index, stream.tokens_per_batch
    self._made = (slices, num_devices, run, stream)  # how its actor is made (again, if its process ends)
    # (data.assignment "service") its stream's leases, kept here as its actor's stream holds them: leased here from
    # the service with the call that needs them (`dispatch`), given back as the actor's answers show them given back
    self._leased = stream if isinstance(stream, LeasedStream) else None
    self._lent_capacity = absent  # (a learner of lent capacity: absent until a slice is lent to it)
    self._book, self._figures = LearnerBook(), {}
    self._lost: injection.ProcessLost | None = None  # its process found ended, until its crash is handled
    self._hung: tuple[Any, str] = (None, "")  # (an actor killed for a hang, why)
    # (real clock) deadlines: ray.hang_seconds and hang_factor, and its step time as last measured
    self._hang = (run.ray.hang_seconds, run.ray.hang_factor) if run.clock.kind == "real" else None
    self._step_seconds = 0.0
    self._starting: list[Any] | None = None  # a new gang's first call, not waited for when made
    self._notes: list[tuple[str, tuple, Callable]] = []  # calls that only move its book, made here (`_note`)
    # (its processes start in the background; a learner of lent capacity is on none of its slices until one is lent)
    self._actor = _Gang(ray, self._made, index, () if absent else slices, absent)
    self._joining: list[Any] | None = self._actor.call("joined")
    self._delivered: Delivery | None = None
    if join:
      self.join()

  def join(self) -> None:
    """Awaits its actor's first answer (the book as it starts), if not yet (`join_all`)."""
    if self._joining is not None:
      joining, self._joining = self._joining, None
      self._keep(self._answer(joining, "joined")[1])

  # The book's figures, as of the last answer
  status = property(lambda self: self._book.status)
  round = property(lambda self: self._book.round)
  tokens = property(lambda self: self._book.tokens)
  reports_out = property(lambda self: self._book.reports_out)
  total_steps = property(lambda self: self._book.total_steps)
  busy_seconds = property(lambda self: self._book.busy_seconds)
  completions = property(lambda self: self._book.completions)
  intervals = property(lambda self: self._book.intervals)
  slices = property(lambda self: tuple(self._figures["slices"]))
  slice_index = property(lambda self: self._figures["slice_index"])

  @property
  def inbox(self) -> Delivery | None:
    return self._delivered if self._figures["has_theta"] else None

  def process_lost(self) -> injection.ProcessLost | None:
    return self._lost

  pids = property(lambda self: self._figures["pids"])  # its actors' processes, as of the last answer
  processes = property(lambda self: self._figures["processes"])  # how many its programs run across (jax's count)

  def _keep(self, figures: dict) -> None:
    """An answer's book and figures: the book's fields, and the rows its lists gained (from where it says); the
    leases its stream gave back, given back to the service from the copy here."""
    for name, value in figures.pop("book").items():
      setattr(self._book, name, value)
    for name, (start, rows) in figures.pop("rows").items():
      getattr(self._book, name)[start:] = rows
    self._figures = figures
    if self._leased is not None and figures["leased"] != self._leased.leased:
      if figures["leased"] > self._leased.leased:
        raise DataError(f"learner {self.index}'s actor holds {figures['leased']} batches leased where the controller "
                        f"granted {self._leased.leased}")
      self._leased.give_back_from(figures["leased"])

  def _ask(self, name: str, *args, **kwargs) -> Any:
    """The actor's method `name` run with these arguments: its result, the book's figures kept. Raises ProcessLost
    once the actor's process is found ended (now, or before); a learner with nothing on its devices (down, stopped)
    is given a new process at once and asked there."""
    if self._lost is not None:
      raise self._lost
    notes, self._notes = self._notes, []
    try:
      if self._starting is not None:  # (answered before this call is made)
        starting, self._starting = self._starting, None
        self._keep(self._answer(starting, "revive")[1])
        for _, _, move in notes:  # (its answer holds the book as it was revived: the moves noted since, again)
          move()
      moves, carried = [note[:2] for note in notes], name in ("call", "dispatch", "collect")  # (see `_note`)
      if moves and not carried:
        self._keep(self._answer(self._actor.call("noted", moves), "noted")[1])
      sent = dict(kwargs, notes=moves) if moves and carried else kwargs
      result, figures = self._answer(self._actor.call(name, *args, **sent), args[0] if name == "call" else name)
    except self._ray.exceptions.RayTaskError as error:
      raise error.cause from None  # the learner's own error, as the controller handles it in process
    except self._ray.exceptions.RayActorError as error:
      hung = self._hung[1] if self._hung[0] is self._actor else ""
      self._lost = injection.ProcessLost(self.index, hung or injection.describe(error))
      if self.status not in (*STATE_LOST, ABSENT):
        raise self._lost from error
      self._replaced(0.0, "")
      return self._ask(name, *args, **kwargs)
    self._keep(figures)
    return result

  def _call(self, name: str, *args, **kwargs) -> Any:
    return self._ask("call", name, args, kwargs)

  def _note(self, name: str, *args: Any, book: Callable[[], None]) -> None:
    """The learner's method `name`, one that only moves its book (`book`: the same move, made here at once), carried
    with its next call (its call, dispatch or collect, which make the moves first, in order; else `noted` first)."""
    book()
    if self._lost is None:
      self._notes.append((name, args, book))

  def _answer(self, refs: list[Any], name: str) -> tuple[Any, dict]:
    """The answer to the actors' call `name` (the first's result and figures, with every actor's process id): by its
    deadline (real clock), or the actors are killed for a hang."""
    deadline = None
    if self._hang is not None:
      deadline = self._hang[0] * (self._hang[1] if name in _COMPILING else 1.0)
    actor = self._actor
    answers = _answer(refs, deadline, lambda: self._kill(actor, f"hung: no answer to {name} in {deadline:g} s"))
    return answers[0][0], dict(answers[0][1], pids=tuple(figures["pid"] for _, figures in answers))

  def _kill(self, actor: "_Gang", why: str) -> None:
    """Kills its hung actors (unless replaced since), their loss to say `why` (also called on the clock's thread)."""
    if actor is self._actor:
      self._hung = (actor, why)
      actor.kill()

  def _or_book(self, answer: Callable[[], Any], name: str, *args, reads: bool = False) -> Any:
    """The learner's method `name`, or once its process is found ended, `answer()` from its book as last known (the
    calls of the controller's loops over learners: a lost learner is crashed after the event, not in the middle). A
    pure read (`reads`) is answered so too while a new actor is starting: the controller does not wait for it."""
    if self._lost is None and not (reads and self._starting is not None  # (a new actor's first call unanswered)
                                   and len(self._ray.wait(self._starting, num_returns=len(self._starting),
                                                          timeout=0)[0]) < len(self._starting)):
      try:
        return self._call(name, *args)
      except injection.ProcessLost:
        pass
    return answer()

  def _replaced(self, now: float, status: str, detail: str = "") -> Failure:
    """A new actor takes the lost one's place, holding the learner's book as of its last answer; `status` (DOWN or
    FAILED) fails it there as a lost slice fails a learner (or "": it had nothing to lose). What its loss cost: its
    parts in flight and what it trained since its last report, as in process (Learner.fail), with `detail`."""
    book, figures = self._book, self._figures
    failure = Failure(figures["slice_index"], detail, figures["live_tokens"] + book.unreported_tokens(),
                      book.unreported_busy)
    placed = bool(status)  # (on its slice until it fails there: its programs compile first; lent capacity: the one
    # lent to it, of those its actor holds)
    where = tuple(figures["slices"]) if self._lent_capacity else self._made[0]
    self._new_actor(where if placed else (), now, status, self._puts.newest() if placed else None)
    self._lost = None
    if status:  # (the new actor books the same move; its answer is awaited at the next call)
      book.set_status(f"learner {self.index}", status, now)
      self._figures = dict(figures, slices=(), slice_index=-1, parts=(), times=(), queued_steps=0, live_tokens=0,
                           has_theta=False)
    return failure

  def _new_actor(self, slices: tuple[int, ...], now: float, status: str, theta: Theta | None,
                 groups: list[list[Any]] | None = None) -> None:
    """The learner's actor (all of a gang: one only unavailable might come back, and the others are lost with it)
    ended, and a new one made on `slices` (or none) revived there from the book kept here: failed with `status`, or
    kept (""), its programs compiled for `theta` first if given (with `groups`: on a new set it holds, `_remade`).
    Its answer is awaited at the next call."""
    self._remade(slices, groups)
    self._starting = self._actor.call("revive", self._book.snapshot(), now, status, theta)

  def _remade(self, slices: tuple[int, ...], groups: list[list[Any]] | None = None) -> None:
    """Its actor ended and a new one made on `slices` (of those it holds, or with `groups`, each slice's devices:
    the new set it holds from now on)."""
    if groups is not None:
      self._made = (tuple(slices), sum(len(group) for group in groups), *self._made[2:])
    self._actor.kill()
    self._actor = _Gang(self._ray, self._made, self.index, tuple(slices), False)
    self._notes = []  # (the new actor starts from the book here, which made them)

  def arm(self, how: str, *args, **kwargs) -> None:
    """Arms (or disarms) a crash in the actor's injector. A lost process has no program to arm; a new one starting
    has nothing armed, and arms nothing before its first part, which waits for it."""
    if self._lost is None and not (how == "disarm" and self._starting is not None):
      self._ask("arm", how, *args, **kwargs)

  def settle(self) -> None:
    if self._lost is None:
      with contextlib.suppress(injection.ProcessLost):  # (the run is over: a dead process has nothing to settle)
        self._ask("settle")

  # Parts in flight
  def parts_in_flight(self) -> int:
    return len(self._figures["parts"])

  def steps_in_flight(self) -> int:
    return self._figures["queued_steps"]

  def newest_part(self) -> str:
    return self._figures["parts"][-1] if self._figures["parts"] else ""

  def resume_kind(self) -> str:
    return self._figures["parts"][0] if self._figures["parts"] else ""

  def has_theta(self) -> bool:
    return self._figures["has_theta"]

  def parts_end_at(self, seconds_per_step: float) -> float:
    if self._lost is not None:  # (its parts went with its process)
      raise self._lost
    return parts_lib.ends_at(self._figures["times"], seconds_per_step)  # (as of the last answer: Learner's sum)

  def seconds_per_step(self, part: PartRecord) -> float:
    """As measured when the part was collected (its record carries it); kept: its parts' deadlines follow it."""
    self._step_seconds = part.step_seconds
    return self._step_seconds

  def needs_theta_at(self, now: float, seconds_per_step: float) -> float:
    kinds = () if self._lost is not None else self._figures["parts"]  # (a lost process's parts went with it)
    return parts_lib.needs_theta_at(kinds, self._figures["times"], now, seconds_per_step)

  def busy_fraction(self, now: float) -> float:
    return self._book.busy_fraction(now)  # (its book's: Learner.busy_fraction)

  def device_idle(self) -> float:
    return self._or_book(lambda: float("nan"), "device_idle", reads=True)

  def dispatch(self, kind: str, steps: int, now: float, modeled_seconds: float, armed: bool = False,
               schedule_at: int | None = None, ahead: int | None = None) -> PartRecord:
    grant = None
    if self._leased is not None:  # what its stream will lease, leased here first (one round trip more)
      ahead, through = self._call("data_through", kind, steps, now, ahead)
      grant = self._leased.lease_through(through)
    part = self._ask("dispatch", kind, steps, now, modeled_seconds, armed=armed, schedule_at=schedule_at, ahead=ahead,
                     grant=grant)
    if part.serial < 0:
      return part
    # (its steps and those queued ahead of it at its measured step time: no deadline before one is measured)
    seconds, factor = self._hang
    deadline = seconds + factor * self._figures["queued_steps"] * self._step_seconds if self._step_seconds else None
    actor = self._actor
    return dataclasses.replace(part, future=_PartDone(self._actor.call("part_done", part.serial), deadline,
                                                      lambda why: self._kill(actor, why)))

  def collect(self, now: float) -> PartRecord:
    return self._ask("collect", now)

  # Reports up, Θ down
  def corrupt_next_report(self, how: str) -> None:
    self._call("corrupt_next_report", how)

  def capture_report(self) -> None:
    self._call("capture_report")

  def report(self, now: float) -> Report:
    return self._call("report", now)

  def report_sent(self, report: Report) -> None:
    report = dataclasses.replace(report, params=None)  # (its book reads the counts only)
    self._note("report_sent", report, book=lambda: self._book.sent(report))

  def report_settled(self, report: Report, merged: bool) -> None:
    report = dataclasses.replace(report, params=None)
    self._note("report_settled", report, merged, book=lambda: self._book.settled(report, merged))

  def owed_fragment(self) -> int:
    return self._figures["owed_fragment"]  # (as of the last answer: read at every event, it costs no round trip)

  def live_bases(self) -> tuple[tuple[int, int], ...]:
    return tuple(self._figures["live_bases"])

  def theta_landing(self) -> Callable[[PyTree], Any] | None:
    return None  # (the actor lays Θ out itself when it adopts it)

  def deliver(self, delivery: Delivery) -> bool:
    params = None if delivery.params is None else self._puts.shared(delivery.params, delivery.fragment == WHOLE)
    kept = self._call("deliver", dataclasses.replace(delivery, params=params, placed=None))
    if kept:
      self._delivered = delivery
    return kept

  def adopt(self, now: float) -> int:
    return self._call("adopt", now)

  # Its status, when nothing runs
  def finish(self, now: float) -> None:
    self._note("finish", now, book=lambda: self._book.set_status(f"learner {self.index}", DONE, now))

  def wait(self, now: float) -> None:
    self._note("wait", now, book=lambda: self._book.set_status(f"learner {self.index}", WAITING, now))

  def reconfigure(self, now: float) -> None:
    self._call("reconfigure", now)

  def await_repair(self, now: float) -> None:
    self._call("await_repair", now)

  # Placement, failure and return (the actor's devices are its home slices': each slice's its own group of them)
  def move_to(self, slices: int | tuple[int, ...], devices: list) -> None:
    self._held_by_actor(slices, devices, 0.0)
    self._ask("move_to", slices)

  def _held_by_actor(self, slices: int | tuple[int, ...], devices: list, now: float) -> None:
    """Its actor holds `slices`' devices (one slice's devices, or each slice's): those of its own slices, or for a
    spare (whose devices another actor would hold), a new actor made for it takes the learner, its book carried
    over: the learner has nothing on devices then (down before a rejoin, or not yet restored)."""
    if isinstance(slices, int):
      slices, devices = (slices,), [devices]
    if not set(slices) <= set(self._made[0]):
      self._new_actor(tuple(slices), now, "", self._puts.newest(), devices)

  def warm_up(self, theta_host: PyTree, host_sharding: Any, where: tuple | None = None) -> None:
    del host_sharding  # (the actor's own host)
    self._ask("warm_up", self._puts.shared(theta_host), None if where is None else where[0])

  def reset(self, theta_host: PyTree, version: int, now: float) -> None:
    self._call("reset", self._puts.shared(theta_host), version, now)

  def regroup(self, slices: tuple[int, ...], groups: list[list[Any]]) -> None:
    """Onto another set of its slices, its state with it: in its actor, or, growing onto a slice its actor does not
    hold (a spare), in a new actor made for the set, which takes the learner over from the old one (its part of a
    checkpoint, carried through the controller): the same bits as a regroup in one process. The old actor ends
    first (a slice's devices are one process's); should either be found ended, the learner is lost as a slice is."""
    if set(slices) <= set(self._made[0]):
      self._ask("move_to", slices, regroup=True)
      return
    carried = self._ask("hand_over")
    self._remade(slices, groups)
    self._ask("take_over", carried, self._puts.newest(), tuple(slices))

  def fail(self, now: float, status: str = DOWN) -> Failure:
    """Its slice failed: in its actor as in process; a lost process is replaced (`_replaced`), its loss named in the
    failure's detail if found here (else the crash's cause names it)."""
    found = ""
    if self._lost is None:
      try:
        return self._call("fail", now, status)
      except injection.ProcessLost as lost:
        found = f", {lost}"
    return self._replaced(now, status, found)

  def lose_part(self, now: float) -> Failure:
    return self._call("lose_part", now)

  def leave(self, now: float) -> Failure:
    """It leaves its lent slice, as in process; a lost process is replaced first (`_replaced`, as `fail` does: what
    the loss cost), and the new actor, down, leaves."""
    found = ""
    if self._lost is None:
      try:
        return self._call("leave", now)
      except injection.ProcessLost as lost:
        found = f", {lost}"
    failure = self._replaced(now, DOWN, found)
    self._call("leave", now)
    return failure

  def rejoin(self, slice_index: int | tuple[int, ...], devices: list[Any], theta_host: PyTree, version: int,
             now: float) -> None:
    """Back on its slice, or on a spare (in a new actor: `_held_by_actor`)."""
    self._held_by_actor(slice_index, devices, now)
    self._ask("rejoin", slice_index, self._puts.shared(theta_host), version, now)

  def give_back_unreported(self) -> None:
    self._or_book(lambda: None, "give_back_unreported")
    if self._leased is not None:  # (a lost process's leases: the copy here is the one a new actor starts from)
      self._leased.give_back_from(self._book.reported_position["position"])

  def join_schedule(self, total_steps: int) -> None:
    self._call("join_schedule", total_steps)

  def served(self, start: int, end: int) -> Any:
    return self._leased.serials(start, end)  # (the copy here: Learner.served)

  def leases(self) -> list[int]:
    return self._leased.snapshot() if self._leased is not None else []

  # Checkpoints: the actor packs its part, the controller's packer takes it in under the learner's own keys
  def snapshot(self, packer: snapshot_lib.Packer, with_state: bool | None = None) -> dict:
    saved, arrays, failed = self._ask("snapshot", packer.treedefs, with_state)
    return packer.fetched(saved, arrays, failed, prefix=f"learner{self.index}:")

  def restore(self, saved: dict, unpacker: snapshot_lib.Unpacker, theta_host: PyTree) -> None:
    if self._leased is not None:
      self._leased.restore_leases(saved["leases"])
    self._ask("restore", saved, unpacker.arrays_named(saved), unpacker.failed, unpacker.treedefs,
              self._puts.shared(theta_host))
    self._delivered = unpacker.value(saved["inbox"])  # (its Θ, should it have to go again)

  def close(self) -> None:
    """Its data stream stops; the actor answers for its book until the last handle to it goes (Ray ends it then). An
    actor already gone has nothing to stop (the run's own error, if any, is the one raised)."""
    self._or_book(lambda: None, "close")


def join_all(learners: Sequence[Any]) -> None:
  """Awaits the first answer of each learner in an actor, made with `join=False`: their processes, started together,
  start side by side (Python, JAX and the learner each), not one after another."""
  for learner in learners:
    if isinstance(learner, RayLearner):
      learner.join()


class RemoteArming:
  """The controller's fault injector under backend "ray": arming a learner's crash arms it in that learner's actor,
  whose programs check it there."""

  def __init__(self, learners: list[RayLearner]):
    self._learners = learners

  def arm(self, learner: int, step: int | None, ends: str = "program") -> None:
    self._learners[learner].arm("arm", learner, step, ends=ends)

  def arm_next(self, learner: int, ends: str = "program") -> None:
    self._learners[learner].arm("arm_next", learner, ends=ends)

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
