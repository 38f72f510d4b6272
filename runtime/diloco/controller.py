"""The single controller: dispatches learners' rounds, feeds the syncer, redistributes Θ.

One Python thread of control owns every slice. Each learner's round is an asynchronous device
program whose output arrays are its future; the clock hands completions back in the order they
happen (really, or in seeded virtual time). Merges run in the controller's worker thread while
learners keep training. A failed slice is a removed future: its learner is marked down, its
unmerged work is written off, and everyone else carries on; it rejoins from the current Θ.

The controller is the event loop and nothing else: learners keep their own bookkeeping, the syncer its
quorum and grace window, the slice pool its spares and repairs, the links their faults, the run log its records.
Checkpoints (saving and restoring every part's state) are the `Durability` mixin's.
"""

import concurrent.futures
import os
import pathlib

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from models import lm
from runtime.cluster import devices as devices_lib
from runtime.checkpoint.store import Checkpoints
from runtime.config.run import RunConfig
from runtime.errors import TrainingDiverged
from runtime.diloco.clock import Event, EventKind, make_clock
from runtime.diloco.ledger import Ledger
from runtime.diloco.learner import ABSENT, DONE, DOWN, RECONFIGURING, TRAINING, WAITING, Learner
from runtime.network.links import Links
from runtime.diloco.durability import Durability
from runtime.diloco.membership import Membership
from runtime.diloco.merging import Merging
from runtime.diloco.reconfiguration import Reconfiguration
from runtime.diloco.recovery import Recovery
from runtime.diloco.run_log import RunLog
from runtime.diloco.syncer import MergeResult, Syncer
from runtime.train.harness import Experiment, RunResult, make_logger
from runtime.faults import injection
from runtime.faults.plan import CrashPlan, timed_events
from runtime.faults.replay import slice_failures
from runtime.train.optim import inner_optimizer
from runtime.train.programs import init_state
from runtime.cluster.slice_pool import SlicePool
from runtime.wire.codecs import Codec
from runtime.wire.downlink import Mirrors
from runtime.wire.payload import CorruptPayload


class Controller(Merging, Recovery, Membership, Reconfiguration, Durability):
  """Runs Decoupled DiLoCo (or synchronous DiLoCo with quorum = M) to the token budget."""

  def __init__(self, run: RunConfig, exp: Experiment, workdir: str | os.PathLike | None, name: str):
    self.run, self.exp, self.workdir, self.name = run, exp, workdir, name
    f = run.faults
    self.slices = devices_lib.make_slices(devices_lib.controller_devices(run.num_devices),
                                          run.num_slices + run.lent_slices)
    self.host_mesh = devices_lib.slice_mesh([devices_lib.host_device()])
    self.host_sharding = NamedSharding(self.host_mesh, P())
    self.crashes = CrashPlan(f.schedule, [slice_failures(f, s, run.seed) for s in range(len(self.slices))])
    self.injector = (injection.Injector(run.learners + run.lent_slices, f.schedule)
                     if f.schedule or f.mtbi_chip_seconds > 0 else None)
    tx = inner_optimizer(run.inner, run.total_steps)
    self.learners = self._make_learners(exp, tx)
    k = run.slices_per_learner
    self.pool = SlicePool(run.num_slices, in_use=run.learners * k, per_learner=k)  # lent slices are not its to give
    theta = jax.jit(lm.init_params, static_argnums=0, out_shardings=self.host_sharding)(
        run.model, jax.random.key(run.seed))
    codec = Codec(run.compression, theta) if run.compression.up != "none" else None
    mirrors = Mirrors(run.compression, theta) if run.compression.down != "none" else None
    self.syncer = Syncer(run.outer, theta, len(self.learners), run.overlap_steps, codec, mirrors, run.fragments)
    shares = [run.learner_batch(m) * run.learners / run.data.batch_size for m in range(len(self.learners))]
    self.clock = make_clock(run.clock, len(self.learners), run.seed, shares)
    self.links = Links(run, self.clock.transfer_seconds, self.syncer.trees.nbytes)
    self.worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="syncer")
    self.worker.submit(self.syncer.compile_merges)  # every merge size, before the first merge needs one
    self.ledger = Ledger(num_slices=run.num_slices)
    self.merge_state = "idle"  # "idle" | "scheduled" | "running"
    self.event_time = 0.0  # when the event being handled happened
    self.tokens_dispatched = 0
    self.reports_in_transit = 0
    self.merges_done = 0  # merges handled (committed or not): checkpoints are numbered by them
    self.treedefs = dict(params=jax.tree.structure(theta), outer=jax.tree.structure(self.syncer.opt_state),
                         **{f"params/{p}": jax.tree.structure(self.syncer.trees.part(theta, p))
                            for p in range(run.fragments) if run.fragments > 1},
                         train=jax.tree.structure(jax.eval_shape(lambda p: init_state(p, tx), theta)))
    self.checkpoints = None
    if workdir is not None and (run.checkpoint_every or run.checkpoint_seconds):
      self.checkpoints = Checkpoints(pathlib.Path(workdir) / name / "checkpoints", run.checkpoint_keep)
    self._saved = (0, 0.0)  # merges_done and clock time at the last checkpoint
    self._finished = False  # restored from the checkpoint a finished run saved last
    self.saves: list[tuple[float, float, bool]] = []  # per checkpoint: (clock time, seconds held up, final)
    self._handlers = {
        EventKind.PART_DONE: self._on_part_done, EventKind.PARAMS_ARRIVED: self._on_params_arrived,
        EventKind.REPORT_ARRIVED: self._on_report_arrived, EventKind.REPORT_TIMEOUT: self._on_report_timeout,
        EventKind.THETA_PULLED: self._on_theta_pulled, EventKind.MERGE_DUE: self._on_merge_due,
        EventKind.MERGE_DONE: self._on_merge_done, EventKind.SLICE_CRASH: self._on_slice_crash,
        EventKind.LEARNER_CRASH: self._on_learner_crash, EventKind.SLICE_REPAIRED: self._on_slice_repaired,
        EventKind.REJOIN: self._on_rejoin, EventKind.RECONFIGURED: self._on_reconfigured,
        EventKind.STRAGGLER: self._on_straggler, EventKind.CORRUPT: self._on_corrupt, EventKind.LINK: self._on_link,
        EventKind.LEND: self._on_lend, EventKind.RECLAIM: self._on_reclaim}

  # The event loop ----------------------------------------------------------------------------------

  def train(self) -> RunResult:
    """Runs to the token budget and a final merge (resuming from the newest checkpoint); returns the summary."""
    try:
      return self._train()
    except BaseException:
      for learner in self.learners:
        learner.close()
      self.worker.shutdown()
      self.clock.close()
      if self.checkpoints is not None:
        self.checkpoints.close(quiet=True)  # the saves begun are finished; their errors never hide this one
      raise

  def _train(self) -> RunResult:
    saved_log = self._restore() if self.checkpoints is not None and self.run.resume else None
    resume = dict(resume_after=saved_log["tokens_merged"], keep_records=saved_log["records"]) if saved_log else {}
    with make_logger(self.run, self.workdir, self.name, **resume) as logger:
      self.log = RunLog(self.run, self.exp, logger, self.name, self.host_mesh, self.links,
                        background_evals=self.run.clock.kind == "real")
      if saved_log is not None:
        self.log.restore(saved_log)
      else:
        for s in range(len(self.slices)):
          self._schedule_slice_crash(s)
        for at, kind, m, payload in timed_events(self.run.faults.schedule):
          self.clock.after(at, Event(kind, m, payload))
        self._schedule_lends()
      try:
        self._loop(start=saved_log is None)
      finally:
        for learner in self.learners:
          learner.close()
        self.worker.shutdown()
        self.clock.close()
        self.log.close()  # background evaluations finish and are recorded, also when the run failed
      now = self.clock.now()
      for learner in self.learners:
        learner.set_status(DONE, now)
      if self.injector is not None:
        injection.settle(self.injector, [self.slices[s] for s in self.pool.take_crashed()])
      self.log.evaluate(self.syncer.params, self.syncer.version, self.clock.now(), self.clock.wall_stamp(), force=True)
      if self.checkpoints is not None:
        if not self._finished:  # a rerun of the finished run resumes from here, and only reports
          self._finished = True
          self._save_checkpoint(self.merges_done + 1)
        self.checkpoints.close()
      result = self.log.result(self.learners, self.ledger, now, self.clock.virtual_seconds(), self.syncer.params)
      result.extras.update(self._save_figures())
      result.extras.update(self._membership_figures(now))
      result.details.update(self._data_accounting())
      return result

  def _loop(self, start: bool) -> None:
    if start:
      for learner in self.learners[:self.run.learners]:  # learners of lent capacity join when it is lent
        learner.reset(self.syncer.params, 0, 0.0)
        self._start_round(learner)
    while self._work_scheduled() or self.syncer.pending:
      if not self._work_scheduled():
        self._schedule_merge(0.0)  # the budget is spent: merge what is left, quorum or not
      self.event_time, event = self.clock.next_event()  # (real clock: when it happened, maybe before now)
      self._handlers[EventKind(event.kind)](event)

  def _work_scheduled(self) -> bool:
    """True while a learner, a report or a merge is still on its way (fault timers don't count).

    A waiting learner always has something coming (Θ, or its report's timeout); a down one its repair.
    """
    work_left = self.tokens_dispatched < self.run.token_budget  # else a repaired learner has nothing to do
    return (self.merge_state != "idle" or self.reports_in_transit > 0
            or any(l.status in (TRAINING, WAITING, RECONFIGURING) or (l.status == DOWN and work_left)
                   for l in self.learners))

  # Learners ----------------------------------------------------------------------------------------

  def _start_round(self, learner: Learner) -> None:
    """Dispatches the main part: H − τ steps, or the whole steps left of the budget if fewer."""
    steps = min(self.run.round_steps - self.run.overlap_steps, self._steps_left(learner))
    if steps < 1 and learner.tokens:  # the budget is spent: report the overlap work carried onto Θ
      self._send_report(learner, self.clock.now())
      return
    self._dispatch(learner, "main", max(steps, 1))

  def _steps_left(self, learner: Learner) -> int:
    """Whole inner steps of this learner's batch that the token budget still holds."""
    return (self.run.token_budget - self.tokens_dispatched) // learner.tokens_per_batch

  def _dispatch(self, learner: Learner, kind: str, steps: int) -> bool:
    """Dispatches a part of the learner's round within the token budget; False if none was dispatched."""
    tokens = steps * learner.tokens_per_batch
    if steps > self._steps_left(learner):
      learner.set_status(DONE if kind == "main" else WAITING, self.clock.now())
      self._maybe_merge()  # a finished learner lowers the effective quorum
      return False
    if self._regroup_due(learner, kind):  # a learner of several slices grows onto those given back first
      return True
    now = self.clock.now()
    modeled = sum(self.clock.step_seconds(learner.index) for _ in range(steps)) * self._step_scale(learner)
    crash_at = self._arm_crash(learner, steps, modeled)
    try:
      at = self.tokens_dispatched // self.run.tokens_per_step if self.run.inner.schedule_progress == "run" else None
      part = learner.dispatch(kind, steps, now, modeled, armed=crash_at is not None, schedule_at=at)
    except Exception as error:  # pylint: disable=broad-except
      self._failed(learner, "at dispatch", error)
      return False
    self.tokens_dispatched += tokens
    self.clock.on_done((part.state, part.metrics), modeled, Event(EventKind.PART_DONE, learner.index))
    return True

  def _arm_crash(self, learner: Learner, steps: int, modeled: float) -> float | None:
    """Arms the device program to fail where a crash of its slice falls; returns that modeled time.

    Without modeled time (the real clock) only step-scheduled crashes are armed; they surface when
    the round is awaited.
    """
    if self.injector is None:
      return None
    now = self.clock.now()
    crash = self.crashes.in_round(learner.index, learner.slices, learner.total_steps, steps, now, modeled)
    self.injector.arm(learner.index, None if crash is None else crash.step)
    if crash is None or not modeled:
      return None
    if crash.fault is not None:
      self.clock.after(crash.at - now, Event(EventKind.LEARNER_CRASH, learner.index, crash.fault))
    return crash.at

  def _on_part_done(self, event: Event) -> None:
    # The part's busy time ends when its program finished, not when the controller got to it.
    learner, now = self.learners[event.learner], self.event_time
    try:
      part = learner.collect(now)
    except Exception as error:  # pylint: disable=broad-except
      self._failed(learner, "awaiting its round", error)
      return
    self.syncer.observe_round((part.modeled_seconds or now - part.started_at) / part.steps)
    if part.kind == "main":
      self._send_report(learner, now)
      overlap = self.run.overlap_steps
    elif learner.inbox is not None:
      self._adopt(learner)
      return
    else:
      overlap = self.run.overlap_steps if self.run.outer.keep_training else 0
    if not (overlap and self._dispatch(learner, "overlap", overlap)) and learner.status == TRAINING:
      learner.set_status(WAITING, now)  # (a dispatch that failed left it down or failed, or done)

  def _send_report(self, learner: Learner, now: float) -> None:
    report = learner.report(now, self.host_sharding)
    delay = self.links.send_up(learner.index, now, report.payload, report.fragment)
    if delay is None:  # as if never sent: the learner times out and trains it again
      self.log.fault("link_drop", learner.index, now, f"report of {report.tokens} tokens lost")
      self.ledger.lost(report.busy_seconds)
      self.clock.after(self.run.faults.report_timeout_seconds, Event(EventKind.REPORT_TIMEOUT, learner.index, report))
      return
    learner.report_sent(report)
    self.reports_in_transit += 1
    self.clock.after(delay, Event(EventKind.REPORT_ARRIVED, learner.index, report))

  def _on_params_arrived(self, event: Event) -> None:
    learner = self.learners[event.learner]
    if learner.deliver(event.payload) and learner.status == WAITING:
      self._adopt(learner)

  def _adopt(self, learner: Learner) -> None:
    """The learner adopts the Θ it was delivered and starts its next round."""
    delivery = learner.inbox
    try:
      self._write_off(learner.adopt(self.clock.now()))
    except CorruptPayload as error:  # nothing adopted: Θ goes again, whole
      self._resend_theta(learner, delivery, error)
      return
    self._start_round(learner)

  def _write_off(self, tokens: int) -> None:
    """Tokens trained on but lost before reaching Θ go back into the budget (their data is served again)."""
    self.tokens_dispatched -= tokens
    for learner in self.learners:
      if tokens and learner.status == DONE:  # finished learners take the returned budget, from the current Θ
        learner.set_status(WAITING, self.clock.now())
        self._send_theta(learner.index, self.syncer.latest(learner.round))  # pulled whole

  # The syncer ----------------------------------------------------------------------------------------

  def _on_merge_done(self, event: Event) -> None:
    future, reports, started = event.payload
    result: MergeResult = future.result()
    now = self.clock.now()
    self.syncer.commit(result, [v for l in self.learners for v in l.live_versions()])
    if self.syncer.divergence():
      raise TrainingDiverged(self.syncer.divergence())
    self.merge_state = "idle"
    quarantined = dict(result.quarantined)
    answers = [self.syncer.answer(r, "quarantined" if r.learner in quarantined else "merged") for r in reports]
    transfers = [self.links.send_down(r.learner, now, a.payload, a.fragment) for r, a in zip(reports, answers)]
    self.syncer.observe_sync(2 * max(transfers) + now - started)  # report up, merge, Θ down
    for report, transfer, answer in zip(reports, transfers, answers):
      merged = report.learner not in quarantined
      self.learners[report.learner].report_settled(report, merged)
      if not merged and self.learners[report.learner].status == ABSENT:  # it left: its data is served to others
        self.learners[report.learner].give_back_unreported()
      if merged:
        self.log.merged(report)
        self.ledger.useful(report.busy_seconds)
      else:
        self.log.fault("quarantine", report.learner, now, quarantined[report.learner])
        self._write_off(report.tokens)
        self.ledger.lost(report.busy_seconds)
      self.clock.after(transfer, Event(EventKind.PARAMS_ARRIVED, report.learner, answer))
    for m, s in self.pool.held():
      if not self.learners[m].reports_out:
        self._rejoin(self.learners[m], s)
    self._rejoin_settled()
    self.log.merge(result, reports, now, self.clock.wall_stamp(), self.learners, self._grace_seconds(result.fragment),
                   self.syncer.quorum(self._able(result.fragment)), self.ledger.goodput(now))
    self.log.evaluate(self.syncer.params, self.syncer.version, self.clock.now(), self.clock.wall_stamp())
    self._maybe_merge()
    self.merges_done += 1
    if self._checkpoint_due():
      self._save_checkpoint(self.merges_done)


def train_diloco(run: RunConfig, exp: Experiment, workdir: str | os.PathLike | None, name: str) -> RunResult:
  """Decoupled (quorum K) or synchronous (K = M) DiLoCo under one controller."""
  return Controller(run, exp, workdir, name).train()
