"""A learner: one slice's mesh, data shard, parameters and inner AdamW state, and its rounds.

A round is the learner's work between two receipts of Θ: H inner steps (H/P with P fragments, each report then
carrying one fragment: runtime/config/fragment_plan.py), dispatched as a main part of H − τ steps that ends in a
report, and an overlap part of τ steps that trains while the report syncs. Θ of one fragment replaces (carry, mix,
overwrite) that fragment's tensors only: the others keep their local progress; Θ whole replaces them all.
The learner keeps its own bookkeeping in its book (runtime/diloco/learner/book.py: tokens and steps since Θ, where
its data stands, what it has reported) and its device state itself; the controller only asks it to dispatch,
collect, report, adopt Θ, fail and rejoin.
"""

from typing import Any, Callable

import jax
import numpy as np

from runtime.data import shards as data_lib
from runtime.checkpoint import snapshot as snapshot_lib
from runtime.train import tree_transfer
from runtime.config.run import RunConfig
from runtime.data.service import LeasedStream
from runtime.diloco.learner import placement as placement_lib
from runtime.diloco.learner.interface import Failure
from runtime.diloco.learner import receive as receive_lib
from runtime.diloco import round_plan
from runtime.diloco.round_plan import MAIN, OVERLAP
from runtime.diloco.sync.fragment_trees import LearnerFragments
from runtime.diloco.learner.book import LearnerBook
from runtime.diloco.learner.lifecycle import (ABSENT, DONE, DOWN, FAILED, HOLDING_STATE, NOT_SAVED, RECONFIGURING,
                                              STATE_LOST, TRAINING, WAITING)
from runtime.diloco.sync.messages import Delivery, Report
from runtime.diloco.sync.syncer import Syncer
from runtime.diloco.learner.parts import PartQueue, RoundPart
from runtime.diloco.learner.report_capture import ReportCapture
from runtime.faults import injection
from runtime.config.fragment_plan import WHOLE
from runtime.train.programs import TrainState, schedule_to
from runtime.data.staging import Stager
from runtime.wire.downlink import NO_MIRROR, Downlink
from runtime.wire.uplink import Uplink

PyTree = Any


class Learner:
  """The in-process learner (interface.py's LearnerPort): owns one slice (or several); all device work is dispatched
  asynchronously and awaited only in `collect`, its parts in flight oldest first (runtime/diloco/learner/parts.py)."""

  def __init__(self, index: int, slice_index: int, devices: list[jax.Device], run: RunConfig,
               stream: data_lib.ShardIterator | LeasedStream, injector: injection.Injector | None = None,
               absent: bool = False):
    self.index, self.run, self.injector = index, run, injector
    self.tokens_per_batch = stream.tokens_per_batch
    self._data = Stager(stream, run.data.prefetch, str(index))
    self.leased = stream if isinstance(stream, LeasedStream) else None  # data from the service, leased ahead
    self._placements = placement_lib.Placements(index, run, injector)  # slices -> mesh, programs there
    self.slices, self.slice_index = (), -1  # the slices it trains on (none while it has none), and the first
    if slice_index != -1:
      self.move_to(slice_index, devices)
    self.book = LearnerBook(status=ABSENT if absent else WAITING, round_start=self._data.position,
                            reported_position=self._data.position)  # (absent: of lent capacity, until lent a slice)
    self.state: TrainState | None = None
    self.parts = PartQueue()  # in flight, oldest first
    self.inbox: Delivery | None = None  # received but not yet adopted (the learner was busy)
    self.fragments = LearnerFragments(run.fragments)
    self._at_report: Any = None  # θ on the slice when the last report was taken (receive == "carry")
    self.uplink = Uplink(run.compression) if run.compression.up != "none" else None  # compressed reports
    self.downlink = Downlink(run.compression) if run.compression.down != "none" else None  # compressed Θ
    self._capture = ReportCapture(  # the report taken before the part behind its part
        self.uplink, run.fragments, stage=tree_transfer.route(run.host_transfers) == "pinned")

  # The book's figures that the controller reads (see LearnerBook), and where a joining learner's schedule stands
  status = property(lambda self: self.book.status)
  round = property(lambda self: self.book.round)
  base_version = property(lambda self: self.book.base_version)
  tokens = property(lambda self: self.book.tokens)
  reports_out = property(lambda self: self.book.reports_out)
  completions = property(lambda self: self.book.completions)
  intervals = property(lambda self: self.book.intervals)
  total_steps = property(lambda self: self.book.total_steps)
  busy_seconds = property(lambda self: self.book.busy_seconds)
  inflight = property(lambda self: self.parts[0] if self.parts else None)  # the oldest part in flight
  device = property(lambda self: self.parts.device)  # when its parts ran
  # With overlap steps a main part copies its (whole, uncompressed) report itself: see ReportCapture
  _main_copies = property(lambda self: self._capture.by_part and self.run.overlap_steps > 0)

  def parts_in_flight(self) -> int:
    return len(self.parts)

  def steps_in_flight(self) -> int:
    """Inner steps of its parts in flight, void ones too: where its next part's steps start past `total_steps`."""
    return sum(part.steps for part in self.parts)

  def resume_kind(self) -> str:
    """The kind of its oldest part in flight ("" if none): what it resumes after a reconfiguration."""
    return self.parts[0].kind if self.parts else ""

  def has_theta(self) -> bool:
    """Θ was delivered and waits in its inbox to be adopted."""
    return self.inbox is not None

  def newest_part(self) -> str:
    """The kind of its newest part in flight ("" if none): what the round plan continues from."""
    return self.parts[-1].kind if self.parts else ""

  def seconds_per_step(self, part: RoundPart) -> float:
    """The time one inner step of its collected part took: modeled, or as its device ran it."""
    return (part.modeled_seconds or self.parts.device.last_seconds) / part.steps

  def busy_fraction(self, now: float) -> float:
    return self.book.busy_fraction(now)

  def served(self, start: int, end: int) -> Any:
    """The data service's serials of its batches [start, end) (data.assignment "service")."""
    return self.leased.serials(start, end)

  def leases(self) -> list[int]:
    """The serials it holds leased from the data service."""
    return self.leased.snapshot() if self.leased is not None else []

  def process_lost(self) -> Exception | None:
    return None  # (it lives in the controller's process: its slice's loss is a device error)

  def device_idle(self) -> float:
    """The share of its active span in which its device had no program of its own (see DeviceTimeline)."""
    return self.parts.device.idle_fraction(self.book.intervals, (self.book.status, self.book.state_since))

  # Placement ---------------------------------------------------------------------------------------

  def move_to(self, slices: int | tuple[int, ...], devices: list) -> None:
    """Binds the learner to one slice (an index and its devices) or several (a tuple, and each one's devices): its
    mesh, shardings and round program, compiled once per slice set it uses."""
    slices, groups = (slices, devices) if isinstance(slices, tuple) else ((slices,), [devices])
    where = self._placements.at(slices, groups)
    self.slices, self.slice_index = slices, slices[0]
    self.mesh, self.param_sharding, self.batch_sharding = where.mesh, where.param_sharding, where.batch_sharding
    self._round_program, self._report_program = where.round_program, where.report_program
    self._init, self._keeps_state = where.init, where.keeps_state

  def regroup(self, slices: tuple[int, ...], groups: list[list[jax.Device]]) -> None:
    """Moves the learner of several slices, its state with it, onto another set of them (one lost, or one back)."""
    self.move_to(slices, groups)
    move = lambda tree: None if tree is None else placement_lib.moved(tree, self.mesh)
    self.state, self._at_report = move(self.state), move(self._at_report)
    if self.uplink:  # the Θ its outer gradient is measured from, and its residual, live on its slices too
      self.uplink.move(move)

  def reset(self, theta_host: PyTree, version: int, now: float) -> None:
    """Starts from Θ with fresh inner optimizer state (initial start, rejoin, quarantine); its step count stands after
    the parts in flight (adopted behind them: they are void, and book their steps when collected)."""
    params = tree_transfer.copy_to(theta_host, self.param_sharding)
    self.fragments.bind(theta_host)
    if self.downlink:
      self.downlink.hold(theta_host, version)
    if self.uplink:
      self.uplink.start(params)
    self.state = self._init(params, self.book.total_steps + self.steps_in_flight())
    self._new_round(version, now)

  def warm_up(self, theta_host: PyTree, host_sharding: jax.sharding.Sharding, where: tuple | None = None) -> None:
    """Compiles its programs before its first part (placement.warm_up) on its slices, or `where` (slices, devices) it
    may train later: a slice it may be lent, or its own less one it may lose. Touches none of its state or data."""
    placement_lib.warm_up(self._placements.at(*where) if where else self._placements.at(self.slices, ()),
                          theta_host, host_sharding, self.run, self.tokens_per_batch // self.run.data.seq_len,
                          self._main_copies)

  # Rounds -----------------------------------------------------------------------------------------

  def dispatch(self, kind: str, steps: int, now: float, modeled_seconds: float, armed: bool = False,
               schedule_at: int | None = None, ahead: int | None = None) -> RoundPart:
    """Enqueues `steps` inner steps as one device program and returns at once (may raise: a device error unless
    `armed`, an injected program bug always).

    A program `armed` to crash may fail as it is enqueued (XLA:CPU runs small programs inline when their inputs
    are ready) or later; either way its error is raised where it is awaited, so the run never depends on which.
    A part of a length no program was compiled for runs as several (round_plan.chunks). `ahead`: the steps of the
    part to stage next, if the caller plans them (else the round plan's, from the part's kind).
    """
    ahead, through = self.data_through(kind, steps, now, ahead)
    if self.leased is not None:
      self.leased.lease_through(through)
    staged = self._data.take(round_plan.chunks(self.run, steps), self.batch_sharding)
    self._move(TRAINING, now)
    if schedule_at is not None:  # the inner schedule follows the run's progress (inner.schedule_progress="run")
      self.state = schedule_to(self.state, np.int32(schedule_at))
    failure, before = "", (self.state, staged.start) if self._keeps_state else None
    copies = self._main_copies and (kind == MAIN or steps == round_plan.main_steps(self.run))  # (one per length)
    try:
      state, metrics, report = self._run_pieces(staged.pieces, copies)
    except jax.errors.JaxRuntimeError as error:
      if not armed:
        raise
      state, metrics, failure, report = None, None, injection.describe(error), []
    part = RoundPart(kind, steps, staged.tokens, now, modeled_seconds, state, metrics, failure,
                     self.parts.queued_seconds(now, modeled_seconds))
    self.parts.push(part, before)
    self.state = state
    self._capture.hold(state, report if kind == MAIN else [])
    self._data.stage_ahead(round_plan.chunks(self.run, ahead), self.batch_sharding)
    return part

  def data_through(self, kind: str, steps: int, now: float, ahead: int | None = None) -> tuple[int, int]:
    """What a dispatch of this part stages next and needs leased: (the steps of the part staged after it, if the
    caller plans none: the round plan's, from the part's kind; the batches [0, n) its stream must be able to serve:
    this part, the one staged after it, and what the prefetcher reads ahead). Raises the learner's program bug due by
    `now` first, as its dispatch would (before anything is leased)."""
    if self.injector is not None:
      self.injector.check_program(self.index, now)
    if ahead is None:
      ahead = round_plan.staged_after(self.run, kind, self.has_theta())
    return ahead, self._data.position["position"] + steps + ahead + self.run.data.prefetch + 2

  def _run_pieces(self, pieces: tuple[jax.Array, ...], copies: bool) -> tuple[TrainState, dict, list]:
    """Enqueues the part's programs, one per piece of its batches, the last copying the report if `copies`: the
    state they end in, their per-step metrics (piece i's under "<name>.<i>" after the first's), and the report."""
    state, metrics, report = self.state, {}, []
    for i, batches_HxBxT in enumerate(pieces):
      program = self._report_program if copies and i == len(pieces) - 1 else self._round_program
      state, piece_metrics, *report = program(state, batches_HxBxT)
      metrics.update({f"{name}.{i}" if i else name: value for name, value in piece_metrics.items()})
    return state, metrics, report

  def collect(self, now: float) -> RoundPart:
    """Awaits the oldest part in flight (raising the device error if it failed) and books its work; `now`: when its
    program finished."""
    part = self.parts[0]
    loss_H = _awaited(part)
    _, device_seconds, void = self.parts.pop(now)
    busy = part.modeled_seconds if part.modeled_seconds else device_seconds
    self.book.collected(part.steps, part.tokens, busy, len(self.slices), float(loss_H.mean()), now, void=void)
    return part

  def parts_end_at(self, seconds_per_step: float) -> float:
    """When its parts in flight will have finished: modeled, or estimated from a typical step time."""
    return self.parts.ends_at(seconds_per_step)

  def needs_theta_at(self, now: float, seconds_per_step: float) -> float:
    """When the learner will wait for Θ: the end of its last overlap part in flight (now, if it is waiting)."""
    return self.parts.needs_theta_at(now, seconds_per_step)

  # Reports and Θ ----------------------------------------------------------------------------------

  def corrupt_next_report(self, how: str) -> None:
    self.book.corrupt_next = how

  def capture_report(self) -> None:
    """Takes the report's tensors on the slice, before the next part is enqueued behind the part that ends in it
    (that part donates them): θ_m's next fragment copied there (or quantized there); nothing waits."""
    how, self.book.corrupt_next = self.book.corrupt_next, ""
    local = self.fragments.part(self.state.params, 0 if self.fragments.num == 1 else self.fragments.next())
    copied = self._capture.take(local, how, self.state, copy=self.run.overlap_steps > 0)
    if self.run.overlap_steps and self.run.outer.receive == "carry":  # (the next round donates the state's buffers)
      self._at_report = copied if copied is not None else tree_transfer.fresh_copy(local)

  def report(self, now: float) -> Report:
    """θ_m (its next fragment's tensors, on its slice: the merge worker copies them to the host) and what it was
    trained on since Θ."""
    if not self._capture.taken:
      self.capture_report()
    params, payload = self._capture.send()
    book = self.book
    fields = self.fragments.report(book.base_version, book.total_tokens, book.total_steps)
    return Report(self.index, params, book.tokens, book.steps, loss=book.last_loss, sent_at=now, **fields,
                  data_start=book.round_start, data_end=self._trained_through(), busy_seconds=book.unreported_busy,
                  round=book.round, total_steps=book.total_steps, payload=payload,
                  base_mirror=self.downlink.key[0] if self.downlink else NO_MIRROR)

  def _trained_through(self) -> dict:
    """The data position its finished work ends at: a report's data ends there, not after the parts queued behind
    its main part (their data is the next round's: trained again if their work is written off)."""
    position = self._data.position
    return dict(position, position=position["position"] - self.parts.live_steps())

  def live_bases(self) -> tuple[tuple[int, int], ...]:
    """The Θ it works from as its reports name them, (mirror, version): its base, or each fragment's."""
    mirror = self.downlink.key[0] if self.downlink else NO_MIRROR
    versions = (self.book.base_version,) if self.fragments.num == 1 else tuple(self.fragments.versions)
    return tuple((mirror, v) for v in versions)

  def owed_fragment(self) -> int:
    """The fragment of its outstanding report, or of the report it trains toward."""
    return self.fragments.owed(self.book.reports_out)

  def report_sent(self, report: Report) -> None:
    """The report is on its way: its data counts as reported until the syncer answers."""
    self.book.sent(report)

  def report_settled(self, report: Report, merged: bool) -> None:
    """The syncer merged or quarantined the report; a quarantined report's data is trained again."""
    self.book.settled(report, merged)

  def theta_landing(self) -> Callable[[PyTree], tuple[Any, PyTree] | None] | None:
    """For the merge worker: lays a Θ out on the slices the learner trains on now, or gives None if their devices
    failed meanwhile (None: it has no slices). What it returns rides in the Delivery's `placed`; `adopt` uses it
    only if the learner is still where it was laid out, else copies Θ itself."""
    if not self.slices:
      return None
    sharding = self.param_sharding  # (read here, on the controller's thread)

    def land(theta: PyTree) -> tuple[Any, PyTree] | None:
      try:
        return sharding, jax.block_until_ready(tree_transfer.copy_to(theta, sharding))
      except jax.errors.JaxRuntimeError:
        return None

    return land

  def deliver(self, delivery: Delivery) -> bool:
    """Keeps Θ for adoption unless the learner is down or has moved past the round it answers."""
    if self.book.status in (DOWN, ABSENT, FAILED) or delivery.round != self.book.round:
      return False
    self.inbox = delivery
    return True

  def adopt(self, now: float) -> int:
    """Adopts the Θ in the inbox; returns the tokens written off (trained on but never reported).

    Overlap steps trained since the report are kept (outer.receive "carry": their progress is added onto Θ;
    "mix": θ ← (1−α)·Θ + α·θ) and reach Θ in the next report, or thrown away ("overwrite": their data is
    served again). A quarantined or lost report's data is served again from its start.
    """
    delivery, receive, self.inbox = self.inbox, self.run.outer.receive, None  # taken, adopted or not
    if delivery.fragment != WHOLE:
      return self._adopt_fragment(delivery, now)
    theta_host = self.downlink.receive(delivery) if self.downlink else delivery.params  # may raise CorruptPayload
    unreported = self.book.unreported_tokens() + self.parts.live_tokens()  # overlap steps after the report
    keep = bool(unreported) and receive != "overwrite" and delivery.rewind_to is None and not delivery.reset
    keep = keep and self.fragments.num == 1  # (with fragments, Θ comes whole only to start afresh from it)
    written_off = 0
    if delivery.rewind_to is not None:
      self._data.restore(delivery.rewind_to)
      written_off = unreported
    elif unreported and not keep:
      self._data.restore(self.book.reported_position)  # overlap steps were overwritten: serve their data again
      written_off = unreported
    if not keep:  # the parts in flight train on what Θ replaces: their work is written off with the rest
      self.parts.void_all()
    if delivery.reset:
      self.reset(delivery.params, delivery.version, now)
      return written_off
    placed = delivery.placed
    theta = (placed[1] if placed and placed[0] is self.param_sharding  # the merge worker laid it out already
             else tree_transfer.copy_to(theta_host, self.param_sharding))
    if self.uplink:  # a lost report's residual goes with its work
      self.uplink.start(theta, keep_residual=delivery.rewind_to is None)
    theta = receive_lib.taken(receive, theta, self.state.params, self._at_report, self.run.outer.mix_alpha,
                              may_carry=keep, may_mix=delivery.rewind_to is None)  # (rewound work is trained again)
    self.state = self.state.replace(params=theta)
    self._new_round(delivery.version, now, carried=keep)
    return written_off

  def _adopt_fragment(self, delivery: Delivery, now: float) -> int:
    """Θ of one fragment replaces that fragment's tensors (overlap progress carried or mixed in per outer.receive);
    the overlap steps' work stays in the others and opens the new round: none is written off."""
    p, receive = delivery.fragment, self.run.outer.receive
    theta = tree_transfer.copy_to(delivery.params, self.fragments.part(self.param_sharding, p))
    theta = receive_lib.taken(receive, theta, self.fragments.part(self.state.params, p), self._at_report,
                              self.run.outer.mix_alpha, may_carry=self._at_report is not None, may_mix=True)
    self.state = self.state.replace(params=self.fragments.put(self.state.params, theta, p))
    self._new_round(delivery.version, now, carried=True, fragment=p)
    return 0

  def _new_round(self, version: int, now: float, carried: bool = False, fragment: int = WHOLE) -> None:
    """Θ (of `fragment`) was adopted; carried overlap work (its tokens, steps, slice time and data) opens the new
    round."""
    self.fragments.received(fragment, version, self.book.total_tokens, self.book.total_steps)
    self.book.new_round(version, self._data.position, carried)
    self._at_report = None
    self.inbox = None
    self._move(WAITING, now)

  # Failure and return -----------------------------------------------------------------------------

  def fail(self, now: float, status: str = DOWN) -> Failure:
    """The learner's slice failed (or its program, `status` FAILED): its future is dropped, its unreported work is
    lost, and it leaves the slice."""
    detail = self._await_inflight(now)
    lost = self.parts.live_tokens()  # (void parts' tokens are written off already)
    self.parts.clear()
    self._capture.drop()
    failure = Failure(self.slice_index, detail, lost + self.book.unreported_tokens(), self.book.unreported_busy)
    self.inbox, self.state = None, None  # its device state is gone with its slice (as a restored learner's is)
    self._move(status, now)
    self.slices, self.slice_index = (), -1
    return failure

  def lose_part(self, now: float) -> Failure:
    """One of its several slices failed and it reconfigures: only the part in flight is lost (its data is served
    again); the learner keeps the state it had before that part, its round and what it trained since Θ."""
    detail = self._await_inflight(now)
    part, before = self.inflight, self.parts.before  # (a learner of several slices runs one part at a time)
    self.parts.clear()
    if part is not None:
      self.state, start = before
      self._data.restore(start)
    self._move(RECONFIGURING, now)
    lost_seconds = (now - part.started_at) * len(self.slices) if part else 0.0
    return Failure(self.slice_index, detail, part.tokens if part else 0, lost_seconds)

  def _await_inflight(self, now: float) -> str:
    """Awaits a failing round whose time is modeled, so its device error surfaces; what happened, for the record.
    A part that ended as the failure fell is booked; one the failure cuts off is not, as one never awaited is not (no
    injector armed): its modeled time ran only to `now`."""
    part = self.inflight
    if part is None or not part.modeled_seconds or self.injector is None:
      return ""
    try:
      if part.modeled_end() <= now:
        self.collect(now)
        return " (its round had completed)"
      _awaited(part)  # the armed program fails here, a genuine device error
      return " (its round cut off)"
    except Exception as error:  # pylint: disable=broad-except
      return f", awaiting its round: {injection.describe(error)}"

  def leave(self, now: float) -> Failure:
    """Its lent slice is reclaimed: its unreported work is lost as in a failure, and it leaves the run."""
    booked = self.book.status in (DOWN, FAILED)  # its loss is booked already
    failure = Failure(-1, "", 0, 0.0) if booked else self.fail(now)
    self.state = None
    self.give_back_unreported()
    if self.book.status != FAILED:  # a learner stopped by a program error is never lent a slice again
      self._move(ABSENT, now)
    return failure

  def give_back_unreported(self) -> None:
    """The data it leased after its last report goes back to the service (a learner that left for good)."""
    if self.leased is not None:
      self.leased.give_back_from(self.book.reported_position["position"])
      self._data.restore(self.book.reported_position)  # drops what was staged or prefetched from those leases

  def join_schedule(self, total_steps: int) -> None:
    """A learner joining on lent capacity: its inner schedule stands where the run is."""
    self.book.total_steps = total_steps

  def rejoin(self, slice_index: int, devices: list[jax.Device], theta_host: PyTree, version: int,
             now: float) -> None:
    """Back on a healthy slice: Θ, fresh inner state, data from the end of its last report."""
    if slice_index != self.slice_index:
      self.move_to(slice_index, devices)
    self._data.restore(self.book.reported_position)
    self.reset(theta_host, version, now)

  # Status and checkpoint -------------------------------------------------------------------------

  def _move(self, status: str, now: float) -> None:
    """Moves to `status` (runtime/diloco/learner/lifecycle.py), closing the timeline interval of the previous one."""
    self.book.set_status(f"learner {self.index}", status, now)

  def finish(self, now: float) -> None:
    """The budget has no part left for it (or the run ended): it is done, unless written-off tokens bring it back."""
    self._move(DONE, now)

  def wait(self, now: float) -> None:
    """It has no part to run: it waits for Θ (a finished learner taking up returned budget waits for it, too)."""
    self._move(WAITING, now)

  def reconfigure(self, now: float) -> None:
    """It moves onto another set of its slices (several slices): nothing runs until that ends."""
    self._move(RECONFIGURING, now)

  def await_repair(self, now: float) -> None:
    """Lent a slice that is in repair: it is down until the slice is back."""
    self._move(DOWN, now)

  def snapshot(self, packer: snapshot_lib.Packer, with_state: bool | None = None) -> dict:
    """Everything that decides the learner's future; its device state is copied (the next round donates it), unless
    `with_state` (default: checkpoint_learner_state) is False: a resume restarts it from Θ (restart_all)."""
    group = f"learner{self.index}"
    kept = self.run.checkpoint_learner_state if with_state is None else with_state
    lost = self.book.status in STATE_LOST or self.state is None or not kept
    state = None if lost else snapshot_lib.copied(self.state)
    parts = self.parts.snapshot(packer, group, with_state=kept)
    return dict(  # (the trees packed in this order: their arrays' keys are numbered as they come)
        self.book.snapshot(), fragments=self.fragments.snapshot(), slice_index=self.slice_index,
        slices=list(self.slices), data=self._data.position,
        leases=None if self.leased is None else self.leased.snapshot(), state=packer.tree(state, "train", group),
        state_saved=kept,
        inbox=packer.value(self.inbox if kept else None),
        at_report=packer.tree(self._at_report if kept else None, "params", group),
        **parts, captured=self._capture.snapshot(packer, group) if kept else None,
        uplink=self.uplink.snapshot(packer, group) if self.uplink and state is not None else None,  # else reset with Θ
        downlink=self.downlink.snapshot(packer, group) if self.downlink and state is not None else None)

  def restore(self, saved: dict, unpacker: snapshot_lib.Unpacker, theta_host: PyTree) -> None:
    """The learner as `snapshot` saw it (the controller has moved it to its slice first)."""
    self.book = LearnerBook.restored(saved)
    self.slices, self.slice_index = tuple(saved["slices"]), saved["slice_index"]
    self.fragments.bind(theta_host)
    self.fragments.restore(saved.get("fragments"))
    if self.leased is not None:
      self.leased.restore_leases(saved["leases"])
    self._data.restore(saved["data"])
    self.inbox = unpacker.value(saved["inbox"])
    group = f"learner{self.index}"
    failure = unpacker.failed.get(group, "")  # its program failed before the snapshot could copy its state
    if not saved.get("state_saved", True) and self.book.status in HOLDING_STATE and not failure:
      failure = NOT_SAVED  # (checkpoint_learner_state=False: its parts in flight are lost with its state)
    self.state = self._at_report = None
    kept, before = saved["state"] is not None and not failure, saved["before"]
    like = self._init(tree_transfer.copy_to(theta_host, self.param_sharding), 0) if kept or before else None
    if kept:
      self.state = unpacker.tree(saved["state"], snapshot_lib.like(like), where=group)
      at_report = self.fragments.part(like.params, self.fragments.last())  # (its last report's fragment)
      self._at_report = unpacker.tree(saved["at_report"], snapshot_lib.like(at_report), where=group)
      if self.uplink:
        self.uplink.restore(saved.get("uplink"), unpacker, snapshot_lib.like(like.params), group)
      if self.downlink:
        self.downlink.restore(saved.get("downlink"), unpacker)
    # (a learner never placed, e.g. not yet lent, has no part in flight and no mesh)
    self.parts.restore(saved, unpacker, group, self.state, getattr(self, "mesh", None), failure, like)
    self._capture.restore(saved.get("captured"), unpacker, group)
    if failure == NOT_SAVED and self.book.status == DONE and self.slices:  # should budget come back, it adopts Θ
      self.state = self._init(tree_transfer.copy_to(theta_host, self.param_sharding), self.book.total_steps)

  def close(self) -> None:
    self._data.close()


class Learners:
  """The run's learners as one part of a checkpoint: each one's state, restored onto the slices it had."""

  def __init__(self, learners: list[Learner], devices: list[list[jax.Device]], syncer: Syncer):
    self._learners, self._devices, self._syncer = learners, devices, syncer
    # restored from a checkpoint saved without their inner state (checkpoint_learner_state=False): they restart
    self.saved_without_state = False

  def snapshot(self, packer: snapshot_lib.Packer) -> list[dict]:
    return [learner.snapshot(packer) for learner in self._learners]

  def restore(self, saved: list[dict], unpacker: snapshot_lib.Unpacker) -> None:
    """Each learner moved to its saved slices first, then given its state (its trees laid out like Θ there)."""
    self.saved_without_state = not all(mine.get("state_saved", True) for mine in saved)
    for learner, mine in zip(self._learners, saved):
      slices = tuple(mine["slices"])
      if slices and slices != learner.slices:
        learner.move_to(slices, [self._devices[s] for s in slices])
      learner.restore(mine, unpacker, self._syncer.params)


def _awaited(part: RoundPart) -> np.ndarray:
  """The part's per-step losses once its programs finished, raising the device error if one failed."""
  if part.failure:
    raise injection.RecordedFailure(part.failure)
  return np.concatenate([np.asarray(v).ravel() for k, v in part.metrics.items() if k.partition(".")[0] == "loss"])
