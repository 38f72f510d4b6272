"""A learner: one slice's mesh, data shard, parameters and inner AdamW state, and its rounds.

A round is the learner's work between two receipts of Θ: H inner steps (H/P with P fragments, each report then
carrying one fragment: runtime/diloco/fragment_plan.py), dispatched as a main part of H − τ steps that ends in a report, and
an overlap part of τ steps that trains while the report syncs. Θ of one fragment replaces (carry, mix, overwrite)
that fragment's tensors only: the others keep their local progress; Θ whole replaces them all.
The learner keeps its own bookkeeping (tokens and steps since Θ, where its data stands, what it has
reported); the controller only asks it to dispatch, collect, report, adopt Θ, fail and rejoin.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from runtime.data import shards as data_lib
from runtime.train import tree_transfer
from runtime.config.run import RunConfig
from runtime.data.service import LeasedStream
from runtime.diloco import placement as placement_lib
from runtime.diloco import receive as receive_lib
from runtime.diloco.fragment_trees import LearnerFragments
from runtime.diloco.learner_snapshot import LearnerSnapshots
from runtime.diloco.messages import Delivery, Failure, Report, RoundPart
from runtime.faults import injection
from runtime.diloco.fragment_plan import WHOLE
from runtime.train.programs import TrainState, schedule_to
from runtime.data.staging import Stager
from runtime.wire.downlink import Downlink
from runtime.wire.uplink import Uplink

PyTree = Any

TRAINING, WAITING, DOWN, DONE = "training", "waiting", "down", "done"
ABSENT = "absent"  # a learner of lent capacity while it has no slice (not yet lent, or reclaimed)
FAILED = "failed"  # stopped for good by a program error that is no lost slice: never retried
RECONFIGURING = "reconfiguring"  # a learner of several slices moving onto fewer or more of them (it keeps its state)


class Learner(LearnerSnapshots):
  """Owns one slice (or several); all device work is dispatched asynchronously and awaited only in `collect`."""

  STATE_LOST = (DOWN, FAILED)  # statuses whose device state is gone (a checkpoint saves none)

  def __init__(self, index: int, slice_index: int, devices: list[jax.Device], run: RunConfig,
               stream: data_lib.ShardIterator | LeasedStream, tx: optax.GradientTransformation,
               injector: injection.Injector | None = None):
    self.index = index
    self.run = run
    self.tx = tx
    self.injector = injector
    self.tokens_per_batch = stream.tokens_per_batch
    self._data = Stager(stream, run.data.prefetch, str(index))
    self.leased = stream if isinstance(stream, LeasedStream) else None  # data from the service, leased ahead
    self._placements: dict[tuple[int, ...], placement_lib.Placement] = {}  # slices -> mesh, programs there
    self.slices, self.slice_index = (), -1  # the slices it trains on (none while it has none), and the first
    if slice_index != -1:
      self.move_to(slice_index, devices)
    self.state: TrainState | None = None
    self.status = WAITING
    self.inflight: RoundPart | None = None
    self.inbox: Delivery | None = None  # received but not yet adopted (the learner was busy)
    self.tokens = 0  # since the last report's data ends (Θ's receipt, or the start of carried overlap work)
    self.steps = 0
    self.round = 0  # counts receipts of Θ; a report and its answer carry it
    self.base_version = 0
    self.total_steps = 0  # inner steps ever trained: drives the inner schedule and step-scheduled crashes
    self.total_tokens = 0
    self.fragments = LearnerFragments(run.fragments)
    self.busy_seconds = 0.0
    self.last_loss = float("nan")
    self.reports_out = 0  # reports sent and not yet merged or quarantined
    self.completions: list[tuple[float, int]] = []  # (time, inner steps) of every finished part
    self.intervals: list[tuple[str, float, float, str]] = []
    self._unreported_busy = 0.0  # busy seconds of the parts collected since the last report
    self._reported_tokens = self._reported_steps = 0  # what of this round went into a report
    self._at_report: Any = None  # θ on the slice when the last report was taken (receive == "carry")
    self._before_part: tuple | None = None  # (state, data position) before the part in flight, if it keeps them
    self._round_start: dict = self._data.position  # data position when Θ was last received
    self._reported_position: dict = self._round_start  # data position at the end of the last report
    self._corrupt_next = ""  # fault injection: corrupt the next report ("nan", "inf", "huge")
    self._finished_at = float("nan")
    self._state_since = 0.0
    self._absent_seconds = 0.0  # time without a slice of lent capacity (not counted in its busy fraction)
    self.uplink = Uplink(run.compression) if run.compression.up != "none" else None  # compressed reports
    self.downlink = Downlink(run.compression) if run.compression.down != "none" else None  # compressed Θ

  # Placement ---------------------------------------------------------------------------------------

  def move_to(self, slices: int | tuple[int, ...], devices: list) -> None:
    """Binds the learner to one slice (an index and its devices) or several (a tuple, and each one's devices): its
    mesh, shardings and round program, compiled once per slice set it uses."""
    slices, groups = (slices, devices) if isinstance(slices, tuple) else ((slices,), [devices])
    if slices not in self._placements:
      self._placements[slices] = placement_lib.place(self.index, slices, groups, self.run, self.tx, self.injector)
    where = self._placements[slices]
    self.slices, self.slice_index = slices, slices[0]
    self.mesh, self.param_sharding, self.batch_sharding = where.mesh, where.param_sharding, where.batch_sharding
    self._round_program, self._init, self._keeps_state = where.round_program, where.init, where.keeps_state

  def regroup(self, slices: tuple[int, ...], groups: list[list[jax.Device]]) -> None:
    """Moves the learner of several slices, its state with it, onto another set of them (one lost, or one back)."""
    self.move_to(slices, groups)
    move = lambda tree: None if tree is None else placement_lib.moved(tree, self.mesh)
    self.state, self._at_report = move(self.state), move(self._at_report)
    if self.uplink:  # the Θ its outer gradient is measured from, and its residual, live on its slices too
      self.uplink.move(move)

  def reset(self, theta_host: PyTree, version: int, now: float) -> None:
    """Starts from Θ with fresh inner optimizer state (initial start, rejoin, quarantine)."""
    params = tree_transfer.copy_to(theta_host, self.param_sharding)
    self.fragments.bind(theta_host)
    if self.downlink:
      self.downlink.hold(theta_host, version)
    if self.uplink:
      self.uplink.start(params)
    self.state = self._init(params, self.total_steps)
    self._new_round(version, now)

  # Rounds -----------------------------------------------------------------------------------------

  def dispatch(self, kind: str, steps: int, now: float, modeled_seconds: float, armed: bool = False,
               schedule_at: int | None = None) -> RoundPart:
    """Enqueues `steps` inner steps as one device program and returns at once (may raise: a device error unless
    `armed`, an injected program bug always).

    A program `armed` to crash may fail as it is enqueued (XLA:CPU runs small programs inline when their inputs
    are ready) or later; either way its error is raised where it is awaited, so the run never depends on which.
    """
    if self.injector is not None:
      self.injector.check_program(self.index, now)
    main, overlap = self.run.round_steps - self.run.overlap_steps, self.run.overlap_steps
    ahead = overlap if kind == "main" and overlap else main
    if self.leased is not None:  # this part, the one staged after it, and what the prefetcher reads ahead
      self.leased.lease_through(self._data.position["position"] + steps + ahead + self.run.data.prefetch + 2)
    staged = self._data.take(steps, self.batch_sharding)
    self.set_status(TRAINING, now)
    if schedule_at is not None:  # the inner schedule follows the run's progress (inner.schedule_progress="run")
      self.state = schedule_to(self.state, np.int32(schedule_at))
    failure, before = "", (self.state, staged.start) if self._keeps_state else None
    try:
      state, metrics = self._round_program(self.state, staged.batches_HxBxT)
    except jax.errors.JaxRuntimeError as error:
      if not armed:
        raise
      state, metrics, failure = None, None, injection.describe(error)
    self._before_part = before
    self.inflight = RoundPart(kind, steps, staged.tokens, now, modeled_seconds, state, metrics, failure)
    self.state = state
    self._data.stage_ahead(ahead, self.batch_sharding)
    return self.inflight

  def collect(self, now: float) -> RoundPart:
    """Awaits the in-flight part (raising the device error if it failed) and books its work."""
    part = self.inflight
    if part.failure:
      raise injection.RecordedFailure(part.failure)
    loss_H = np.asarray(jax.device_get(part.metrics["loss"]))
    self.inflight = self._before_part = None
    busy = part.modeled_seconds if part.modeled_seconds else now - part.started_at
    self.tokens += part.tokens
    self.steps += part.steps
    self.total_steps += part.steps
    self.total_tokens += part.tokens
    self.busy_seconds += busy
    self._unreported_busy += busy * len(self.slices)  # slice time
    self.last_loss = float(loss_H.mean())
    self.completions.append((now, part.steps))
    return part

  def needs_theta_at(self, now: float, seconds_per_step: float) -> float:
    """When the learner will wait for Θ: the end of its overlap part (now, if it is already waiting)."""
    part = self.inflight
    return now if part is None or part.kind != "overlap" else part.ends_at(seconds_per_step)

  # Reports and Θ ----------------------------------------------------------------------------------

  def corrupt_next_report(self, how: str) -> None:
    self._corrupt_next = how

  def report(self, now: float, host_sharding: jax.sharding.Sharding) -> Report:
    """θ_m (its next fragment's tensors) and what it was trained on since Θ, copied onto the syncer's host device."""
    how, self._corrupt_next = self._corrupt_next, ""
    fields = self.fragments.report(self.base_version, self.total_tokens, self.total_steps)
    local = self.fragments.part(self.state.params, fields.get("fragment", 0))
    payload = self.uplink.encode(local, how) if self.uplink else None  # quantized on the slice
    params = None if payload else tree_transfer.copy_to(local, host_sharding)
    if self.run.overlap_steps and self.run.outer.receive == "carry":
      self._at_report = tree_transfer.fresh_copy(local)  # the next round donates the state's buffers
    if how and not payload:
      params = injection.corrupt(params, how)
    return Report(self.index, params, self.tokens, self.steps, loss=self.last_loss, sent_at=now, **fields,
                  data_start=self._round_start, data_end=self._data.position, busy_seconds=self._unreported_busy,
                  round=self.round, total_steps=self.total_steps, payload=payload,
                  base_mirror=self.downlink.key[0] if self.downlink else -1)

  def live_versions(self) -> tuple[int, ...]:
    """The Θ versions it works from: its base, or each fragment's."""
    return (self.base_version,) if self.fragments.num == 1 else tuple(self.fragments.versions)

  def owed_fragment(self) -> int:
    """The fragment of its outstanding report, or of the report it trains toward."""
    return self.fragments.owed(self.reports_out)

  def report_sent(self, report: Report) -> None:
    """The report is on its way: its data counts as reported until the syncer answers."""
    self._reported_position, self._reported_tokens, self._reported_steps = report.data_end, report.tokens, report.steps
    self._unreported_busy = 0.0
    self.reports_out += 1

  def report_settled(self, report: Report, merged: bool) -> None:
    """The syncer merged or quarantined the report; a quarantined report's data is trained again."""
    self.reports_out -= 1
    if not merged and report.round == self.round:
      self._reported_position = report.data_start  # its data is trained again, even after a crash

  def deliver(self, delivery: Delivery) -> bool:
    """Keeps Θ for adoption unless the learner is down or has moved past the round it answers."""
    if self.status in (DOWN, ABSENT, FAILED) or delivery.round != self.round:
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
    unreported = self.tokens - self._reported_tokens  # overlap steps after the report
    keep = bool(unreported) and receive != "overwrite" and delivery.rewind_to is None and not delivery.reset
    keep = keep and self.fragments.num == 1  # (with fragments, Θ comes whole only to start afresh from it)
    written_off = 0
    if delivery.rewind_to is not None:
      self._data.restore(delivery.rewind_to)
      written_off = unreported
    elif unreported and not keep:
      self._data.restore(self._reported_position)  # overlap steps were overwritten: serve their data again
      written_off = unreported
    if delivery.reset:
      self.reset(delivery.params, delivery.version, now)
      return written_off
    theta = tree_transfer.copy_to(theta_host, self.param_sharding)
    if self.uplink:  # a lost report's residual goes with its work
      self.uplink.start(theta, keep_residual=delivery.rewind_to is None)
    if keep and receive == "carry":
      theta = receive_lib.carry(theta, self.state.params, self._at_report)
    elif receive == "mix" and delivery.rewind_to is None:  # rewound work is trained again, not mixed in
      theta = receive_lib.mix(theta, self.state.params, jnp.float32(self.run.outer.mix_alpha))
    self.state = self.state.replace(params=theta)
    self._new_round(delivery.version, now, carried=keep)
    return written_off

  def _adopt_fragment(self, delivery: Delivery, now: float) -> int:
    """Θ of one fragment replaces that fragment's tensors (overlap progress carried or mixed in per outer.receive);
    the overlap steps' work stays in the others and opens the new round: none is written off."""
    p, receive = delivery.fragment, self.run.outer.receive
    theta = tree_transfer.copy_to(delivery.params, self.fragments.part(self.param_sharding, p))
    local = self.fragments.part(self.state.params, p)
    if receive == "carry" and self._at_report is not None:
      theta = receive_lib.carry(theta, local, self._at_report)
    elif receive == "mix":
      theta = receive_lib.mix(theta, local, jnp.float32(self.run.outer.mix_alpha))
    self.state = self.state.replace(params=self.fragments.put(self.state.params, theta, p))
    self._new_round(delivery.version, now, carried=True, fragment=p)
    return 0

  def _new_round(self, version: int, now: float, carried: bool = False, fragment: int = WHOLE) -> None:
    """Θ (of `fragment`) was adopted; carried overlap work (its tokens, steps, slice time and data) opens the new
    round."""
    self.fragments.received(fragment, version, self.total_tokens, self.total_steps)
    self.round += 1
    if carried:
      self.tokens -= self._reported_tokens
      self.steps -= self._reported_steps
      self._round_start = self._reported_position
    else:
      self.tokens = self.steps = 0
      self._unreported_busy = 0.0
      self._round_start = self._data.position
    self._reported_tokens = self._reported_steps = 0
    self._at_report = None
    self.base_version = version
    self.inbox = None
    self.set_status(WAITING, now)

  # Failure and return -----------------------------------------------------------------------------

  def fail(self, now: float, status: str = DOWN) -> Failure:
    """The learner's slice failed (or its program, `status` FAILED): its future is dropped, its unreported work is
    lost, and it leaves the slice."""
    detail = self._await_inflight(now)
    part, self.inflight = self.inflight, None
    lost = part.tokens if part else 0
    failure = Failure(self.slice_index, detail, lost + self.tokens - self._reported_tokens, self._unreported_busy)
    self.inbox = self._before_part = None
    self.set_status(status, now)
    self.slices, self.slice_index = (), -1
    return failure

  def lose_part(self, now: float) -> Failure:
    """One of its several slices failed and it reconfigures: only the part in flight is lost (its data is served
    again); the learner keeps the state it had before that part, its round and what it trained since Θ."""
    detail = self._await_inflight(now)
    part, self.inflight = self.inflight, None
    if part is not None:
      self.state, start = self._before_part
      self._data.restore(start)
    self._before_part = None
    self.set_status(RECONFIGURING, now)
    lost_seconds = (now - part.started_at) * len(self.slices) if part else 0.0
    return Failure(self.slice_index, detail, part.tokens if part else 0, lost_seconds)

  def _await_inflight(self, now: float) -> str:
    """Awaits a failing round whose time is modeled, so its device error surfaces; what happened, for the record."""
    if self.inflight is None or not self.inflight.modeled_seconds or self.injector is None:
      return ""
    try:
      self.collect(now)  # the armed program fails here, a genuine device error
      return " (its round had completed)"
    except Exception as error:  # pylint: disable=broad-except
      return f", awaiting its round: {injection.describe(error)}"

  def leave(self, now: float) -> Failure:
    """Its lent slice is reclaimed: its unreported work is lost as in a failure, and it leaves the run."""
    booked = self.status in (DOWN, FAILED)  # its loss is booked already
    failure = Failure(-1, "", 0, 0.0) if booked else self.fail(now)
    self.state = None
    self.give_back_unreported()
    if self.status != FAILED:  # a learner stopped by a program error is never lent a slice again
      self.set_status(ABSENT, now)
    return failure

  def give_back_unreported(self) -> None:
    """The data it leased after its last report goes back to the service (a learner that left for good)."""
    if self.leased is not None:
      self.leased.give_back_from(self._reported_position["position"])
      self._data.restore(self._reported_position)  # drops what was staged or prefetched from those leases

  def join_schedule(self, total_steps: int) -> None:
    """A learner joining on lent capacity: its inner schedule stands where the run is."""
    self.total_steps = total_steps

  def rejoin(self, slice_index: int, devices: list[jax.Device], theta_host: PyTree, version: int,
             now: float) -> None:
    """Back on a healthy slice: Θ, fresh inner state, data from the end of its last report."""
    if slice_index != self.slice_index:
      self.move_to(slice_index, devices)
    self._data.restore(self._reported_position)
    self.reset(theta_host, version, now)

  # Bookkeeping ------------------------------------------------------------------------------------

  def busy_fraction(self, now: float) -> float:
    """Share of the learner's active span spent training: from the start to now, or, once it is done, to the end
    of its last inner step (the final sync of its last report is no training time to fill)."""
    span = (self._finished_at if self.status == DONE else now) - self._absent_seconds
    span -= now - self._state_since if self.status == ABSENT else 0.0
    return self.busy_seconds / span if span > 0 else 1.0

  def set_status(self, status: str, now: float) -> None:
    """Moves to `status`, closing the timeline interval of the previous one."""
    if status == self.status == DONE:
      return
    if status == DONE:  # a learner still down (or stopped) at the end stays charged with that time; one absent is not
      self._finished_at = (self._state_since if self.status == ABSENT else self.completions[-1][0]
                           if self.completions and self.status not in (DOWN, FAILED) else now)
    elif self.status == ABSENT:
      self._absent_seconds += now - self._state_since
    if now > self._state_since and self.status != DONE:
      self.intervals.append((f"learner {self.index}", self._state_since, now, self.status))
    self.status, self._state_since = status, now

  def close(self) -> None:
    self._data.close()
