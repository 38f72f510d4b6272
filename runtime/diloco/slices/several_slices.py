"""Learners of several slices (slices_per_learner = k > 1): the slice lifecycle's policy for a slice of theirs lost, a
slice given to them, and their moves between sets of slices.

faults.learner_recovery decides what a lost slice costs, with the goodput simulator's meaning: "reconfigure" trains on
without it (records `shrink`, then `expand` when a slice comes back), "restart" goes down and rejoins from Θ on a
full set. The table of both, and where the runtime differs from the simulator: docs/architecture.md.
"""

from typing import Sequence

from runtime.diloco.clock import Event, EventKind
from runtime.diloco.learner.interface import Failure, LearnerPort
from runtime.diloco.learner.lifecycle import DONE, DOWN, FAILED, RECONFIGURING, TRAINING, WAITING
from runtime.diloco.slices.lifecycle import SliceLifecycle


class SeveralSlices:
  """How a learner of several slices loses a slice, takes one given to it, and moves between sets of them."""

  def __init__(self, slices: SliceLifecycle):
    self._slices = slices
    self._pool, self._clock, self._run = slices.pool, slices.clock, slices.run

  # Slices lost -------------------------------------------------------------------------------------

  def slice_crashed(self, slice_index: int) -> None:
    """A slice failed: a learner's is handled as its recovery says; an idle one goes into repair."""
    m, repair = self._pool.owner(slice_index), self._slices.crashes.repair_of(slice_index)
    if m is not None:
      self._lose_slices(self._slices.learners[m], [slice_index], "slice interrupted", repair)
      return
    self._pool.failed_idle(slice_index)
    self._slices.repair(slice_index, repair)

  def learner_crashed(self, learner: LearnerPort, j: int, repair: float | None) -> None:
    """A scheduled crash of the learner's j-th slice (its last, if it holds fewer now), or (j < 0) of all."""
    if j < 0:
      self.crash(learner, "scheduled crash", repair)
      return
    owned = self._pool.owned(learner.index)
    self._lose_slices(learner, [owned[min(j, len(owned) - 1)]], f"scheduled crash of its slice {j}", repair)

  def crash(self, learner: LearnerPort, why: str, repair: float | None) -> None:
    """The learner as a whole crashed: all its slices are lost."""
    self._lose_slices(learner, self._pool.owned(learner.index), why, repair)

  def _lose_slices(self, learner: LearnerPort, lost: Sequence[int], why: str, repair: float | None = None) -> None:
    """The learner's slices `lost` failed: they go into repair, it asks for as many back, and it reconfigures onto
    the slices left or goes down (restart, or none left)."""
    m, f = learner.index, self._run.faults
    for s in learner.slices if set(lost) & set(learner.slices) else ():
      self._pool.program_failed_on(s)  # (the failed program ran on every slice the learner trained on)
    for s in lost:
      self._pool.take_back(m, s)
      self._pool.crashed(s)
      self._slices.repair(s, f.repair_seconds if repair is None else repair)
    if learner.status in (TRAINING, WAITING, RECONFIGURING, DONE) and set(lost) & set(learner.slices):
      if f.learner_recovery == "restart" or not set(learner.slices) & set(self._pool.owned(m)):
        self._go_down(learner, why)  # (reconfigure: no slice it trains on is left, and its state with them)
        self._rejoin_when_ready(learner)  # (reconfigure: on a slice it was about to grow onto)
      else:
        self._shrink(learner, why)
    for _ in lost:
      self._slices.ask_for_slice(m)

  def restart(self, learner: LearnerPort, why: str) -> None:
    """The learner goes down and comes back from Θ on the slices it holds, with no repair (SliceLifecycle.restart_all;
    one reconfiguring onto fewer or more ends its move there)."""
    self._go_down(learner, why, "restart", how=False)
    self._rejoin_when_ready(learner)

  def _go_down(self, learner: LearnerPort, why: str, fault: str = "crash", how: bool = True) -> None:
    m = learner.index
    self._slices.remove(learner, DOWN, fault, why, how)
    self._clock.cancel(lambda e: e.learner == m and e.kind == EventKind.RECONFIGURED)

  def _shrink(self, learner: LearnerPort, why: str) -> None:
    """The learner drops the failed slice: only its part in flight is lost; it trains on after reconfig_seconds."""
    now, m = self._clock.now(), learner.index
    owned = self._pool.owned(m)
    if learner.status == DONE:  # nothing in flight and nothing to resume: it moves at once
      self._slices.regroup(learner)
      self._slices.log.fault("shrink", m, now, f"{why}: on slices {owned} (done training)")
      return
    # (A part that completed as the slice failed is kept, its work reported with the next part's: nothing lost.)
    resume = learner.resume_kind()
    was_reconfiguring = learner.status == RECONFIGURING
    failure = learner.lose_part(now)
    self._slices.settle_plan(m)
    if self._slices.injector:
      self._slices.injector.disarm(m)
    self._clock.cancel(lambda e: e.learner == m and e.kind == EventKind.PART_DONE)
    detail = failure.detail + self._slices.take_detail(m)
    self._slices.budget.lose(failure.unmerged_tokens, failure.lost_seconds, (
        "shrink", m, f"{why}{detail}: on slices {owned} of {self._run.slices_per_learner}, "
        f"{failure.unmerged_tokens} tokens in flight lost"))
    if not was_reconfiguring:  # (one under way moves onto the slices it holds when it ends)
      self._clock.after(self._run.faults.reconfig_seconds, Event(EventKind.RECONFIGURED, m, resume))

  def stopped(self, learner: LearnerPort, failure: Failure) -> None:
    """A learner stopped for good gives its healthy slices to the learners waiting, or to the spares."""
    del failure
    self._pool.forget(learner.index)
    for s in self._pool.owned(learner.index):
      self._pool.take_back(learner.index, s)
      self._slices.give_back(s)

  # Slices given ------------------------------------------------------------------------------------

  def rejoin(self, learner: LearnerPort, slice_index: int) -> None:
    """A spare or a repaired slice reaches the learner: it rejoins, or grows onto it."""
    m, now = learner.index, self._clock.now()
    if self._pool.is_repairing(slice_index):  # the spare failed during the swap: wait for the next slice
      self._pool.wait(m, first=True)
      return
    if learner.status == FAILED:  # stopped for good meanwhile: the slice goes to whoever waits
      self._slices.give_back(slice_index)
      return
    self._pool.give(m, slice_index)
    if learner.status == DOWN:
      self._rejoin_when_ready(learner)
    elif learner.status == WAITING:
      self._expand(learner, "")
    elif learner.status == RECONFIGURING:
      self._slices.log.fault("expand", m, now, f"onto slices {self._pool.owned(m)} of "
                               f"{self._run.slices_per_learner}: slice {slice_index} joins the reconfiguration "
                               "under way")

  def _expand(self, learner: LearnerPort, resume: str) -> None:
    """The learner moves onto all the slices it holds, after reconfig_seconds; then resumes (`resume`: the part
    kind it was about to dispatch, or '' to adopt Θ or wait for it)."""
    owned = self._pool.owned(learner.index)
    learner.reconfigure(self._clock.now())
    self._slices.log.fault("expand", learner.index, self._clock.now(),
                             f"onto slices {owned} of {self._run.slices_per_learner}")
    self._clock.after(self._run.faults.reconfig_seconds, Event(EventKind.RECONFIGURED, learner.index, resume))

  def regroup_due(self, learner: LearnerPort, kind: str) -> bool:
    if tuple(self._pool.owned(learner.index)) == learner.slices:
      return False
    self._expand(learner, kind)
    return True

  def _rejoin_when_ready(self, learner: LearnerPort) -> None:
    """A learner that is down rejoins from Θ once it holds k slices (restart) or one (reconfigure: it grows back
    later), and its reports on their way have been merged or quarantined (their data may be served again)."""
    owned = self._pool.owned(learner.index)
    enough = self._run.slices_per_learner if self._run.faults.learner_recovery == "restart" else 1
    if len(owned) < enough or learner.reports_out:
      return
    self._slices.start_from_theta(learner, tuple(owned), f"on slices {owned}")

  def settled(self) -> None:
    """After a merge: learners that were down only for their reports' verdicts rejoin."""
    for learner in self._slices.learners:
      if learner.status == DOWN:
        self._rejoin_when_ready(learner)
