"""The single controller: dispatches learners' rounds, feeds the syncer, redistributes Θ.

One Python thread of control owns every slice. Each learner's round is an asynchronous device
program whose output arrays are its future; the clock hands completions back in the order they
happen (really, or in seeded virtual time). Merges run in the controller's worker thread while
learners keep training. A failed slice is a removed future: its learner is marked down, its
unmerged work is written off, and everyone else carries on; it rejoins from the current Θ.

The controller is the event loop and nothing else: it builds the collaborators, each owning its state, and
hands each event to its handler through one table. Learners keep their own bookkeeping, the syncer its quorum and
grace window; `Rounds` the token budget, reports and Θ on their way; `MergeSchedule` when merges run;
`SliceLifecycle` crashes, repairs, spares and rejoins; `Membership` lent capacity; `Durability` the checkpoints.
"""

import concurrent.futures
import dataclasses
import os
import pathlib

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from models import lm
from runtime.cluster import devices as devices_lib
from runtime.cluster import multislice
from runtime.config.run import RunConfig
from runtime.errors import TrainingDiverged
from runtime.diloco.clock import Event, EventKind, make_clock
from runtime.diloco.durability import Durability
from runtime.diloco.ledger import Ledger
from runtime.diloco.learner.learner import ABSENT, DONE, DOWN, RECONFIGURING, TRAINING, WAITING
from runtime.diloco.membership import Membership, make_data_service, make_learners
from runtime.diloco.merge_schedule import IDLE, MergeSchedule
from runtime.diloco.profiling import RoundsProfile, annotate
from runtime.diloco.slices.several_slices import SeveralSlices
from runtime.diloco.rounds import Rounds
from runtime.diloco.run_log import RunLog
from runtime.diloco.slices.lifecycle import OneSlice, SliceLifecycle
from runtime.diloco.sync.syncer import Syncer
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
                                      run.num_slices + run.lent_slices)
    self.host_mesh = devices_lib.slice_mesh([devices_lib.host_device()])
    self.host_sharding = NamedSharding(self.host_mesh, P())
    real_trace = bool(f.trace) and run.clock.kind == "real"  # (the real clock injects a replayed trace's crashes)
    injector = (injection.Injector(run.learners + run.lent_slices, f.schedule)
                if f.schedule or f.mtbi_chip_seconds > 0 or real_trace else None)
    tx = inner_optimizer(run.inner, run.total_steps)
    data_service = make_data_service(run, exp)
    self.injector = injector
    self.learners = make_learners(run, exp, devices, injector, data_service)
    theta = jax.jit(lm.init_params, static_argnums=0, out_shardings=self.host_sharding)(
        run.model, jax.random.key(run.seed))
    codec = Codec(run.compression, theta) if run.compression.up != "none" else None
    mirrors = Mirrors(run.compression, theta) if run.compression.down != "none" else None
    self.syncer = Syncer(run.outer, theta, len(self.learners), run.overlap_steps, codec, mirrors, run.fragments)
    shares = [run.learner_batch(m) * run.learners / run.data.batch_size for m in range(len(self.learners))]
    self.clock = make_clock(run.clock, len(self.learners), run.seed, shares)
    self.links = Links(run, self.clock.transfer_seconds, self.syncer.trees.nbytes)
    self.ledger = Ledger(num_slices=run.num_slices)
    self.log: RunLog | None = None  # made when training starts (its logger resumes from a checkpoint)
    log = lambda: self.log
    # The collaborators, each owning its state; a later one reached from an earlier one only through a callback.
    self.merges = MergeSchedule(run, self.clock, self.learners, self.syncer, members=lambda: self.membership.members(),
                                host_sharding=self.host_sharding)
    self.slices = SliceLifecycle(
        run, devices, injector, self.clock, self.learners, self.syncer, self.ledger, log,
        write_off=lambda tokens: self.rounds.write_off(tokens), pull_theta=lambda l: self.rounds.pull_theta(l),
        maybe_merge=self.merges.maybe_merge, policy=SeveralSlices if run.slices_per_learner > 1 else OneSlice)
    self.rounds = Rounds(run, self.clock, self.learners, self.syncer, self.links, self.ledger, log, self.slices,
                         self.merges)
    self.membership = Membership(run, self.clock, self.learners, self.ledger, self.slices, data_service, log,
                                 tokens_dispatched=lambda: self.rounds.tokens_dispatched,
                                 write_off=self.rounds.write_off, maybe_merge=self.merges.maybe_merge)
    treedefs = dict(params=jax.tree.structure(theta), outer=jax.tree.structure(self.syncer.opt_state),
                    **{f"params/{p}": jax.tree.structure(self.syncer.trees.part(theta, p))
                       for p in range(run.fragments) if run.fragments > 1},
                    train=jax.tree.structure(jax.eval_shape(lambda p: init_state(p, tx), theta)))
    self.durability = Durability(run, workdir, name, treedefs, self.host_sharding, devices, self.clock, self.syncer,
                                 self.learners, self.merges, self.rounds, self.slices, self.links, self.ledger,
                                 self.membership, log)
    self.trail = saved.Trail(run, pathlib.Path(workdir) / name if workdir else None, name)
    self.profile = RoundsProfile(run.profile_rounds, pathlib.Path(workdir) / name / "profile" if workdir else None)
    self.event_time = 0.0  # when the event being handled happened
    self._handlers = {
        EventKind.PART_DONE: self._on_part_done, EventKind.PARAMS_ARRIVED: self.rounds.on_params_arrived,
        EventKind.REPORT_ARRIVED: self.rounds.on_report_arrived,
        EventKind.REPORT_TIMEOUT: self.rounds.on_report_timeout,
        EventKind.THETA_PULLED: self.rounds.on_theta_pulled, EventKind.RECONFIGURED: self.rounds.on_reconfigured,
        EventKind.MERGE_DUE: self.merges.on_merge_due, EventKind.MERGE_DONE: self._on_merge_done,
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
    saved_log = self.durability.restore()
    resume = dict(resume_after=saved_log["tokens_merged"], keep_records=saved_log["records"]) if saved_log else {}
    with make_logger(self.run, self.workdir, self.name, **resume) as logger:
      self.log = RunLog(self.run, self.exp, logger, self.name, self.host_mesh, self.links,
                        background_evals=self.run.clock.kind == "real")
      if saved_log is not None:
        self.log.restore(saved_log)
      else:
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
        learner.set_status(DONE, now)
      self.slices.settle()
      self.log.evaluate(self.syncer.params, self.syncer.version, self.clock.now(), self.clock.wall_stamp(), force=True)
      self.durability.finish()
      result = self.log.result(self.learners, self.ledger, now, self.clock.virtual_seconds(), self.syncer.params)
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
        done.result()

  def _loop(self, start: bool) -> None:
    if self.run.clock.kind == "real":
      self._warm_up()
    self.clock.resume()  # (the real clock's time starts here: set-up and compiles are not the run's)
    self.profile.start(self.learners)
    if start:
      starting = self.learners[:self.run.learners]  # learners of lent capacity join when it is lent
      for learner in starting:  # every learner has Θ before any starts (no device waits for another's copy)
        learner.reset(self.syncer.params, 0, 0.0)
      for learner in starting:
        self.rounds.start_round(learner)
    while self._work_scheduled() or self.syncer.pending:
      if preemption.requested():
        self._stop(preemption.requested())
      if not self._work_scheduled():
        self.merges.schedule(0.0)  # the budget is spent: merge what is left, quorum or not
      self.event_time, event = self.clock.next_event()  # (real clock: when it happened, maybe before now)
      kind = EventKind(event.kind)
      with annotate(f"controller/{kind.value}"):
        self._handlers[kind](event)
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
    work_left = self.rounds.work_left()  # else a repaired learner has nothing to do
    return (self.merges.state != IDLE or self.rounds.reports_in_transit > 0
            or any(l.status in (TRAINING, WAITING, RECONFIGURING) or (l.status == DOWN and work_left)
                   for l in self.learners))

  # Handlers of the controller's own ----------------------------------------------------------------

  def _on_part_done(self, event: Event) -> None:
    self.rounds.on_part_done(event, self.event_time)  # its busy time ends when its program finished

  def _on_merge_done(self, event: Event) -> None:
    made, reports, started = self.merges.finished(event)
    result, now = made.result, self.clock.now()
    self.syncer.commit(result, [v for l in self.learners for v in l.live_versions()])
    if self.syncer.divergence():
      raise TrainingDiverged(self.syncer.divergence())
    quarantined = dict(result.quarantined)
    answers = [self.syncer.answer(r, "quarantined" if r.learner in quarantined else "merged") for r in reports]
    answers = [dataclasses.replace(a, placed=made.placed[r.learner])  # Θ already on its slices
               if r.learner in made.placed and a.params is result.params else a for r, a in zip(reports, answers)]
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
        self.rounds.write_off(report.tokens)
        self.ledger.lost(report.busy_seconds)
      self.clock.after(transfer, Event(EventKind.PARAMS_ARRIVED, report.learner, answer))
    self.slices.settled()
    stamp = self.clock.wall_stamp()  # (wall times and host stage times: real clock only, never in modeled records)
    if stamp:
      stamp.update({f"host_{stage}": s for stage, s in made.stages.items()},
                   host_adopt_s=self.rounds.take_adopt_seconds())
    self.log.merge(result, reports, now, stamp, self.learners,
                   self.merges.grace_seconds(result.fragment), self.syncer.quorum(self.merges.able(result.fragment)),
                   self.ledger.goodput(now), made.lrs)
    self.log.evaluate(self.syncer.params, self.syncer.version, self.clock.now(), self.clock.wall_stamp())
    self.merges.maybe_merge()
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
