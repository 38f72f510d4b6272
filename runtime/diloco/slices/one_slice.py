"""Learners of one slice (slices_per_learner = 1): the slice lifecycle's policy for taking a lost or a given slice.

A crashed learner goes down, losing the work it has not merged, and comes back whole from the current Θ on a spare
(after faults.spare_swap_seconds) or on its repaired slice.
"""

from absl import logging

from runtime.diloco.learner.interface import Failure, LearnerPort
from runtime.diloco.learner.lifecycle import DOWN
from runtime.diloco.slices.lifecycle import SliceLifecycle


class OneSlice:
  """Learners of one slice: a crashed learner goes down and comes back whole on a spare or its repaired slice."""

  def __init__(self, slices: SliceLifecycle):
    self._slices = slices

  def slice_crashed(self, s: int) -> None:
    slices = self._slices
    owner = next((l for l in slices.learners if l.slice_index == s and l.status != DOWN), None)
    if owner is not None:
      self.crash(owner, "slice interrupted", repair=slices.crashes.repair_of(s))
    elif not slices.lent_slice_crashed_idle(s):
      slices.pool.failed_idle(s)
      slices.repair(s, slices.crashes.repair_of(s))

  def learner_crashed(self, learner: LearnerPort, slice_j: int, repair: float | None) -> None:
    del slice_j  # its one slice
    self.crash(learner, "scheduled crash", repair)

  def crash(self, learner: LearnerPort, why: str, repair: float | None) -> None:
    slices = self._slices
    now, m = slices.clock.now(), learner.index
    failure = slices.remove(learner, DOWN, "crash", why)
    logging.info("learner %d down at t=%.1f: %s", m, now, why + failure.detail)
    slices.pool.crashed(failure.slice_index)
    slices.repair(failure.slice_index, slices.run.faults.repair_seconds if repair is None else repair)
    if not slices.is_lent_slice(failure.slice_index):  # a lent learner waits for its own slice's repair
      slices.ask_for_slice(m)

  def restart(self, learner: LearnerPort, why: str) -> None:
    """The learner goes down and comes back from Θ on its slice, with no repair (SliceLifecycle.restart_all)."""
    where = learner.slice_index
    self._slices.remove(learner, DOWN, "restart", why, how=False)
    self.rejoin(learner, where)

  def stopped(self, learner: LearnerPort, failure: Failure) -> None:
    del learner
    if not self._slices.is_lent_slice(failure.slice_index):
      self._slices.give_back(failure.slice_index)

  def rejoin(self, learner: LearnerPort, slice_index: int) -> None:
    """The learner comes back on a healthy slice: current Θ, fresh inner state, data after its last report.

    While a report it sent before failing is still on its way, the rejoin waits for that report's
    merge: if the syncer quarantines it, its data must be served again, so where the shard resumes
    is only known then.
    """
    slices = self._slices
    if slices.pool.is_repairing(slice_index):  # the spare failed during the swap: wait for the next slice
      slices.pool.wait(learner.index, first=True)
      return
    if learner.reports_out:
      slices.pool.hold(learner.index, slice_index)
      return
    slices.pool.release(learner.index)
    slices.start_from_theta(learner, slice_index, f"on slice {slice_index}")

  def regroup_due(self, learner: LearnerPort, kind: str) -> bool:
    del learner, kind  # one slice: nothing to grow onto
    return False

  def settled(self) -> None:
    pass
