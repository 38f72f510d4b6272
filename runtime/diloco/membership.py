"""The controller's elastic membership: slices lent mid-run, each running one more learner until it is reclaimed.

A mixin of `Controller`. Lent slices come after the owned ones, at [num_slices, num_slices + lent); learners of
lent capacity have indices M, M+1, ... and are absent while they hold no slice. A lent slice gets the lowest
absent learner: it starts from the current Θ with fresh inner state, its data leased from the data service.
When the slice is reclaimed its learner leaves: the work it has not reported is written off as in a failure and
its leased data goes back to the service; a report it sent before still merges. The syncer's quorum, grace
window and outer-step scale follow the learners present. Lent slices are never spares of the owned learners: a
lent learner that crashes waits for its own slice's repair, unless the slice is reclaimed first.
"""

import numpy as np
from absl import logging

from runtime.config import capacity as capacity_lib
from runtime.cluster import learner_slices
from runtime.data.service import DataService, LeasedStream
from runtime.diloco.clock import Event, EventKind
from runtime.diloco.learner import ABSENT, DOWN, Learner


class Membership:
  """Handlers of the capacity events (lend, reclaim) and the learners and data they need."""

  def _make_learners(self, exp, tx) -> list[Learner]:
    """The owned learners (one per owned slice) and one absent learner per slice that may be lent."""
    run = self.run
    self.data_service = None
    if run.data.assignment == "service":
      self.data_service = DataService(exp.corpus.train, seq_len=run.data.seq_len, seed=run.seed)
    self.lent: dict[int, int] = {}  # lent slice -> the learner on it
    self._traces = [capacity_lib.trace(item, run.seed, i) if item.kind == "random" else None
                    for i, item in enumerate(run.capacity.schedule)]
    self._drawn = [0] * len(self._traces)  # (gap, duration) pairs drawn from each random item
    learners = []
    for m in range(run.learners + run.lent_slices):
      owned, batch = m < run.learners, run.learner_batch(m)
      stream = (exp.shard(m, run.learners, batch) if self.data_service is None
                else LeasedStream(self.data_service, batch_size=batch, learner=m))
      home = learner_slices.home(m, run.slices_per_learner) if owned else -1
      learners.append(Learner(m, home, [self.slices[s] for s in home] if owned else [], run, stream, tx,
                              self.injector))
      if not owned:
        learners[-1].set_status(ABSENT, 0.0)
    return learners

  def _members(self) -> int:
    return sum(l.status != ABSENT for l in self.learners)

  def _is_lent_slice(self, slice_index: int) -> bool:
    return slice_index >= self.run.num_slices

  # Events ------------------------------------------------------------------------------------------

  def _schedule_lends(self) -> None:
    for i, item in enumerate(self.run.capacity.schedule):
      if item.kind == EventKind.LEND:
        self.clock.after(item.time, Event(EventKind.LEND, payload=(i, item.slices, item.duration)))
      else:
        self._schedule_random_lend(i)

  def _schedule_random_lend(self, i: int) -> None:
    gap, duration = next(self._traces[i])
    self._drawn[i] += 1
    self.clock.after(gap, Event(EventKind.LEND, payload=(i, self.run.capacity.schedule[i].slices, duration)))

  def _on_lend(self, event: Event) -> None:
    i, count, duration = event.payload
    now, first = self.clock.now(), self.run.num_slices
    free = [s for s in range(first, first + self.run.lent_slices) if s not in self.lent][:count]
    for s in list(free):
      learner = next((l for l in self.learners if l.status == ABSENT and not l.reports_out), None)
      if learner is None:  # every absent learner still waits for a report's verdict: the slice stays unused
        free.remove(s)
        continue
      self.lent[s] = learner.index
      self.ledger.lend(s, now)
      if self.pool.is_repairing(s):  # it failed while it was not ours: its learner waits for the repair
        learner.set_status(DOWN, now)
        continue
      # The inner schedule stands where the run is: global batches' worth of tokens trained so far.
      learner.total_steps = self.tokens_dispatched // self.run.tokens_per_step
      self.log.fault("join", learner.index, now, f"on lent slice {s} for {duration:g} s")
      self._join(learner, s)
    self.clock.after(duration, Event(EventKind.RECLAIM, payload=(i, tuple(free))))
    logging.info("t=%.1f: %d slices lent (%s), %d learners present", now, len(free), free, self._members())

  def _join(self, learner: Learner, slice_index: int) -> None:
    learner.rejoin(slice_index, self.slices[slice_index], self.syncer.params, self.syncer.version, self.clock.now())
    self._pull_theta(learner)

  def _on_reclaim(self, event: Event) -> None:
    i, slices = event.payload
    now = self.clock.now()
    for s in slices:
      learner = self.learners[self.lent.pop(s)]
      self.ledger.reclaim(s, now)
      self.pool.release(learner.index)
      failure = learner.leave(now)
      self._write_off(failure.unmerged_tokens)
      self.ledger.lost(failure.lost_seconds)
      if self.injector:
        self.injector.disarm(learner.index)
      self.clock.cancel(lambda e, m=learner.index: e.learner == m and e.kind in (EventKind.PART_DONE, EventKind.PARAMS_ARRIVED))
      self.log.fault("leave", learner.index, now, f"lent slice {s} reclaimed" + failure.detail)
    if self.run.capacity.schedule[i].kind == "random":
      self._schedule_random_lend(i)
    self._maybe_merge()  # fewer learners able to report lower the effective quorum

  # Hooks of the fault handlers for lent slices -------------------------------------------------------

  def _lent_slice_crashed_idle(self, slice_index: int) -> bool:
    """A lent (or lendable) slice with no learner training on it failed; True if handled here."""
    if not self._is_lent_slice(slice_index):
      return False
    if slice_index not in self.lent:  # not ours at the moment: nothing to repair
      self._schedule_slice_crash(slice_index)
      return True
    self.pool.release(self.lent[slice_index])  # its learner, held for a rejoin, waits for the repair
    self.pool.begin_repair(slice_index)
    self.clock.after(self.crashes.repair_of(slice_index), Event(EventKind.SLICE_REPAIRED, payload=slice_index))
    return True

  def _lent_slice_repaired(self, slice_index: int) -> bool:
    """A lent (or lendable) slice is back; its learner, if it still holds it and is down, rejoins. True if lent."""
    if not self._is_lent_slice(slice_index):
      return False
    self.pool.end_repair(slice_index)
    self._schedule_slice_crash(slice_index)
    m = self.lent.get(slice_index)
    if m is not None and self.learners[m].status == DOWN:
      self._rejoin(self.learners[m], slice_index)
    return True

  # Checkpoints and accounting ----------------------------------------------------------------------

  def _membership_snapshot(self) -> dict:
    return dict(lent=sorted(self.lent.items()), drawn=self._drawn,
                service=None if self.data_service is None else self.data_service.snapshot())

  def _membership_restore(self, saved: dict) -> None:
    self.lent = {s: m for s, m in saved["lent"]}
    for trace, drawn in zip(self._traces, saved["drawn"]):
      for _ in range(drawn if trace is not None else 0):
        next(trace)
    self._drawn = list(saved["drawn"])
    if self.data_service is not None:
      self.data_service.restore(saved["service"])

  def _membership_figures(self, now: float) -> dict:
    """Summary columns of a run with lent capacity: slice-seconds lent, learners that joined and left."""
    if not self.run.capacity.schedule:
      return {}
    kinds = [f["fault"] for f in self.log.faults]
    return dict(lent_slice_s=self.ledger.lent_slice_seconds(now), joins=kinds.count("join"),
                leaves=kinds.count("leave"))

  def _data_accounting(self) -> dict:
    """Where the service's serials went: merged into Θ (in merge order), leased to learners, or given back."""
    if self.data_service is None:
      return {}
    merged = [self.learners[m].leased.serials(a, b) for m, a, b in self.log.merged_ranges]
    return dict(merged_serials=np.concatenate(merged).tolist() if merged else [],
                leased_serials=[s for l in self.learners for s in l.leased.snapshot()],
                returned_serials=self.data_service.returned, frontier=self.data_service.frontier)
