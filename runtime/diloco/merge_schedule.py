"""When merges run, and what follows each: one at a time, in the merge worker's thread, once a fragment's quorum and
grace window allow; then Θ committed, every report answered and Θ sent down.

The syncer decides whether a fragment's reports make a quorum and how long its grace window is; the event loop asks
here after every event. The worker, not the controller, waits for the host: the reports' copies, the merge, and Θ
laid out on each merged learner's slices, each stage timed.
"""

import concurrent.futures
import dataclasses
import time
from typing import Any, Callable, Sequence

import jax

from runtime.config.run import RunConfig
from runtime.diloco.budget import Budget
from runtime.diloco.clock import Event, EventKind
from runtime.diloco.learner.interface import LearnerPort
from runtime.diloco.learner.lifecycle import ABSENT, FAILED, OUT
from runtime.diloco.profiling import annotate
from runtime.diloco.run_log import RunLog
from runtime.diloco.slices.lifecycle import SliceLifecycle
from runtime.diloco.sync.messages import Report
from runtime.diloco.sync.syncer import MergeResult, Syncer
from runtime.errors import TrainingDiverged
from runtime.network.links import Links
from runtime.train import tree_transfer
from runtime.train.optim import inner_lr

IDLE, SCHEDULED, RUNNING = "idle", "scheduled", "running"


class MergeSchedule:
  """The merge state (idle, scheduled, running) and the worker thread merges run in."""

  def __init__(self, run: RunConfig, clock, learners: Sequence[LearnerPort], syncer: Syncer, links: Links,
               budget: Budget, log: RunLog, slices: SliceLifecycle):
    self._run, self._clock, self._learners, self._syncer, self._links = run, clock, learners, syncer, links
    self._budget, self._log, self._slices = budget, log, slices
    self._lr = inner_lr(run.inner, run.total_steps)  # evaluated here: on the host CPU it queues behind the merge
    self._pinned = tree_transfer.route(run.host_transfers) == "pinned"
    self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="syncer")
    self._worker.submit(syncer.compile_merges)  # every merge size, before the first merge needs one
    self.state = IDLE

  def able(self, fragment: int | None = None) -> int:
    """Learners that can still report (a `fragment`: whose outstanding or next report is that fragment's)."""
    return sum(l.status not in OUT and (fragment is None or l.owed_fragment() == fragment) for l in self._learners)

  def grace_seconds(self, fragment: int = 0) -> float:
    """The grace window of the fragment's merge: cut by when its waiting reports' learners will need Θ."""
    now, step = self._clock.now(), self._syncer.xi_step.value
    needs_theta_at = [self._learners[r.learner].needs_theta_at(now, step) for r in self._syncer.pending
                      if r.fragment == fragment]
    return self._syncer.grace_seconds(now, needs_theta_at)

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
    members = sum(l.status != ABSENT for l in self._learners)  # (learners present: the outer step's scale)
    landings = {}  # where each reporting learner trains now, asked here: the worker reads no learner's fields
    if self._syncer.trees.num == 1 and self._syncer.mirrors is None:  # (else Θ goes down as a fragment, compressed)
      landings = {r.learner: self._learners[r.learner].theta_landing() for r in reports}
    future = self._worker.submit(self._merge, reports, members, landings)
    self._clock.on_done(future, self._run.clock.merge_seconds,
                        Event(EventKind.MERGE_DONE, payload=(future, reports, self._clock.now())))

  def _merge(self, reports: list[Report], members: int, landings: dict[int, Callable | None]) -> "Merged":
    """In the worker: the reports' tensors to the host, the merge, and Θ laid out where each merged learner trains
    (by its `landings`, asked of it when the merge began)."""
    marks = [time.perf_counter()]
    with annotate("syncer/report_copy"):
      landed = [r if r.params is None else dataclasses.replace(r, params=self._syncer.land(r.params)) for r in reports]
      jax.block_until_ready([r.params for r in landed])
    marks.append(time.perf_counter())
    with annotate("syncer/merge"):
      result = self._syncer.compute(landed, members)
    marks.append(time.perf_counter())
    placed = {}
    with annotate("syncer/theta_copy"):
      theta = tree_transfer.Shared(result.params) if self._pinned else result.params  # (packed once for them all)
      for m in result.merged:
        land = landings.get(m)
        laid_out = land(theta) if land is not None else None
        if laid_out is not None:
          placed[m] = laid_out
    marks.append(time.perf_counter())
    lrs = tuple(self._lr(r.total_steps - 1) for r in reports if r.learner in result.merged)  # (not a stage: untimed)
    stages = dict(zip(("report_copy_s", "merge_s", "theta_copy_s"), (b - a for a, b in zip(marks, marks[1:]))))
    return Merged(result, placed, stages, lrs)

  def on_merge_done(self, event: Event) -> None:
    """The worker's merge is done: Θ committed, each report answered (merged, or quarantined and its work lost) and
    Θ sent down to its learner, learners waiting for those verdicts rejoined, and the merge recorded."""
    future, reports, started = event.payload
    made = future.result()
    self.state = IDLE
    result, now = made.result, self._clock.now()
    self._syncer.commit(result, [key for l in self._learners for key in l.live_bases()])
    if self._syncer.divergence():
      raise TrainingDiverged(self._syncer.divergence())
    quarantined = dict(result.quarantined)
    answers = [self._syncer.answer(r, "quarantined" if r.learner in quarantined else "merged") for r in reports]
    answers = [dataclasses.replace(a, placed=made.placed[r.learner])  # Θ already on its slices
               if r.learner in made.placed and a.params is result.params else a for r, a in zip(reports, answers)]
    transfers = [self._links.send_down(r.learner, now, a.payload, a.fragment) for r, a in zip(reports, answers)]
    self._syncer.observe_sync(max(transfers) + now - started)  # the merge and Θ down (the reports were up)
    for report, transfer, answer in zip(reports, transfers, answers):
      learner, merged = self._learners[report.learner], report.learner not in quarantined
      learner.report_settled(report, merged)
      if not merged and learner.status in (ABSENT, FAILED):  # it left, or stopped for good: its data goes to others
        learner.give_back_unreported()
      if merged:
        self._log.merged(report)
        self._budget.ledger.useful(report.busy_seconds)
      else:
        self._budget.lose(report.tokens, report.busy_seconds,
                          ("quarantine", report.learner, quarantined[report.learner]))
      self._clock.after(transfer, Event(EventKind.PARAMS_ARRIVED, report.learner, answer))
    self._slices.settled()
    stamp = self._clock.wall_stamp()  # (wall times and host stage times: real clock only, never in modeled records)
    if stamp:
      stamp.update({f"host_{stage}": s for stage, s in made.stages.items()},
                   host_adopt_s=self._log.take_adopt_seconds(), **self._log.take_host_seconds())
    self._log.merge(result, reports, now, stamp, self._learners, self.grace_seconds(result.fragment),
                    self._syncer.quorum(self.able(result.fragment)), self._budget.ledger.goodput(now), made.lrs)
    self._log.evaluate(self._syncer.params, self._syncer.version, self._clock.now(), self._clock.wall_stamp())

  def close(self) -> None:
    self._worker.shutdown()

  def snapshot(self, packer) -> dict:
    del packer  # (plain data)
    return dict(merge_state=self.state)

  def restore(self, saved: dict, unpacker) -> None:
    del unpacker
    self.state = saved["merge_state"]


@dataclasses.dataclass(frozen=True)
class Merged:
  """What the worker made of one merge: the result, Θ laid out where each merged learner trains (learner: what its
  landing returned), the host seconds of each stage, and the inner learning rate of each merged report's last step."""

  result: MergeResult
  placed: dict[int, tuple[Any, Any]]
  stages: dict[str, float]
  lrs: tuple[float, ...] = ()
