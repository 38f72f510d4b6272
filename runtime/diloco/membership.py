"""Elastic membership: slices lent mid-run, each running one more learner until it is reclaimed.

Lent slices come after the owned ones, at [num_slices, num_slices + lent); learners of lent capacity have indices
M, M+1, ... and are absent while they hold no slice. A lent slice gets the lowest absent learner: it starts from
the current Θ with fresh inner state, its data leased from the data service. When the slice is reclaimed its
learner leaves: the work it has not reported is written off as in a failure and its leased data goes back to the
service; a report it sent before still merges. The syncer's quorum, grace window and outer-step scale follow the
learners present. Which learner each lent slice runs is the slice lifecycle's (runtime/diloco/slices/lifecycle.py).
"""

from typing import Sequence

import jax
import numpy as np
from absl import logging

from runtime.cluster import learner_slices
from runtime.config import capacity as capacity_lib
from runtime.config.run import RunConfig
from runtime.data.service import DataService, LeasedStream
from runtime.diloco.budget import Budget
from runtime.diloco.clock import Event, EventKind
from runtime.diloco.learner import ray_learner
from runtime.diloco.learner.interface import LearnerPort
from runtime.diloco.learner.learner import Learner
from runtime.diloco.learner.lifecycle import ABSENT
from runtime.diloco.run_log import RunLog
from runtime.diloco.slices.lifecycle import SliceLifecycle
from runtime.errors import ConfigError
from runtime.faults import injection
from runtime.train.harness import Experiment


def make_data_service(run: RunConfig, exp: Experiment) -> DataService | None:
  """The service the learners lease their data from (data.assignment == "service"), or None (fixed shards)."""
  if run.data.assignment != "service":
    return None
  return DataService(exp.corpus.train, seq_len=run.data.seq_len, seed=run.seed)


def make_learners(run: RunConfig, exp: Experiment, devices: Sequence[list[jax.Device]],
                  injector: injection.Injector | None,
                  data_service: DataService | None) -> list[LearnerPort]:
  """The owned learners (one per owned slice, or k) and one absent learner per slice that may be lent: in this
  process, or each in a Ray actor (backend "ray", which arms their crashes itself: ray_learner.RemoteArming)."""
  learners = []
  if run.backend == "ray":
    if devices and devices[0] and devices[0][0].platform != "cpu":
      raise ConfigError("backend", run.backend, "'local' on accelerators: learners in Ray actors run on simulated CPU "
                        "devices only so far (docs/multislice.md)")
    ray_learner.ensure_cluster(run.ray.address)
    puts = ray_learner.ThetaPut()  # (one Θ in the object store for all of them)
  for m in range(run.learners + run.lent_slices):
    owned, batch = m < run.learners, run.learner_batch(m)
    stream = (exp.shard(m, run.learners, batch) if data_service is None
              else LeasedStream(data_service, batch_size=batch, learner=m))
    home = learner_slices.home(m, run.slices_per_learner) if owned else -1
    if run.backend == "ray":  # (a learner of lent capacity: its actor holds every slice it may be lent, one group each)
      held = home if owned else tuple(range(run.num_slices, run.num_slices + run.lent_slices))
      # (a gang is joined as it is made: its coordinator's port, picked free here, is taken only once it starts)
      learners.append(ray_learner.RayLearner(m, held, sum(len(devices[s]) for s in held), run, stream, puts,
                                             absent=not owned, join=run.ray.processes_per_learner > 1))
    else:
      learners.append(Learner(m, home, [devices[s] for s in home] if owned else [], run, stream, injector,
                              absent=not owned))
  if run.backend == "ray":  # (their actors, started together, awaited now)
    ray_learner.join_all(learners)
  return learners


class Membership:
  """Lends and reclaims of slices (scheduled, or drawn from random traces), and the learners they bring and take."""

  def __init__(self, run: RunConfig, clock, learners: Sequence[LearnerPort], budget: Budget, slices: SliceLifecycle,
               data_service: DataService | None, log: RunLog):
    self._run, self._clock, self._learners, self._budget, self._slices = run, clock, learners, budget, slices
    self._data_service, self._log = data_service, log
    self._traces = [capacity_lib.trace(item, run.seed, i) if item.kind == "random" else None
                    for i, item in enumerate(run.capacity.schedule)]
    self._drawn = [0] * len(self._traces)  # (gap, duration) pairs drawn from each random item

  def members(self) -> int:
    """Learners present (not absent for want of a lent slice)."""
    return sum(l.status != ABSENT for l in self._learners)

  # Events ------------------------------------------------------------------------------------------

  def schedule_lends(self) -> None:
    for i, item in enumerate(self._run.capacity.schedule):
      if item.kind == "lend":
        self._clock.after(item.time, Event(EventKind.LEND, payload=(i, item.slices, item.duration)))
      else:
        self._schedule_random_lend(i)

  def _schedule_random_lend(self, i: int) -> None:
    gap, duration = next(self._traces[i])
    self._drawn[i] += 1
    self._clock.after(gap, Event(EventKind.LEND, payload=(i, self._run.capacity.schedule[i].slices, duration)))

  def on_lend(self, event: Event) -> None:
    i, count, duration = event.payload
    now, free = self._clock.now(), self._slices.lendable()[:count]
    for s in list(free):
      learner = next((l for l in self._learners if l.status == ABSENT and not l.reports_out), None)
      if learner is None:  # every absent learner still waits for a report's verdict: the slice stays unused
        free.remove(s)
        continue
      self._budget.ledger.lend(s, now)
      if not self._slices.lend(s, learner):  # it failed while it was not ours: its learner waits for the repair
        continue
      # The inner schedule stands where the run is: global batches' worth of tokens trained so far.
      learner.join_schedule(self._budget.schedule_step())
      self._log.fault("join", learner.index, now, f"on lent slice {s} for {duration:g} s")
      self._slices.start_from_theta(learner, s)
    self._clock.after(duration, Event(EventKind.RECLAIM, payload=(i, tuple(free))))
    logging.info("t=%.1f: %d slices lent (%s), %d learners present", now, len(free), free, self.members())

  def on_reclaim(self, event: Event) -> None:
    i, slices = event.payload
    now = self._clock.now()
    for s in slices:
      learner = self._learners[self._slices.reclaim(s)]
      self._budget.ledger.reclaim(s, now)
      failure = learner.leave(now)
      self._budget.lose(failure.unmerged_tokens, failure.lost_seconds,
                        ("leave", learner.index, f"lent slice {s} reclaimed" + failure.detail))
      self._slices.forget_work(learner.index)
    if self._run.capacity.schedule[i].kind == "random":
      self._schedule_random_lend(i)

  # Checkpoints and accounting ----------------------------------------------------------------------

  def snapshot(self, packer) -> dict:
    del packer  # (plain data)
    return dict(drawn=self._drawn, service=None if self._data_service is None else self._data_service.snapshot())

  def restore(self, saved: dict, unpacker) -> None:
    del unpacker
    for trace, drawn in zip(self._traces, saved["drawn"]):
      for _ in range(drawn if trace is not None else 0):
        next(trace)
    self._drawn = list(saved["drawn"])
    if self._data_service is not None:
      self._data_service.restore(saved["service"])

  def figures(self, now: float) -> dict:
    """Summary columns of a run with lent capacity: slice-seconds lent, learners that joined and left."""
    if not self._run.capacity.schedule:
      return {}
    kinds = [f["fault"] for f in self._log.faults]
    return dict(lent_slice_s=self._budget.ledger.lent_slice_seconds(now), joins=kinds.count("join"),
                leaves=kinds.count("leave"))

  def data_accounting(self) -> dict:
    """Where the service's serials went: merged into Θ (in merge order), leased to learners, or given back."""
    if self._data_service is None:
      return {}
    merged = [self._learners[m].served(a, b) for m, a, b in self._log.merged_ranges]
    return dict(merged_serials=np.concatenate(merged).tolist() if merged else [],
                leased_serials=[s for l in self._learners for s in l.leases()],
                returned_serials=self._data_service.returned, frontier=self._data_service.frontier)
