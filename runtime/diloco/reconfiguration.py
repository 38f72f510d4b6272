"""Learners of several slices (slices_per_learner = k > 1): a slice of theirs lost, a slice given to them, and their
moves between sets of slices.

A mixin of `Controller`. The slice pool keeps the healthy slices each such learner holds (`owned`): those it trains
on, and while it is down or about to grow, those kept for it. For every slice it loses the learner asks for one
back: a spare (after faults.spare_swap_seconds), or else the next slice repaired. When one of its slices fails,
faults.learner_recovery decides, with the goodput simulator's meaning of the same option (runtime/sim/model.py):

- "reconfigure": the learner trains on without the failed slice. It loses only the part of its round in flight
  (the simulator's in-flight step: a part is the smallest unit of work this runtime dispatches); that part's data is
  served again and its tokens go back into the budget. It keeps the state it had before that part (its round
  program leaves its input intact: see `placement`), its round, its report on its way and the work it has not
  reported; it pays faults.reconfig_seconds, then trains on the slices left, each step taking k / slices left as
  long (the same batch on fewer devices). A slice given back is added at its next part boundary (at once while it
  waits for Θ), again after reconfig_seconds (the simulator charges only the drop; the runtime, as its elastic
  data-parallel baseline does, charges the re-add too). Records: `shrink`, `expand`. A learner whose last slice
  fails (every slice its state lives on) goes down and restarts, as below, on the first slice it holds.
- "restart": the learner goes down as a learner of one slice does (record `crash`): its unmerged work is written
  off; it keeps its healthy slices and comes back (`rejoin`) from the current Θ with fresh inner state once it has
  k slices again (the simulator's hot spare: work since the last sync lost).

A crash of the learner as a whole (`crash:learner=M` without slice=J, or a program error read as a lost slice)
takes all its slices down.
"""

from typing import Sequence

from runtime.diloco.clock import Event, EventKind
from runtime.diloco.learner import DONE, DOWN, FAILED, RECONFIGURING, TRAINING, WAITING, Learner


class Reconfiguration:
  """Handlers of a several-slice learner's lost and returned slices, and the event that ends its reconfiguration."""

  def _several(self) -> bool:
    return self.run.slices_per_learner > 1

  def _step_scale(self, learner: Learner) -> float:
    """How much longer the learner's steps take on the slices it has now than on its k (1 for a full set)."""
    return self.run.slices_per_learner / len(learner.slices)

  # Slices lost -------------------------------------------------------------------------------------

  def _slice_lost(self, slice_index: int) -> None:
    """A slice failed: a learner's is handled as its recovery says; an idle one goes into repair."""
    m, repair = self.pool.owner(slice_index), self.crashes.repair_of(slice_index)
    if m is not None:
      self._lose_slices(self.learners[m], [slice_index], "slice interrupted", repair)
      return
    self.pool.failed_idle(slice_index)
    self.clock.after(repair, Event(EventKind.SLICE_REPAIRED, payload=slice_index))

  def _crash_slice(self, learner: Learner, j: int, why: str, repair: float | None) -> None:
    """A scheduled crash of the learner's j-th slice (its last, if it holds fewer now)."""
    owned = self.pool.owned(learner.index)
    self._lose_slices(learner, [owned[min(j, len(owned) - 1)]], f"{why} of its slice {j}", repair)

  def _lose_slices(self, learner: Learner, lost: Sequence[int], why: str, repair: float | None = None) -> None:
    """The learner's slices `lost` failed: they go into repair, it asks for as many back, and it reconfigures onto
    the slices left or goes down (restart, or none left)."""
    m, f = learner.index, self.run.faults
    for s in lost:
      self.pool.take_back(m, s)
      self.pool.crashed(s)
      self.clock.after(f.repair_seconds if repair is None else repair, Event(EventKind.SLICE_REPAIRED, payload=s))
    if learner.status in (TRAINING, WAITING, RECONFIGURING, DONE) and set(lost) & set(learner.slices):
      if f.learner_recovery == "restart" or not set(learner.slices) & set(self.pool.owned(m)):
        self._go_down(learner, why)  # (reconfigure: no slice it trains on is left, and its state with them)
        self._rejoin_when_ready(learner)  # (reconfigure: on a slice it was about to grow onto)
      else:
        self._shrink(learner, why)
    for _ in lost:
      spare = self.pool.take_spare()
      if spare is not None:
        self.clock.after(f.spare_swap_seconds, Event(EventKind.REJOIN, m, spare))
      else:
        self.pool.wait(m)
    self._maybe_merge()

  def _go_down(self, learner: Learner, why: str) -> None:
    now, m = self.clock.now(), learner.index
    failure = self._remove(learner, DOWN)
    self.clock.cancel(lambda e: e.learner == m and e.kind == EventKind.RECONFIGURED)
    self.log.fault("crash", m, now, why + failure.detail)

  def _shrink(self, learner: Learner, why: str) -> None:
    """The learner drops the failed slice: only its part in flight is lost; it trains on after reconfig_seconds."""
    now, m = self.clock.now(), learner.index
    owned = self.pool.owned(m)
    if learner.status == DONE:  # nothing in flight and nothing to resume: it moves at once
      learner.regroup(tuple(owned), [self.slices[s] for s in owned])
      self.log.fault("shrink", m, now, f"{why}: on slices {owned} (done training)")
      return
    # (A part that completed as the slice failed is kept, its work reported with the next part's: nothing lost.)
    resume = learner.inflight.kind if learner.inflight is not None else ""
    was_reconfiguring = learner.status == RECONFIGURING
    failure = learner.lose_part(now)
    self.crashes.fired(m)
    if self.injector:
      self.injector.disarm(m)
    self.clock.cancel(lambda e: e.learner == m and e.kind == EventKind.PART_DONE)
    self._write_off(failure.unmerged_tokens)
    self.ledger.lost(failure.lost_seconds)
    self.log.fault("shrink", m, now, f"{why}{failure.detail}: on slices {owned} of {self.run.slices_per_learner}, "
                   f"{failure.unmerged_tokens} tokens in flight lost")
    if not was_reconfiguring:  # (one under way moves onto the slices it holds when it ends)
      self.clock.after(self.run.faults.reconfig_seconds, Event(EventKind.RECONFIGURED, m, resume))

  # Slices given ------------------------------------------------------------------------------------

  def _grant(self, learner: Learner, slice_index: int) -> None:
    """A spare or a repaired slice reaches the learner: it rejoins, or grows onto it."""
    m, now = learner.index, self.clock.now()
    if self.pool.is_repairing(slice_index):  # the spare failed during the swap: wait for the next slice
      self.pool.wait(m, first=True)
      return
    if learner.status == FAILED:  # stopped for good meanwhile: the slice goes to whoever waits
      self._give_back(slice_index)
      return
    self.pool.give(m, slice_index)
    if learner.status == DOWN:
      self._rejoin_when_ready(learner)
    elif learner.status == WAITING:
      self._expand(learner, "")
    elif learner.status == RECONFIGURING:
      self.log.fault("expand", m, now, f"onto slices {self.pool.owned(m)} of {self.run.slices_per_learner}: slice "
                     f"{slice_index} joins the reconfiguration under way")

  def _expand(self, learner: Learner, resume: str) -> None:
    """The learner moves onto all the slices it holds, after reconfig_seconds; then resumes (`resume`: the part
    kind it was about to dispatch, or '' to adopt Θ or wait for it)."""
    owned = self.pool.owned(learner.index)
    learner.set_status(RECONFIGURING, self.clock.now())
    self.log.fault("expand", learner.index, self.clock.now(), f"onto slices {owned} of {self.run.slices_per_learner}")
    self.clock.after(self.run.faults.reconfig_seconds, Event(EventKind.RECONFIGURED, learner.index, resume))

  def _regroup_due(self, learner: Learner, kind: str) -> bool:
    """At a part boundary: True if the learner first grows onto the slices it was given (the part waits for it)."""
    if not self._several() or tuple(self.pool.owned(learner.index)) == learner.slices:
      return False
    self._expand(learner, kind)
    return True

  def _on_reconfigured(self, event: Event) -> None:
    learner = self.learners[event.learner]
    owned = self.pool.owned(learner.index)
    learner.regroup(tuple(owned), [self.slices[s] for s in owned])
    if learner.inbox is not None:  # Θ arrived meanwhile
      self._adopt(learner)
    elif event.payload == "main":
      self._start_round(learner)
    elif event.payload == "overlap":
      self._dispatch(learner, "overlap", self.run.overlap_steps)
    else:
      learner.set_status(WAITING, self.clock.now())

  def _rejoin_when_ready(self, learner: Learner) -> None:
    """A learner that is down rejoins from Θ once it holds k slices (restart) or one (reconfigure: it grows back
    later), and its reports on their way have been merged or quarantined (their data may be served again)."""
    owned = self.pool.owned(learner.index)
    enough = self.run.slices_per_learner if self.run.faults.learner_recovery == "restart" else 1
    if len(owned) < enough or learner.reports_out:
      return
    now = self.clock.now()
    learner.rejoin(tuple(owned), [self.slices[s] for s in owned], self.syncer.params, self.syncer.version, now)
    self.log.fault("rejoin", learner.index, now, f"on slices {owned}")
    self._pull_theta(learner)

  def _rejoin_settled(self) -> None:
    """After a merge: learners of several slices that were down only for their reports' verdicts rejoin."""
    for learner in self.learners:
      if self._several() and learner.status == DOWN:
        self._rejoin_when_ready(learner)

  # Slices returned -----------------------------------------------------------------------------------

  def _return_slices(self, learner: Learner) -> None:
    """A learner stopped for good gives its healthy slices to the learners waiting, or to the spares."""
    self.pool.forget(learner.index)
    for s in self.pool.owned(learner.index):
      self.pool.take_back(learner.index, s)
      self._give_back(s)

  def _give_back(self, slice_index: int) -> None:
    waiting = self.pool.repaired(slice_index)
    if waiting is not None:
      self._rejoin(self.learners[waiting], slice_index)
