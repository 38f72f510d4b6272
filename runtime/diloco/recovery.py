"""The controller's fault handlers: crashes, program errors, repairs and rejoins, stragglers, corrupt reports, links.

A mixin of `Controller` (it uses the controller's clock, learners, syncer, slice pool and run log): the
event loop dispatches `_on_<kind>` for these fault events exactly as for the others.
"""

from absl import logging

from runtime.cluster import multislice
from runtime.diloco.clock import Event
from runtime.diloco.learner import ABSENT, DONE, DOWN, FAILED, RECONFIGURING, WAITING, Learner
from runtime.diloco.messages import Delivery, Failure
from runtime.errors import ProgramError
from runtime.faults import injection


class Recovery:
  """Handlers of the fault events; everything a failed learner needs to come back."""

  def _schedule_slice_crash(self, slice_index: int) -> None:
    at = self.crashes.next_slice_crash(slice_index)
    if at is not None:
      self.clock.after(at - self.clock.now(), Event("slice_crash", payload=slice_index))

  def _on_slice_crash(self, event: Event) -> None:
    s = event.payload
    self.crashes.happened("slice", s)
    if self._several():
      self._slice_lost(s)
      return
    owner = next((l for l in self.learners if l.slice_index == s and l.status != DOWN), None)
    if owner is not None:
      self._crash(owner, "slice interrupted", repair=self.crashes.repair_of(s))
    elif not self._lent_slice_crashed_idle(s):
      self.pool.failed_idle(s)
      self.clock.after(self.crashes.repair_of(s), Event("slice_repaired", payload=s))

  def _on_learner_crash(self, event: Event) -> None:
    self.crashes.happened("learner", event.learner)
    learner = self.learners[event.learner]
    if learner.status not in (DOWN, DONE, FAILED, ABSENT):
      repair = event.payload.repair if event.payload.repair >= 0 else None
      if self._several() and event.payload.slice >= 0:
        self._crash_slice(learner, event.payload.slice, "scheduled crash", repair)
      else:
        self._crash(learner, "scheduled crash", repair=repair)

  def _remove(self, learner: Learner, status: str) -> Failure:
    """Removes the learner's future and writes off its unmerged work; it is DOWN (to return) or FAILED (for good)."""
    m = learner.index
    failure = learner.fail(self.clock.now(), status)
    self.crashes.fired(m)
    self._write_off(failure.unmerged_tokens)
    self.ledger.lost(failure.lost_seconds)
    if self.injector:
      self.injector.disarm(m)
    self.clock.cancel(lambda e: e.learner == m and e.kind in ("part_done", "params_arrived"))
    return failure

  def _crash(self, learner: Learner, why: str, repair: float | None = None) -> None:
    """Removes the learner's future, writes off its unmerged work, and arranges its return (all its slices lost)."""
    if self._several():
      self._lose_slices(learner, self.pool.owned(learner.index), why, repair)
      return
    now, m = self.clock.now(), learner.index
    failure = self._remove(learner, DOWN)
    why += failure.detail
    self.log.fault("crash", m, now, why)
    logging.info("learner %d down at t=%.1f: %s", m, now, why)
    self.pool.crashed(failure.slice_index)
    repair = self.run.faults.repair_seconds if repair is None else repair
    self.clock.after(repair, Event("slice_repaired", payload=failure.slice_index))
    if not self._is_lent_slice(failure.slice_index):  # a lent learner waits for its own slice's repair
      spare = self.pool.take_spare()
      if spare is not None:
        self.clock.after(self.run.faults.spare_swap_seconds, Event("rejoin", m, spare))
      else:
        self.pool.wait(m)
    self._maybe_merge()

  def _failed(self, learner: Learner, where: str, error: Exception) -> None:
    """A learner's program raised: a lost slice is a crash (the learner comes back on another); any other error
    is a program error, which would fail again on any slice, so the learner stops for good."""
    if injection.slice_lost(error):
      self._crash(learner, f"{where}: {injection.describe(error)}")
    else:
      self._stop(learner, f"{where}: {injection.describe(error)}", error)

  def _stop(self, learner: Learner, why: str, error: Exception) -> None:
    """Stops the learner for good: its future removed, its unmerged work written off for the others to train, its
    slice (healthy) given to the pool, the quorum following the learners still able to report."""
    now, m = self.clock.now(), learner.index
    failure = self._remove(learner, FAILED)
    self.log.fault("program_error", m, now, why)
    hint = "" if multislice.installed() else f" (only {multislice.EXTRA} recognises real lost slices)"
    logging.error("learner %d stopped for good at t=%.1f by a program error, which is no lost slice and is not "
                  "retried%s: %s", m, now, hint, why)
    if all(l.status in (FAILED, ABSENT) for l in self.learners):
      stops = [f"learner {f['learner']} ({f['detail']})" for f in self.log.faults if f["fault"] == "program_error"]
      raise ProgramError(f"no learner is left to train: every one stopped on a program error{hint}: "
                         + "; ".join(stops)) from error
    if self._several():
      self._return_slices(learner)
    elif not self._is_lent_slice(failure.slice_index):
      self._give_back(failure.slice_index)
    self._maybe_merge()

  def _on_slice_repaired(self, event: Event) -> None:
    s = event.payload
    if not multislice.healthy(s, self.slices[s]):  # (pathwaysutils' check; every slice is healthy without it)
      logging.warning("slice %d failed its health check after repair: repairing it again", s)
      self.clock.after(self.run.faults.repair_seconds, Event("slice_repaired", payload=s))
      return
    if self._lent_slice_repaired(s):
      return
    self._schedule_slice_crash(s)
    learner = self.pool.repaired(s)
    if learner is not None:
      self._rejoin(self.learners[learner], s)

  def _on_rejoin(self, event: Event) -> None:
    self._rejoin(self.learners[event.learner], event.payload)

  def _rejoin(self, learner: Learner, slice_index: int) -> None:
    """The learner comes back on a healthy slice: current Θ, fresh inner state, data after its last report.

    While a report it sent before failing is still on its way, the rejoin waits for that report's
    merge: if the syncer quarantines it, its data must be served again, so where the shard resumes
    is only known then. A learner of several slices takes the slice as one of its set (`_grant`).
    """
    if self._several():
      self._grant(learner, slice_index)
      return
    if self.pool.is_repairing(slice_index):  # the spare failed during the swap: wait for the next slice
      self.pool.wait(learner.index, first=True)
      return
    if learner.reports_out:
      self.pool.hold(learner.index, slice_index)
      return
    self.pool.release(learner.index)
    learner.rejoin(slice_index, self.slices[slice_index], self.syncer.params, self.syncer.version, self.clock.now())
    self.log.fault("rejoin", learner.index, self.clock.now(), f"on slice {slice_index}")
    self._pull_theta(learner)

  def _pull_theta(self, learner: Learner) -> None:
    """A learner (re)starting from Θ (rejoin, join) pulls it whole over its path: the bytes are charged, and its
    first round starts when they have arrived."""
    delay = self.links.send_down(learner.index, self.clock.now())
    self.clock.after(delay, Event("theta_pulled", learner.index, learner.round))

  def _on_theta_pulled(self, event: Event) -> None:
    learner, m = self.learners[event.learner], event.learner
    if learner.round != event.payload or learner.inflight is not None:
      return  # (a learner that failed meanwhile, or moved on, ignores it)
    if learner.status == WAITING:
      self._start_round(learner)
    elif learner.status == RECONFIGURING:  # it grows onto a slice given meanwhile: its round starts when that ends
      self.clock.amend(lambda e: e.learner == m and e.kind == "reconfigured", lambda e: Event(e.kind, m, "main"))

  def _on_straggler(self, event: Event) -> None:
    self.clock.set_slowdown(event.learner, event.payload)
    self.log.fault("straggler", event.learner, self.clock.now(), f"slowdown x{event.payload:g}")

  def _on_corrupt(self, event: Event) -> None:
    self.learners[event.learner].corrupt_next_report(event.payload)
    self.log.fault("corrupt", event.learner, self.clock.now(), f"next report: {event.payload}")

  def _on_link(self, event: Event) -> None:
    self.links.fail(event.learner, *event.payload)
    self.log.fault("link", event.learner, self.clock.now(), f"{event.payload[1]} until t={event.payload[0]:g}")

  def _resend_theta(self, learner: Learner, delivery: Delivery, error: Exception) -> None:
    """A compressed Θ the learner could not adopt (damaged, or not for the Θ it holds) is sent again whole."""
    now = self.clock.now()
    self.log.fault("theta_resent", learner.index, now, str(error))
    learner.set_status(WAITING, now)
    self._send_theta(learner.index, self.syncer.resend(delivery))  # charged the full model's bytes

  def _send_theta(self, learner: int, delivery: Delivery) -> None:
    """Θ sent to one learner outside a merge: charged on its path, delivered when it arrives."""
    delay = self.links.send_down(learner, self.clock.now(), delivery.payload, delivery.fragment)
    self.clock.after(delay, Event("params_arrived", learner, delivery))

  def _on_report_timeout(self, event: Event) -> None:
    """A learner whose report was lost pulls the current Θ (charged on its path) and trains that data again."""
    self._send_theta(event.learner, self.syncer.answer(event.payload, "lost"))
