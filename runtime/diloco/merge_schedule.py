"""When merges run: one at a time, in the merge worker's thread, once a fragment's quorum and grace window allow.

The syncer decides whether a fragment's reports make a quorum and how long its grace window is; this object only
schedules and starts the merges. With P > 1 fragments, a fragment whose quorum is reached while another fragment's
merge is scheduled or running waits for that merge to finish (its reports keep waiting in the syncer).

The worker, not the controller, waits for the host: it copies each report's tensors from its learner's slice to the
host (the learner enqueued that copy's source behind its part and went on), merges, and lays the new Θ out on each
merged learner's slices, so that adopting it is one program the controller enqueues. It times each stage.
"""

import concurrent.futures
import dataclasses
import time
from typing import Any, Callable, Sequence

import jax

from runtime.config.run import RunConfig
from runtime.diloco.clock import Event, EventKind
from runtime.diloco.learner.learner import ABSENT, DONE, DOWN, FAILED, Learner
from runtime.diloco.sync.messages import Report
from runtime.diloco.profiling import annotate
from runtime.diloco.sync.syncer import MergeResult, Syncer
from runtime.train import tree_transfer
from runtime.train.optim import inner_lr

IDLE, SCHEDULED, RUNNING = "idle", "scheduled", "running"


class MergeSchedule:
  """The merge state (idle, scheduled, running) and the worker thread merges run in."""

  def __init__(self, run: RunConfig, clock, learners: Sequence[Learner], syncer: Syncer, members: Callable[[], int],
               host_sharding: jax.sharding.Sharding):
    self._run, self._clock, self._learners, self._syncer, self._members = run, clock, learners, syncer, members
    self._host = host_sharding
    self._lr = inner_lr(run.inner, run.total_steps)  # evaluated here: on the host CPU it queues behind the merge
    self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="syncer")
    self._worker.submit(syncer.compile_merges)  # every merge size, before the first merge needs one
    self.state = IDLE

  def able(self, fragment: int | None = None) -> int:
    """Learners that can still report (a `fragment`: whose outstanding or next report is that fragment's)."""
    return sum(l.status not in (DOWN, DONE, FAILED, ABSENT) and (fragment is None or l.owed_fragment() == fragment)
               for l in self._learners)

  def grace_seconds(self, fragment: int = 0) -> float:
    """The grace window of the fragment's merge: cut by when its waiting reports' learners will need Θ."""
    now, step = self._clock.now(), self._syncer.xi_step.value
    needs_theta_at = [self._learners[r.learner].needs_theta_at(now, step) for r in self._syncer.pending
                      if r.fragment == fragment]
    return self._syncer.grace_seconds(now, needs_theta_at)

  def receive(self, report: Report) -> None:
    """A report reached the syncer: it waits there for its fragment's merge."""
    self._syncer.receive(report)
    self.maybe_merge()

  def maybe_merge(self) -> None:
    """Schedules the merge of a fragment whose quorum is ready, unless a merge is scheduled or running."""
    if self.state != IDLE:
      return
    fragment = self._syncer.ready([self.able(p) for p in range(self._run.fragments)])
    if fragment is not None:
      self._syncer.observe_quorum(self._clock.now(), fragment)
      self.schedule(self.grace_seconds(fragment), fragment)

  def schedule(self, delay: float, fragment: int | None = None) -> None:
    """A merge of the fragment's waiting reports after `delay` (None: of the fragment waiting longest then)."""
    self.state = SCHEDULED
    self._clock.after(delay, Event(EventKind.MERGE_DUE, payload=fragment))

  def on_merge_due(self, event: Event) -> None:
    if not self._syncer.pending:
      self.state = IDLE
      return
    reports = self._syncer.take_pending(event.payload)
    self.state = RUNNING
    future = self._worker.submit(self._merge, reports, self._members())
    self._clock.on_done(future, self._run.clock.merge_seconds,
                        Event(EventKind.MERGE_DONE, payload=(future, reports, self._clock.now())))

  def _merge(self, reports: list[Report], members: int) -> "Merged":
    """In the worker: the reports' tensors to the host, the merge, and Θ onto the merged learners' slices."""
    marks = [time.perf_counter()]
    with annotate("syncer/report_copy"):
      landed = [r if r.params is None else dataclasses.replace(r, params=tree_transfer.copy_to(r.params, self._host))
                for r in reports]
      jax.block_until_ready([r.params for r in landed])
    marks.append(time.perf_counter())
    with annotate("syncer/merge"):
      result = self._syncer.compute(landed, members)
    marks.append(time.perf_counter())
    placed = {}
    with annotate("syncer/theta_copy"):
      if self._syncer.trees.num == 1 and self._syncer.mirrors is None:  # (else Θ goes down as a fragment, compressed)
        for m in result.merged:
          placed.update(self._place(m, result.params))
    marks.append(time.perf_counter())
    lrs = tuple(self._lr(r.total_steps - 1) for r in reports if r.learner in result.merged)  # (not a stage: untimed)
    stages = dict(zip(("report_copy_s", "merge_s", "theta_copy_s"), (b - a for a, b in zip(marks, marks[1:]))))
    return Merged(result, placed, stages, lrs)

  def _place(self, m: int, theta: Any) -> dict[int, tuple[Any, Any]]:
    """Θ laid out on learner m's slices, or nothing if it has none or they failed meanwhile (a learner that moved
    or failed copies Θ itself when it adopts it)."""
    learner = self._learners[m]
    if not learner.slices:
      return {}
    sharding = learner.param_sharding
    try:
      return {m: (sharding, jax.block_until_ready(tree_transfer.copy_to(theta, sharding)))}
    except jax.errors.JaxRuntimeError:
      return {}

  def finished(self, event: Event) -> tuple["Merged", list[Report], float]:
    """The merge of a MERGE_DONE event: what the worker made, its reports and when it started; the next may be
    scheduled."""
    future, reports, started = event.payload
    merged = future.result()
    self.state = IDLE
    return merged, reports, started

  def close(self) -> None:
    self._worker.shutdown()

  def snapshot(self) -> dict:
    return dict(merge_state=self.state)

  def restore(self, saved: dict) -> None:
    self.state = saved["merge_state"]


@dataclasses.dataclass(frozen=True)
class Merged:
  """What the worker made of one merge: the result, Θ laid out on each merged learner's slices (learner: (sharding,
  tree)), the host seconds of each stage, and the inner learning rate of each merged report's last step."""

  result: MergeResult
  placed: dict[int, tuple[Any, Any]]
  stages: dict[str, float]
  lrs: tuple[float, ...] = ()
