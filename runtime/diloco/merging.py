"""The controller's syncer side: reports arriving, each fragment's quorum and grace window, and starting a merge.

A mixin of `Controller` (it uses the controller's clock, learners, syncer and worker). Merges run one at a time:
with P > 1 fragments, a fragment whose quorum is reached while another fragment's merge is scheduled or running
waits for that merge to finish (its reports keep waiting in the syncer).
"""

from runtime.diloco.clock import Event, EventKind
from runtime.diloco.learner import ABSENT, DONE, DOWN, FAILED


class Merging:
  """Handlers that feed the syncer and start merges."""

  def _able(self, fragment: int | None = None) -> int:
    """Learners that can still report (a `fragment`: whose outstanding or next report is that fragment's)."""
    return sum(l.status not in (DOWN, DONE, FAILED, ABSENT) and (fragment is None or l.owed_fragment() == fragment)
               for l in self.learners)

  def _grace_seconds(self, fragment: int = 0) -> float:
    """The grace window of the fragment's merge: cut by when its waiting reports' learners will need Θ."""
    now, step = self.clock.now(), self.syncer.xi_step.value
    needs_theta_at = [self.learners[r.learner].needs_theta_at(now, step) for r in self.syncer.pending
                      if r.fragment == fragment]
    return self.syncer.grace_seconds(now, needs_theta_at)

  def _on_report_arrived(self, event: Event) -> None:
    self.reports_in_transit -= 1
    self.syncer.receive(event.payload)
    self._maybe_merge()

  def _maybe_merge(self) -> None:
    if self.merge_state != "idle":
      return
    fragment = self.syncer.ready([self._able(p) for p in range(self.run.fragments)])
    if fragment is not None:
      self.syncer.observe_quorum(self.clock.now(), fragment)
      self._schedule_merge(self._grace_seconds(fragment), fragment)

  def _schedule_merge(self, delay: float, fragment: int | None = None) -> None:
    """A merge of the fragment's waiting reports after `delay` (None: of the fragment waiting longest then)."""
    self.merge_state = "scheduled"
    self.clock.after(delay, Event(EventKind.MERGE_DUE, payload=fragment))

  def _on_merge_due(self, event: Event) -> None:
    if not self.syncer.pending:
      self.merge_state = "idle"
      return
    reports = self.syncer.take_pending(event.payload)
    self.merge_state = "running"
    future = self.worker.submit(self.syncer.compute, reports, self._members())
    self.clock.on_done(future, self.run.clock.merge_seconds,
                       Event(EventKind.MERGE_DONE, payload=(future, reports, self.clock.now())))
