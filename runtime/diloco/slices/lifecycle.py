"""The slices' lives: crashes and program errors, repairs and spares, rejoins, and slices lent to the run.

`SliceLifecycle` owns the slice pool (spares, repairs, learners waiting, slices held for a rejoin), the crash plan,
the fault injector and which learner each lent slice runs. How a learner takes a lost or a given slice is a policy
chosen once, by whoever builds it: `OneSlice` (runtime/diloco/slices/one_slice.py), or `SeveralSlices` (runtime/diloco/slices/several_slices.py) for
learners of k > 1 slices.
Lent slices come after the owned ones, at [num_slices, num_slices + lent): they are never spares of the owned
learners, and a lent learner that crashes waits for its own slice's repair, unless the slice is reclaimed first.
"""

import contextlib
import dataclasses
from typing import Any, Callable, Sequence

import jax
from absl import logging

from runtime.cluster import multislice
from runtime.cluster.slice_pool import SlicePool
from runtime.config.faults import Fault
from runtime.config.run import RunConfig
from runtime.diloco.budget import Budget
from runtime.diloco.clock import Event, EventKind
from runtime.diloco.learner.interface import Failure, LearnerPort
from runtime.diloco.learner.lifecycle import ABSENT, DONE, DOWN, FAILED, RECONFIGURING, TRAINING, WAITING
from runtime.diloco.run_log import RunLog
from runtime.diloco.sync.syncer import Syncer
from runtime.diloco.theta_post import ThetaPost
from runtime.errors import ProgramError
from runtime.faults import injection
from runtime.faults.plan import CrashPlan
from runtime.faults.replay import slice_failures


class SliceLifecycle:
  """Every slice's failures and returns, and the learners they take down and bring back."""

  def __init__(self, run: RunConfig, devices: Sequence[list[jax.Device]], injector: injection.Injector | None,
               clock, learners: Sequence[LearnerPort], syncer: Syncer, budget: Budget, post: ThetaPost, log: RunLog,
               policy: Callable[["SliceLifecycle"], Any]):
    self.run, self.devices, self.injector, self.clock, self.learners = run, devices, injector, clock, learners
    self.syncer, self.budget, self._post, self.log = syncer, budget, post, log
    f, k = run.faults, run.slices_per_learner
    self.crashes = CrashPlan(f.schedule, [slice_failures(f, s, run.seed) for s in range(len(devices))])
    self.pool = SlicePool(run.num_slices, in_use=run.learners * k, per_learner=k)  # lent slices are not its to give
    self.lent: dict[int, int] = {}  # lent slice -> the learner on it
    self._policy = policy(self)  # OneSlice, or SeveralSlices for k > 1
    # Real clock: learner -> the crash event armed in its program in flight, handled when the program's error surfaces
    self._surfacing: dict[int, tuple[Event, float]] = {}  # (and when it was armed)
    self._detail: dict[int, str] = {}  # learner -> how its crash surfaced, for the fault record
    self._armed: set[int] = set()  # learners with a crash armed in one of their parts in flight
    self._firing: set[int] = set()  # learners its armed step-scheduled crash is taking down now
    self._held: dict[int, tuple[str, Exception]] = {}  # learner -> a program error held until its parts end

  # Crashes -----------------------------------------------------------------------------------------

  def schedule_slice_crash(self, slice_index: int) -> None:
    at = self.crashes.next_slice_crash(slice_index)
    if at is not None:
      self.clock.after(at - self.clock.now(), Event(EventKind.SLICE_CRASH, payload=slice_index))

  def on_slice_crash(self, event: Event) -> None:
    self.crashes.happened("slice", event.payload)
    owner = next((l for l in self.learners if event.payload in l.slices and l.status != DOWN), None)
    if not self._surfaces(owner, event):
      self._crash_now(event, owner)

  def on_learner_crash(self, event: Event) -> None:
    self.crashes.happened("learner", event.learner)
    learner = self.learners[event.learner]
    if learner.status not in (DOWN, DONE, FAILED, ABSENT) and not self._surfaces(learner, event):
      if _step_crash(event):  # (armed in its round by arm_crash: that crash fires)
        self._firing.add(learner.index)
      self._crash_now(event, learner)
      self._firing.discard(learner.index)  # (spent by settle_plan if its round went down)

  def _crash_now(self, event: Event, learner: LearnerPort | None) -> None:
    """The crash `event` takes its slice (whoever runs on it) or its learner down now."""
    if event.kind == EventKind.SLICE_CRASH:
      self._policy.slice_crashed(event.payload)
    else:
      repair = event.payload.repair if event.payload.repair >= 0 else None
      self._policy.learner_crashed(learner, event.payload.slice, repair)

  def _surfaces(self, learner: LearnerPort | None, event: Event) -> bool:
    """Under the real clock a crash fails the learner's program in flight for real: armed to raise at its next inner
    step, the crash is handled when that device error surfaces (`failed`). True if so; False where nothing runs
    (the virtual clock models the crash's time and arms its step at dispatch: `arm_crash`)."""
    if self.run.clock.kind != "real" or self.injector is None or learner is None or not learner.parts_in_flight():
      return False
    self.injector.arm_next(learner.index, ends=_ends(event.payload))
    self._surfacing[learner.index] = (event, self.clock.now())
    return True

  def _crash_surfaced(self, learner: LearnerPort, how: str) -> None:
    """The crash armed in the learner's program took it down: handled as its event (slice or learner crash)."""
    event, armed_at = self._surfacing.pop(learner.index)
    self._detail[learner.index] = f"{how} (armed at t={armed_at:.2f})"
    self._crash_now(event, learner)

  def take_detail(self, m: int) -> str:
    """How the learner's crash surfaced (real clock), for its fault record; "" if it did not surface."""
    return self._detail.pop(m, "")

  def crashed_idle(self, learner: LearnerPort) -> bool:
    """A part finished before its armed crash reached an inner step: with none left in flight to fail, its slice
    fails now, idle. True if the learner went down."""
    if learner.index not in self._surfacing or learner.parts_in_flight():
      return False
    if learner.status in (DOWN, DONE, FAILED, ABSENT):  # (it finished, or left, before the slice failed)
      self._surfacing.pop(learner.index)
      return False
    self._crash_surfaced(learner, " (its slice failed idle: its program had finished)")
    return True

  def arm_crash(self, learner: LearnerPort, steps: int, modeled: float) -> float | None:
    """Arms the device program to fail where a crash of its slice falls; returns that modeled time.

    Without modeled time (the real clock) only step-scheduled crashes are armed here; a crash due at a wall time is
    armed in the program in flight when that time comes (`_surfaces`). Either surfaces when the part is awaited.
    A part queued behind those in flight is planned from where they end: its first inner step and, under modeled
    time, when it starts. Nothing is queued behind a part armed to crash (`doomed`): the injector holds one step.
    """
    if self.injector is None:
      return None
    m = learner.index
    if m in self._surfacing:  # (real clock) its crash fails this part (or one still in flight) now
      self.injector.arm_next(m, ends=_ends(self._surfacing[m][0].payload))
      return None
    self._armed.discard(m)
    now, ahead = self.clock.now(), learner.parts_in_flight()
    start = max(now, learner.parts_end_at(0.0)) if ahead and modeled else now
    first = learner.total_steps + (learner.steps_in_flight() if ahead else 0)
    crash = self.crashes.in_round(m, learner.slices, first, steps, start, modeled)
    self.injector.arm(m, None if crash is None else crash.step, ends=_ends(crash.fault if crash is not None else None))
    if crash is None:
      return None
    self._armed.add(m)
    if not modeled:
      return None
    if crash.fault is not None:
      self.clock.after(crash.at - now, Event(EventKind.LEARNER_CRASH, m, crash.fault))
    return crash.at

  def doomed(self, learner: LearnerPort) -> bool:
    """A crash is armed in one of the learner's parts in flight (it fails them all), or a program error is held for
    when they end: none is queued behind them."""
    return learner.index in self._armed or learner.index in self._surfacing or learner.index in self._held

  def hold_stop(self, learner: LearnerPort, where: str, error: Exception) -> bool:
    """A program error (no lost slice) raised by the dispatch of a part queued behind others: the parts ahead finish
    and report, and it stops the learner then (`stop_held`), as at their end one part at a time. True if held."""
    if not learner.parts_in_flight() or injection.slice_lost(error):
      return False
    self._held[learner.index] = (where, error)
    return True

  def stop_held(self, learner: LearnerPort) -> bool:
    """Stops the learner for its held program error once no part of it is in flight; True if it stopped."""
    if learner.index not in self._held or learner.parts_in_flight():
      return False
    where, error = self._held.pop(learner.index)
    self._stop(learner, f"{where}: {injection.describe(error)}", error)
    return True

  def repair(self, slice_index: int, seconds: float) -> None:
    """The slice comes back after `seconds` of repair."""
    self.clock.after(seconds, Event(EventKind.SLICE_REPAIRED, payload=slice_index))

  def remove(self, learner: LearnerPort, status: str, fault: str, why: str, how: bool = True) -> Failure:
    """Removes the learner's future and loses its unmerged work, recorded as `fault` (kind) for `why` (and `how` its
    failure went); it is DOWN (to return) or FAILED (for good)."""
    failure = learner.fail(self.clock.now(), status)
    failure = dataclasses.replace(failure, detail=failure.detail + self.take_detail(learner.index))
    self.budget.lose(failure.unmerged_tokens, failure.lost_seconds,
                     (fault, learner.index, why + failure.detail if how else why))
    self.forget_work(learner.index)
    return failure

  def restart_all(self, why: str) -> None:
    """Every learner that was training, waiting for Θ or reconfiguring restarts from the current Θ on the slices it
    holds (a resume from a checkpoint saved without their inner state: checkpoint_learner_state=False): its work not
    merged is written off (record `restart`), and it rejoins (record `rejoin`) once the reports it sent are settled."""
    # (chosen first: a write-off brings a finished learner back to wait for Θ, which is no restart)
    for learner in [l for l in self.learners if l.status in (TRAINING, WAITING, RECONFIGURING)]:
      with contextlib.suppress(injection.ProcessLost):  # (its process found ended: crashed next, by crash_lost)
        self._policy.restart(learner, why)

  def pull_theta(self, learner: LearnerPort) -> None:
    """A learner (re)starting from Θ (rejoin, join) pulls it whole; its first round starts when it has arrived."""
    self._post.pull(learner.index, learner.round)

  def settle_plan(self, m: int) -> None:
    """The learner's parts in flight are gone: the step-scheduled crash armed in them is spent if it is what took
    them (`_firing`), else it stays in the plan and its modeled event is cancelled."""
    if m in self._firing:
      self._firing.discard(m)
      self.crashes.fired(m)
      return
    self.crashes.disarmed(m)
    self.clock.cancel(lambda e: e.learner == m and _step_crash(e))

  def forget_work(self, m: int) -> None:
    """Nothing the learner was doing or being sent happens any more (a crash armed in it included)."""
    self.settle_plan(m)
    self._armed.discard(m)
    self._surfacing.pop(m, None)
    self._held.pop(m, None)
    if self.injector:
      self.injector.disarm(m)
    self.clock.cancel(lambda e: e.learner == m and e.kind in (EventKind.PART_DONE, EventKind.PARAMS_ARRIVED))

  def crash(self, learner: LearnerPort, why: str, repair: float | None = None) -> None:
    """Removes the learner's future, writes off its unmerged work, and arranges its return (all its slices lost)."""
    self._policy.crash(learner, why, repair)

  def failed(self, learner: LearnerPort, where: str, error: Exception) -> None:
    """A learner's program raised: a lost slice is a crash (the learner comes back on another); any other error
    is a program error, which would fail again on any slice, so the learner stops for good."""
    if injection.slice_lost(error):
      if learner.index in self._surfacing:  # the crash armed in it (real clock)
        self._crash_surfaced(learner, f", {where}: {injection.describe(error)}")
      else:  # (a step-scheduled crash armed in it, under the real clock: its repair time, and the slice it fails)
        fault, why = self.crashes.armed(learner.index), f"{where}: {injection.describe(error)}"
        if fault is not None and injection.fired(error, fault.ends):  # (else its round went down to another loss)
          self._firing.add(learner.index)
        repair = fault.repair if fault is not None and fault.repair >= 0 else None
        if fault is not None and fault.slice >= 0 and self.run.slices_per_learner > 1:  # (one of its slices)
          self._detail[learner.index] = f", {why}"
          self._policy.learner_crashed(learner, fault.slice, repair)
        else:
          self.crash(learner, why, repair)
        self._firing.discard(learner.index)
    else:
      self._stop(learner, f"{where}: {injection.describe(error)}", error)

  def crash_lost(self) -> None:
    """Learners whose own process was found ended (a learner in a Ray actor: LearnerPort.process_lost) crash as on
    their slice's loss (a crash armed to end it, under the real clock, is handled as its event)."""
    for learner in self.learners:
      lost = learner.process_lost()
      if lost is not None:
        self.failed(learner, "found", lost)

  def _stop(self, learner: LearnerPort, why: str, error: Exception) -> None:
    """Stops the learner for good: its future removed, its unmerged work written off for the others to train, its
    slice (healthy) given to the pool, the quorum following the learners still able to report."""
    now, m = self.clock.now(), learner.index
    failure = self.remove(learner, FAILED, "program_error", why, how=False)  # (`why` names the error)
    learner.give_back_unreported()  # (the data service's windows it leased and never reported go to the others)
    hint = "" if multislice.installed() else f" (only {multislice.EXTRA} recognises real lost slices)"
    logging.error("learner %d stopped for good at t=%.1f by a program error, which is no lost slice and is not "
                  "retried%s: %s", m, now, hint, why)
    if all(l.status in (FAILED, ABSENT) for l in self.learners):
      stops = [f"learner {f['learner']} ({f['detail']})" for f in self.log.faults if f["fault"] == "program_error"]
      raise ProgramError(f"no learner is left to train: every one stopped on a program error{hint}: "
                         + "; ".join(stops)) from error
    self._policy.stopped(learner, failure)

  # Repairs and returns -----------------------------------------------------------------------------

  def on_slice_repaired(self, event: Event) -> None:
    s = event.payload
    if not multislice.healthy(s, self.devices[s]):  # (pathwaysutils' check; every slice is healthy without it)
      logging.warning("slice %d failed its health check after repair: repairing it again", s)
      self.repair(s, self.run.faults.repair_seconds)
      return
    if self._lent_slice_repaired(s):
      return
    self.schedule_slice_crash(s)
    learner = self.pool.repaired(s)
    if learner is not None:
      self.rejoin(self.learners[learner], s)

  def on_rejoin(self, event: Event) -> None:
    self.rejoin(self.learners[event.learner], event.payload)

  def rejoin(self, learner: LearnerPort, slice_index: int) -> None:
    """The learner comes back on a healthy slice (or, of several slices, takes it as one of its set)."""
    self._policy.rejoin(learner, slice_index)

  def give_back(self, slice_index: int) -> None:
    """A healthy slice returns to the pool: to the learner waiting first, or to the spares."""
    waiting = self.pool.repaired(slice_index)
    if waiting is not None:
      self.rejoin(self.learners[waiting], slice_index)

  def ask_for_slice(self, m: int) -> None:
    """The learner lacks a slice: a spare reaches it after spare_swap_seconds, or it waits for a repaired one."""
    spare = self.pool.take_spare()
    if spare is not None:
      self.clock.after(self.run.faults.spare_swap_seconds, Event(EventKind.REJOIN, m, spare))
    else:
      self.pool.wait(m)

  def settled(self) -> None:
    """After a merge: learners whose rejoin waited for their reports' verdicts rejoin."""
    for m, s in self.pool.held():
      if not self.learners[m].reports_out:
        self.rejoin(self.learners[m], s)
    self._policy.settled()

  # Learners of several slices ----------------------------------------------------------------------

  def step_scale(self, learner: LearnerPort) -> float:
    """How much longer the learner's steps take on the slices it has now than on its k (1 for a full set)."""
    return self.run.slices_per_learner / len(learner.slices)

  def regroup_due(self, learner: LearnerPort, kind: str) -> bool:
    """At a part boundary: True if the learner first grows onto the slices it was given (the part waits for it)."""
    return self._policy.regroup_due(learner, kind)

  def regroup(self, learner: LearnerPort) -> None:
    """The learner's reconfiguration ended: it moves onto the slices it holds now."""
    owned = self.pool.owned(learner.index)
    learner.regroup(tuple(owned), [self.devices[s] for s in owned])

  # Lent slices -------------------------------------------------------------------------------------

  def is_lent_slice(self, slice_index: int) -> bool:
    return slice_index >= self.run.num_slices

  def lend(self, slice_index: int, learner: LearnerPort) -> bool:
    """The lent slice runs the learner; False if it is in repair (the learner waits for it, down)."""
    self.lent[slice_index] = learner.index
    if self.pool.is_repairing(slice_index):  # it failed while it was not ours
      learner.await_repair(self.clock.now())
      return False
    return True

  def start_from_theta(self, learner: LearnerPort, where: int | tuple[int, ...], record: str = "") -> None:
    """The learner (re)starts on `where` (a slice, or a set of them) from the current Θ, pulled whole, with fresh
    inner state; a rejoin is recorded with `record` as its detail (a join is recorded by membership)."""
    devices = self.devices[where] if isinstance(where, int) else [self.devices[s] for s in where]
    learner.rejoin(where, devices, self.syncer.params, self.syncer.version, self.clock.now())
    if record:
      self.log.fault("rejoin", learner.index, self.clock.now(), record)
    self.pull_theta(learner)

  def reclaim(self, slice_index: int) -> int:
    """The lent slice is taken back; returns the learner it ran."""
    m = self.lent.pop(slice_index)
    self.pool.release(m)
    return m

  def lent_slice_crashed_idle(self, slice_index: int) -> bool:
    """A lent (or lendable) slice with no learner training on it failed; True if handled here."""
    if not self.is_lent_slice(slice_index):
      return False
    if slice_index not in self.lent:  # not ours at the moment: nothing to repair
      self.schedule_slice_crash(slice_index)
      return True
    self.pool.release(self.lent[slice_index])  # its learner, held for a rejoin, waits for the repair
    self.pool.begin_repair(slice_index)
    self.repair(slice_index, self.crashes.repair_of(slice_index))
    return True

  def _lent_slice_repaired(self, slice_index: int) -> bool:
    """A lent (or lendable) slice is back; its learner, if it still holds it and is down, rejoins. True if lent."""
    if not self.is_lent_slice(slice_index):
      return False
    self.pool.end_repair(slice_index)
    self.schedule_slice_crash(slice_index)
    m = self.lent.get(slice_index)
    if m is not None and self.learners[m].status == DOWN:
      self.rejoin(self.learners[m], slice_index)
    return True

  # The end and checkpoints -------------------------------------------------------------------------

  def settle(self) -> None:
    """The injector lets go of the slices whose programs failed (the run is over)."""
    if self.injector is not None:
      self.injector.settle([self.devices[s] for s in self.pool.take_crashed()])

  def lendable(self) -> list[int]:
    """The slices that may be lent and are not lent now."""
    first = self.run.num_slices
    return [s for s in range(first, first + self.run.lent_slices) if s not in self.lent]

  def snapshot(self, packer) -> dict:
    """The pool, the crash plan and which learner each lent slice runs."""
    del packer  # (plain data)
    return dict(pool=self.pool.snapshot(), crashes=self.crashes.snapshot(), lent=sorted(self.lent.items()),
                armed=sorted(self._armed | set(self._surfacing)))  # (a surfacing crash: doomed too)

  def restore(self, saved: dict, unpacker) -> None:
    del unpacker
    self.pool.restore(saved["pool"])
    self.crashes.restore(saved["crashes"])
    self.lent = {s: m for s, m in saved["lent"]}
    self._armed = set(saved.get("armed", ()))  # (a checkpoint from before: none)


def _step_crash(event: Event) -> bool:
  """The event is a step-scheduled crash's, scheduled where it falls in a round armed with it (`arm_crash`)."""
  return event.kind == EventKind.LEARNER_CRASH and isinstance(event.payload, Fault) and event.payload.step >= 0


def _ends(fault: Any) -> str:
  """What a crash ends: its learner's program, or (a scheduled crash's `ends`) its process, or it hangs it."""
  return fault.ends if isinstance(fault, Fault) else "program"
