"""The single controller: one Python thread owns every slice and runs the event loop.

Each learner's part of a round is an asynchronous device program whose outputs are its future; the clock hands
completions back in the order they happen (really, or in seeded virtual time), and the loop hands each event to its
owner's handler through one table, then checks once for a quorum ready to merge. A failed slice is a removed future.
The owners it builds, and who owns what: docs/architecture.md.
"""

import concurrent.futures
import contextlib
import os
import pathlib

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from models import lm
from runtime.checkpoint import snapshot as snapshot_lib
from runtime.cluster import devices as devices_lib
from runtime.cluster import multislice
from runtime.config.run import RunConfig
from runtime.diloco.budget import Budget
from runtime.diloco.clock import Event, EventKind, make_clock
from runtime.diloco.durability import Durability
from runtime.diloco.learner import ray_learner
from runtime.diloco.learner.learner import Learners
from runtime.diloco.learner.lifecycle import DOWN, NOT_SAVED, RECONFIGURING, TRAINING, WAITING
from runtime.diloco.ledger import Ledger
from runtime.diloco.membership import Membership, make_data_service, make_learners
from runtime.diloco.merge_schedule import IDLE, RUNNING, MergeSchedule
from runtime.diloco.profiling import RoundsProfile, annotate
from runtime.diloco.rounds import Rounds
from runtime.diloco.run_log import RunLog
from runtime.diloco.slices.lifecycle import SliceLifecycle
from runtime.diloco.slices.one_slice import OneSlice
from runtime.diloco.slices.several_slices import SeveralSlices
from runtime.diloco.sync.shards import Shards
from runtime.diloco.sync.syncer import Syncer
from runtime.diloco.theta_post import ThetaPost
from runtime.network.links import Links
from runtime.train.harness import Experiment, RunResult, make_logger
from runtime.faults import injection
from runtime.faults.plan import timed_events
from runtime.train import preemption
from runtime.train.optim import inner_optimizer
from runtime.train.programs import init_state
from runtime.trained import saved
from runtime.wire.codecs import Codec
from runtime.wire.downlink import Mirrors


class Controller:
  """Runs Decoupled DiLoCo (or synchronous DiLoCo with quorum = M) to the token budget."""

  def __init__(self, run: RunConfig, exp: Experiment, workdir: str | os.PathLike | None, name: str):
    self.run, self.exp, self.workdir, self.name = run, exp, workdir, name
    f = run.faults
    devices = devices_lib.make_slices(devices_lib.controller_devices(run.num_devices),
                                      run.num_slices + run.lent_slices, run.share_devices)
    self.host_mesh = devices_lib.slice_mesh([devices_lib.host_device()])
    self.host_sharding = NamedSharding(self.host_mesh, P())
    injector = injection.Injector(run.learners + run.lent_slices, f.schedule) if injection.injects(run) else None
    tx = inner_optimizer(run.inner, run.total_steps)
    data_service = make_data_service(run, exp)
    self.learners = make_learners(run, exp, devices, injector, data_service)
    if run.backend == "ray" and injector is not None:  # each actor's programs check an injector of its own
      injector = ray_learner.RemoteArming(self.learners)
    self.injector = injector
    theta = jax.jit(lm.init_params, static_argnums=0, out_shardings=self.host_sharding)(
        run.model, jax.random.key(run.seed))
    shards = Shards(theta, [self.host_sharding] + [NamedSharding(devices_lib.slice_mesh([d]), P())
                                                   for d in devices_lib.host_devices(run.syncer.shards)[1:]])
    codec = Codec(run.compression, theta) if run.compression.up != "none" else None
    mirrors = Mirrors(run.compression, theta, shards) if run.compression.down != "none" else None
    self.syncer = Syncer(run.outer, theta, len(self.learners), run.overlap_steps, codec, mirrors, run.fragments,
                         shards)
    shares = [run.learner_batch(m) * run.learners / run.data.batch_size for m in range(len(self.learners))]
    self.clock = make_clock(run.clock, len(self.learners), run.seed, shares)
    self.links = Links(run, self.clock.transfer_seconds, self.syncer.trees.nbytes)
    # The owners of the run's state, each built after those it uses (docs/architecture.md).
    self.log = RunLog(run, exp, name, self.host_mesh, self.links, background_evals=run.clock.kind == "real")
    post = ThetaPost(self.clock, self.links)
    self.budget = Budget(run, self.clock, self.learners, self.syncer, post, Ledger(num_slices=run.num_slices),
                         self.log)
    self.slices = SliceLifecycle(run, devices, injector, self.clock, self.learners, self.syncer, self.budget, post,
                                 self.log, policy=SeveralSlices if run.slices_per_learner > 1 else OneSlice)
    self.merges = MergeSchedule(run, self.clock, self.learners, self.syncer, self.links, self.budget, self.log,
                                self.slices)
    self.rounds = Rounds(run, self.clock, self.learners, self.syncer, self.links, self.budget, post, self.log,
                         self.slices)
    self.membership = Membership(run, self.clock, self.learners, self.budget, self.slices, data_service, self.log)
    treedefs = dict(snapshot_lib.tree_kinds(theta, jax.eval_shape(lambda p: init_state(p, tx), theta),
                                            self.syncer.trees), outer=jax.tree.structure(self.syncer.opt_state))
    self.learner_states = Learners(self.learners, devices, self.syncer)
    parts = [("syncer", self.syncer), ("learners", self.learner_states),
             ("slices", self.slices), ("links", self.links), ("budget", self.budget),
             ("membership", self.membership), ("clock", self.clock), ("merges", self.merges), ("log", self.log)]
    self.durability = Durability(run, workdir, name, treedefs, self.host_sharding, self.clock, parts)
    self.trail = saved.Trail(run, pathlib.Path(workdir) / name if workdir else None, name)
    self.profile = RoundsProfile(run.profile_rounds, pathlib.Path(workdir) / name / "profile" if workdir else None)
    self.event_time = 0.0  # when the event being handled happened
    self._handlers = {
        EventKind.PART_DONE: self._on_part_done, EventKind.PARAMS_ARRIVED: self.rounds.on_params_arrived,
        EventKind.REPORT_ARRIVED: self.rounds.on_report_arrived,
        EventKind.REPORT_TIMEOUT: self.rounds.on_report_timeout,
        EventKind.THETA_PULLED: self.rounds.on_theta_pulled, EventKind.RECONFIGURED: self.rounds.on_reconfigured,
        EventKind.MERGE_DUE: self.merges.on_merge_due, EventKind.MERGE_DONE: self.merges.on_merge_done,
        EventKind.SLICE_CRASH: self.slices.on_slice_crash, EventKind.LEARNER_CRASH: self.slices.on_learner_crash,
        EventKind.SLICE_REPAIRED: self.slices.on_slice_repaired, EventKind.REJOIN: self.slices.on_rejoin,
        EventKind.STRAGGLER: self._on_straggler, EventKind.CORRUPT: self._on_corrupt, EventKind.LINK: self._on_link,
        EventKind.LEND: self.membership.on_lend, EventKind.RECLAIM: self.membership.on_reclaim}

  # The event loop ----------------------------------------------------------------------------------

  def train(self) -> RunResult:
    """Runs to the token budget and a final merge (resuming from the newest checkpoint); returns the summary."""
    try:
      with injection.ROUTER.routing(self.injector):  # the learners' (shared) programs check this run's injector
        return self._train()
    except BaseException:
      self._close()
      self.durability.close()  # the saves begun are finished; their errors never hide this one
      raise

  def _close(self) -> None:
    self.profile.close()
    for learner in self.learners:
      learner.close()
    self.merges.close()
    self.clock.close()

  def _train(self) -> RunResult:
    saved_log = self.durability.restore()  # (every part's state, the run log's tallies among them)
    resume = dict(resume_after=saved_log["tokens_merged"], keep_records=saved_log["records"]) if saved_log else {}
    with make_logger(self.run, self.workdir, self.name, **resume) as logger:
      self.log.open(logger)
      if saved_log is None:
        for s in range(self.run.num_slices + self.run.lent_slices):
          self.slices.schedule_slice_crash(s)
        for at, kind, m, payload in timed_events(self.run.faults.schedule):
          self.clock.after(at, Event(kind, m, payload))
        self.membership.schedule_lends()
      try:
        self._loop(start=saved_log is None)
      finally:
        self._close()
        self.log.close()  # background evaluations finish and are recorded, also when the run failed
      now = self.clock.now()
      for learner in self.learners:
        learner.finish(now)
      self.slices.settle()
      self.log.evaluate(self.syncer.params, self.syncer.version, self.clock.now(), self.clock.wall_stamp(), force=True)
      self.durability.finish(self.slices.crash_lost, tries=len(self.learners))
      result = self.log.result(self.learners, self.budget.ledger, now, self.clock.virtual_seconds(), self.syncer.params)
      result.extras.update(self.durability.figures())
      result.extras.update(self.membership.figures(now))
      result.details.update(self.membership.data_accounting())
      return result

  def _warm_up(self) -> None:
    """Under the real clock, every placed learner compiles its programs before the first part is dispatched (on
    threads: compilation releases the GIL), so that no device idles while the controller compiles another's; so
    does every learner of lent capacity on each slice it may be lent, and a learner of several slices that
    reconfigures on its own less each one it may lose (a compile when it joins or shrinks would stall the run).
    The multislice support is imported here too, not when the first error is classified or slice repaired."""
    multislice.installed()  # (pathwaysutils imports in about a second: not at the first crash or repair)
    devices, jobs = self.slices.devices, [(l, None) for l in self.learners if l.slices]
    lent = range(self.run.num_slices, self.run.num_slices + self.run.lent_slices)
    jobs += [(l, ((s,), [devices[s]])) for l in self.learners[self.run.learners:] for s in lent]
    if self.run.slices_per_learner > 1 and self.run.faults.learner_recovery == "reconfigure":
      less = [(l, tuple(s for s in l.slices if s != j)) for l in self.learners if l.slices for j in l.slices]
      jobs += [(l, (kept, [devices[s] for s in kept])) for l, kept in less]
    with concurrent.futures.ThreadPoolExecutor(max(min(len(jobs), os.cpu_count() or 1), 1)) as pool:
      for done in [pool.submit(l.warm_up, self.syncer.params, self.host_sharding, where) for l, where in jobs]:
        with contextlib.suppress(injection.ProcessLost):  # (a learner whose process ended crashes as the run starts)
          done.result()

  def _loop(self, start: bool) -> None:
    if self.run.clock.kind == "real":
      self._warm_up()
    self.clock.resume()  # (the real clock's time starts here: set-up and compiles are not the run's)
    self.profile.start(self.learners)
    if not start and self.learner_states.saved_without_state:
      self.slices.restart_all(NOT_SAVED)
      self.slices.crash_lost()
    if start:
      starting = self.learners[:self.run.learners]  # learners of lent capacity join when it is lent
      for learner in starting:  # every learner has Θ before any starts (no device waits for another's copy)
        with contextlib.suppress(injection.ProcessLost):
          learner.reset(self.syncer.params, 0, 0.0)
      self.slices.crash_lost()  # (one whose process ended before it started comes back from Θ after its repair)
      for learner in starting:
        if learner.status == WAITING:
          self.rounds.start_round(learner)
    while self._work_scheduled() or self.syncer.pending:
      # A stop waits for a merge under way to finish and be handled: no checkpoint holds half a merge.
      if preemption.requested() and self.merges.state != RUNNING:
        self._stop(preemption.requested())
      if not self._work_scheduled():
        self.merges.schedule(0.0)  # the budget is spent: merge what is left, quorum or not
      self.event_time, event = self.clock.next_event()  # (real clock: when it happened, maybe before now)
      kind = EventKind(event.kind)
      with annotate(f"controller/{kind.value}"):
        try:
          self._handlers[kind](event)
        except injection.ProcessLost:  # a learner's process found ended where it had to answer: crashed next
          pass
        self.slices.crash_lost()  # every learner whose process was found ended, as on its slice's loss
        self.merges.maybe_merge()  # whatever the event changed, a quorum ready now is scheduled here, once
        if kind == EventKind.MERGE_DONE:
          self._merge_handled()
      self.profile.observe(self.learners)

  def _stop(self, signum: int) -> None:
    """A signal asked the run to stop: its state as it stands is saved (if checkpoints are on), and it stops."""
    saved = self.durability.save_now()
    where = f"merge {self.durability.merges_done} ({self.log.tokens_merged:,} tokens merged)"
    raise preemption.Interrupted(preemption.stop_message(where, saved), signum)

  def _work_scheduled(self) -> bool:
    """True while a learner, a report or a merge is still on its way (fault timers don't count).

    A waiting learner always has something coming (Θ, or its report's timeout); a down one its repair.
    """
    work_left = self.budget.work_left()  # else a repaired learner has nothing to do
    return (self.merges.state != IDLE or self.budget.reports_in_transit > 0
            or any(l.status in (TRAINING, WAITING, RECONFIGURING) or (l.status == DOWN and work_left)
                   for l in self.learners))

  # Handlers of the controller's own ----------------------------------------------------------------

  def _on_part_done(self, event: Event) -> None:
    self.rounds.on_part_done(event, self.event_time)  # its busy time ends when its program finished

  def _merge_handled(self) -> None:
    """After a merge (and the next one scheduled, if its quorum is ready): a checkpoint if one is due, and the model."""
    self.durability.merged()
    self.trail.merged(self.durability.merges_done, self.syncer.params, self.log.tokens_merged, self.log.eval_loss)

  def _on_straggler(self, event: Event) -> None:
    self.clock.set_slowdown(event.learner, event.payload)
    self.log.fault("straggler", event.learner, self.clock.now(), f"slowdown x{event.payload:g}")

  def _on_corrupt(self, event: Event) -> None:
    self.learners[event.learner].corrupt_next_report(event.payload)
    self.log.fault("corrupt", event.learner, self.clock.now(), f"next report: {event.payload}")

  def _on_link(self, event: Event) -> None:
    self.links.fail(event.learner, *event.payload)
    self.log.fault("link", event.learner, self.clock.now(), f"{event.payload[1]} until t={event.payload[0]:g}")


def train_diloco(run: RunConfig, exp: Experiment, workdir: str | os.PathLike | None, name: str) -> RunResult:
  """Decoupled (quorum K) or synchronous (K = M) DiLoCo under one controller."""
  return Controller(run, exp, workdir, name).train()
