"""The single controller: dispatches learners' rounds, feeds the syncer, redistributes Θ.

One Python thread of control owns every slice. Each learner's round is an asynchronous device
program whose output arrays are its future; the clock hands completions back in the order they
happen (really, or in seeded virtual time). Merges run in the controller's worker thread while
learners keep training. A failed slice is a removed future: its learner is marked down, its
unmerged work is written off, and everyone else carries on; it rejoins from the current Θ.
"""

import concurrent.futures
import os
from typing import Any, Callable

import jax
import numpy as np
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec as P

from models import lm
from runtime import devices as devices_lib
from runtime import faults as faults_lib
from runtime.clock import Event, make_clock
from runtime.config import RunConfig
from runtime.experiment import Experiment, RunResult, Stopwatch, make_logger
from runtime.goodput import Ema, Ledger
from runtime.learner import DONE, DOWN, TRAINING, WAITING, Delivery, Learner
from runtime.optim import inner_optimizer
from runtime.syncer import MergeResult, Report, Syncer

PyTree = Any


class Controller:
  """Runs Decoupled DiLoCo (or synchronous DiLoCo with quorum = M) to the token budget."""

  def __init__(self, run: RunConfig, exp: Experiment, workdir: str | os.PathLike | None, name: str):
    self.run, self.exp, self.workdir, self.name = run, exp, workdir, name
    f = run.faults
    self.slices = devices_lib.make_slices(devices_lib.controller_devices(run.num_devices), run.num_slices)
    host_mesh = devices_lib.slice_mesh([devices_lib.host_device()])
    self.host_mesh, self.host_sharding = host_mesh, NamedSharding(host_mesh, P())
    self.scheduled = faults_lib.parse_schedule(f.schedule, run.learners)
    # Step-scheduled crashes fire once: a learner that rejoins retrains from its last report and
    # passes the same step again.
    self.step_crashes = [x for x in self.scheduled if x.kind == "crash" and x.step >= 0]
    self._armed_step_crash: dict[int, faults_lib.Fault] = {}
    faulty = bool(self.scheduled) or f.mtbi_chip_seconds > 0
    self.injector = faults_lib.Injector(run.learners) if faulty else None
    tx = inner_optimizer(run.inner, run.total_steps)
    per_learner = run.data.batch_size // run.learners
    self.learners = [Learner(m, m, self.slices[m], run, exp.shard(m, run.learners, per_learner), tx, self.injector)
                     for m in range(run.learners)]
    self.spares = list(range(run.learners, len(self.slices)))  # healthy slices no learner uses
    self.waiting_for_slice: list[int] = []  # crashed learners with no slice yet, in crash order
    self.traces = [faults_lib.crash_times(f, s, run.seed) for s in range(len(self.slices))]
    theta = jax.jit(lm.init_params, static_argnums=0, out_shardings=self.host_sharding)(
        run.model, jax.random.key(run.seed))
    self.param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(theta))
    self.syncer = Syncer(run.outer, theta, run.learners, f.quarantine_factor, f.max_delta_norm)
    self.clock = make_clock(run.clock, run.learners, run.seed)
    self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="syncer")
    self.wall = Stopwatch()
    self.ledger = Ledger(num_slices=len(self.slices), chips_per_slice=f.chips_per_slice)
    self.pending: list[Report] = []
    self.merge_state = "idle"  # "idle" | "scheduled" | "running"
    self.tokens_dispatched = self.tokens_merged = 0
    self.bytes_up = self.bytes_down = 0
    self.merges: list[dict] = []
    self.merge_times: list[float] = []
    self.merged_ranges: list[tuple[int, int, int]] = []  # (learner, first batch, end batch) that reached Θ
    self.faults_seen: list[dict] = []
    self.link_down: dict[int, tuple[float, str]] = {}  # learner -> (until, "delay" | "drop")
    self._next_crash_time: dict[tuple[str, int], float] = {}  # ("slice" | "learner", index) -> time
    self._reports_in_transit = 0
    self._crashed_slices: set[int] = set()
    self._repairing: set[int] = set()  # slices that failed and are not back yet
    self.eval_loss = float("nan")
    self._evaluated_version = -1
    self._next_eval = run.eval_every * run.tokens_per_step
    self.xi_step, self.xi_quorum, self.xi_sync = (Ema(run.outer.ema_decay) for _ in range(3))
    self._handlers: dict[str, Callable[[Event], None]] = {
        "segment_done": self._on_segment_done, "report_arrived": self._on_report_arrived,
        "merge_due": self._on_merge_due, "merge_done": self._on_merge_done,
        "params_arrived": self._on_params_arrived, "slice_crash": self._on_slice_crash,
        "learner_crash": self._on_learner_crash, "slice_repaired": self._on_slice_repaired,
        "rejoin": self._on_rejoin, "straggler": self._on_straggler, "corrupt": self._on_corrupt,
        "link": self._on_link, "report_timeout": self._on_report_timeout,
    }

  # The event loop --------------------------------------------------------------

  def train(self) -> RunResult:
    """Runs to the token budget and a final merge; returns the summary."""
    with make_logger(self.run, self.workdir, self.name) as self.logger:
      self._schedule_faults()
      for learner in self.learners:
        learner.reset(self.syncer.params, 0, 0.0)
        self._start_main(learner)
      while not self._finished():
        if not self._work_scheduled():
          self._schedule_merge(0.0)  # the budget is spent: merge what is left, quorum or not
        _, event = self.clock.next_event()
        self._handlers[event.kind](event)
      now = self.clock.now()
      for learner in self.learners:
        learner.set_status(DONE, now)
        learner.close()
      self.pool.shutdown()
      self.clock.close()
      self._settle_crashed_slices()
      self._evaluate(force=True)
      records = self.logger.records
    return self._result(records)

  def _work_scheduled(self) -> bool:
    """True while a learner, a report or a merge is still on its way (fault timers don't count).

    A waiting learner always has something coming (Θ, or its report's timeout); a down one its repair.
    """
    work_left = self.tokens_dispatched < self.run.token_budget  # else a repaired learner has nothing to do
    return (self.merge_state != "idle" or self._reports_in_transit > 0
            or any(l.status in (TRAINING, WAITING) or (l.status == DOWN and work_left) for l in self.learners))

  def _finished(self) -> bool:
    return not self._work_scheduled() and not self.pending

  # Learner side ------------------------------------------------------------------

  def _start_main(self, learner: Learner) -> None:
    self._dispatch(learner, "main", self.run.inner_steps - self.run.overlap_steps)

  def _dispatch(self, learner: Learner, kind: str, steps: int) -> bool:
    tokens = steps * learner.stream.tokens_per_batch
    if self.tokens_dispatched + tokens > self.run.token_budget:
      learner.set_status(DONE if kind == "main" else WAITING, self.clock.now())
      return False
    now = self.clock.now()
    modeled = sum(self.clock.step_seconds(learner.index) for _ in range(steps))
    crash_at = self._arm_crash(learner, steps, modeled)
    try:
      seg = learner.dispatch(kind, steps, now, modeled)
    except Exception as error:  # pylint: disable=broad-except
      if crash_at is None:
        self._crash(learner, f"at dispatch: {_describe(error)}")
        return False
      # The armed program failed as it was enqueued; in modeled time the slice dies at crash_at.
      learner.failure = f"at dispatch: {_describe(error)}"
      return True
    self.tokens_dispatched += tokens
    self.clock.on_done((seg.state, seg.metrics), modeled, Event("segment_done", learner.index))
    return True

  def _arm_crash(self, learner: Learner, steps: int, modeled: float) -> float | None:
    """Arms the device program to fail where a crash of its slice falls; returns that modeled time."""
    if self.injector is None:
      return None
    self.injector.disarm(learner.index)
    self._armed_step_crash.pop(learner.index, None)
    first, now = learner.total_steps, self.clock.now()
    by_step = [f for f in self.step_crashes if f.learner == learner.index and first <= f.step < first + steps]
    if not self.clock.virtual:
      if by_step:
        fault = min(by_step, key=lambda f: f.step)
        self._armed_step_crash[learner.index] = fault
        self.injector.arm(learner.index, fault.step)
      return None
    at_time = min(self._next_crash_time.get(("learner", learner.index), float("inf")),
                  self._next_crash_time.get(("slice", learner.slice_index), float("inf")))
    candidates = [(now + (f.step - first) / steps * modeled, f.step, f) for f in by_step]
    if now <= at_time < now + modeled:
      candidates.append((at_time, first + int((at_time - now) / modeled * steps), None))
    if not candidates:
      return None
    crash_at, step, fault = min(candidates, key=lambda c: c[0])
    self.injector.arm(learner.index, step)
    if fault is not None:
      self._armed_step_crash[learner.index] = fault
      self.clock.after(crash_at - now, Event("learner_crash", learner.index, fault))
    return crash_at

  def _on_segment_done(self, event: Event) -> None:
    learner, now = self.learners[event.learner], self.clock.now()
    try:
      seg = learner.collect(now)
    except Exception as error:  # pylint: disable=broad-except
      self._crash(learner, f"awaiting its round: {_describe(error)}")
      return
    self.xi_step.update((seg.modeled_seconds or now - seg.started_at) / seg.steps)
    if seg.kind == "main":
      self._send_report(learner, now)
      if self.run.overlap_steps and self._dispatch(learner, "overlap", self.run.overlap_steps):
        return
      learner.set_status(WAITING, now)
    elif learner.inbox is not None:
      self._adopt(learner)
    else:
      learner.set_status(WAITING, now)

  def _send_report(self, learner: Learner, now: float) -> None:
    params = learner.params_to_host(self.host_sharding)
    if learner.corrupt_next:
      params, learner.corrupt_next = faults_lib.corrupt(params, learner.corrupt_next), ""
    report = Report(learner.index, params, learner.tokens, learner.steps, learner.base_version, learner.last_loss,
                    sent_at=now, data_start=learner.cycle_start, data_end=learner.prefetcher.state(),
                    busy_seconds=learner.cycle_busy, cycle=learner.cycle)
    self.bytes_up += self.param_bytes
    delay = self.clock.transfer_seconds(self.param_bytes)
    until, mode = self.link_down.get(learner.index, (-1.0, ""))
    if now < until and mode == "drop":  # as if never sent: the learner times out and trains it again
      self._record_fault("link_drop", learner.index, f"report of {report.tokens} tokens lost")
      self.ledger.lost(report.busy_seconds)
      self.clock.after(self.run.faults.report_timeout_seconds, Event("report_timeout", learner.index, report))
      return
    learner.reported_position, learner.reported_tokens = report.data_end, report.tokens
    learner.reports_out += 1
    if now < until:
      delay += until - now
    self._reports_in_transit += 1
    self.clock.after(delay, Event("report_arrived", learner.index, report))

  def _on_params_arrived(self, event: Event) -> None:
    learner = self.learners[event.learner]
    if learner.status == DOWN or event.payload.cycle != learner.cycle:
      return  # it pulls the current Θ when it rejoins; an answer to an old cycle is stale
    learner.inbox = event.payload
    if learner.status == WAITING:
      self._adopt(learner)

  def _adopt(self, learner: Learner) -> None:
    """Applies the Θ in the learner's inbox and starts its next round."""
    delivery, now = learner.inbox, self.clock.now()
    overwrite = self.run.outer.receive == "overwrite"
    unreported = learner.tokens - learner.reported_tokens  # overlap steps after the report
    if delivery.rewind_to is not None:
      learner.rewind(delivery.rewind_to)
      self._write_off(unreported)
    elif overwrite and unreported:
      learner.rewind(learner.reported_position)  # overlap steps were overwritten: serve their data again
      self._write_off(unreported)
    if delivery.reset:
      learner.reset(delivery.params, delivery.version, now)
    else:
      learner.receive(delivery.params, delivery.version, 0.0 if overwrite else self.run.outer.mix_alpha, now)
    self._start_main(learner)

  def _write_off(self, tokens: int) -> None:
    """Tokens trained on but lost before reaching Θ go back into the budget (their data is served again)."""
    self.tokens_dispatched -= tokens
    for learner in self.learners:
      if tokens and learner.status == DONE:  # finished learners take the returned budget
        learner.set_status(WAITING, self.clock.now())
        self._start_main(learner)

  # Syncer side -------------------------------------------------------------------

  def effective_quorum(self) -> int:
    """The quorum K, never more than the learners that can still report."""
    able = sum(l.status not in (DOWN, DONE) for l in self.learners)
    return max(1, min(self.run.outer.quorum, able))

  def _on_report_arrived(self, event: Event) -> None:
    report: Report = event.payload
    self._reports_in_transit -= 1
    report.arrived_at = self.clock.now()
    self.pending.append(report)
    self._maybe_merge()

  def _maybe_merge(self) -> None:
    if self.merge_state == "idle" and self.pending and len(self.pending) >= self.effective_quorum():
      first = min(r.sent_at for r in self.pending)
      self.xi_quorum.update(self.clock.now() - first)
      self._schedule_merge(self.grace_seconds())

  def grace_seconds(self) -> float:
    """Extra wait after quorum: fixed, or the learners' overlap slack not used by quorum and sync."""
    o = self.run.outer
    if o.grace == "fixed":
      grace = o.grace_seconds
    elif o.grace == "adaptive":
      slack = self.run.overlap_steps * self.xi_step.value - self.xi_quorum.value - self.xi_sync.value
      grace = o.grace_gamma * max(slack, 0.0)
    else:
      return 0.0
    # Never past the moment a reporting learner finishes its overlap and would wait for Θ.
    now = self.clock.now()
    deadlines = [self._overlap_end(self.learners[r.learner]) - now - self.xi_sync.value for r in self.pending]
    return max(0.0, min([grace, *deadlines]))

  def _overlap_end(self, learner: Learner) -> float:
    """When the learner will need Θ: the end of its overlap segment (now, if it is already waiting)."""
    seg = learner.inflight
    if seg is None or seg.kind != "overlap":
      return self.clock.now()
    return seg.started_at + (seg.modeled_seconds if self.clock.virtual else seg.steps * self.xi_step.value)

  def _schedule_merge(self, delay: float) -> None:
    self.merge_state = "scheduled"
    self.clock.after(delay, Event("merge_due"))

  def _on_merge_due(self, event: Event) -> None:
    del event
    if not self.pending:
      self.merge_state = "idle"
      return
    reports, self.pending = self.pending, []
    self.merge_state = "running"
    future = self.pool.submit(self.syncer.compute, reports)
    self.clock.on_done(future, self.run.clock.merge_seconds,
                       Event("merge_done", payload=(future, reports, self.clock.now())))

  def _on_merge_done(self, event: Event) -> None:
    future, reports, started = event.payload
    result: MergeResult = future.result()
    now = self.clock.now()
    self.syncer.commit(result, [l.base_version for l in self.learners])
    self.merge_state = "idle"
    transfer = self.clock.transfer_seconds(self.param_bytes)
    self.xi_sync.update(2 * transfer + now - started)  # report up, merge, Θ down
    quarantined = dict(result.quarantined)
    for report in reports:
      learner = self.learners[report.learner]
      learner.reports_out -= 1
      if report.learner in quarantined:
        self._record_fault("quarantine", report.learner, quarantined[report.learner])
        self._write_off(report.tokens)
        self.ledger.lost(report.busy_seconds)
        if learner.cycle == report.cycle:
          learner.reported_position = report.data_start  # its data is trained again, even after a crash
        delivery = Delivery(self.syncer.version, self.syncer.params, report.cycle, reset=True,
                            rewind_to=report.data_start)
      else:
        self.merged_ranges.append((report.learner, report.data_start["position"], report.data_end["position"]))
        self.ledger.useful(report.busy_seconds)
        delivery = Delivery(self.syncer.version, self.syncer.params, report.cycle)
      self.bytes_down += self.param_bytes
      self.clock.after(transfer, Event("params_arrived", report.learner, delivery))
    self.tokens_merged += result.tokens
    for learner in self.learners:
      if learner.rejoin_slice is not None and not learner.reports_out:
        self._rejoin(learner, learner.rejoin_slice)
    self._log_merge(result, reports, now)
    self._evaluate()
    self._maybe_merge()

  # Faults --------------------------------------------------------------------------

  def _schedule_faults(self) -> None:
    for s in range(len(self.slices)):
      self._schedule_slice_crash(s)
    for fault in self.scheduled:
      if fault.time < 0:
        continue  # step-scheduled crashes are armed at dispatch
      if fault.kind == "crash":
        self._next_crash_time[("learner", fault.learner)] = fault.time
        self.clock.after(fault.time, Event("learner_crash", fault.learner, fault))
      elif fault.kind == "straggler":
        self.clock.after(fault.time, Event("straggler", fault.learner, fault.factor))
        self.clock.after(fault.time + fault.duration, Event("straggler", fault.learner, 1.0))
      elif fault.kind == "corrupt":
        self.clock.after(fault.time, Event("corrupt", fault.learner, fault.how))
      else:
        self.clock.after(fault.time, Event("link", fault.learner, (fault.time + fault.duration, fault.mode)))

  def _schedule_slice_crash(self, slice_index: int) -> None:
    at = next(self.traces[slice_index], None)
    if at is not None:
      self._next_crash_time[("slice", slice_index)] = at
      self.clock.after(at - self.clock.now(), Event("slice_crash", payload=slice_index))

  def _on_slice_crash(self, event: Event) -> None:
    s = event.payload
    self._next_crash_time.pop(("slice", s), None)
    owner = next((l for l in self.learners if l.slice_index == s and l.status != DOWN), None)
    if owner is not None:
      self._crash(owner, "slice interrupted", repair=self.run.faults.repair_seconds)
    else:
      holder = next((l for l in self.learners if l.rejoin_slice == s), None)
      if holder is not None:  # held for a rejoin that had not happened yet: wait for the next slice
        holder.rejoin_slice = None
        self.waiting_for_slice.insert(0, holder.index)
      if s in self.spares:
        self.spares.remove(s)
      self._repairing.add(s)
      self.clock.after(self.run.faults.repair_seconds, Event("slice_repaired", payload=s))

  def _on_learner_crash(self, event: Event) -> None:
    self._next_crash_time.pop(("learner", event.learner), None)
    learner = self.learners[event.learner]
    if learner.status not in (DOWN, DONE):
      repair = event.payload.repair if event.payload.repair >= 0 else self.run.faults.repair_seconds
      self._crash(learner, "scheduled crash", repair=repair)

  def _crash(self, learner: Learner, why: str, repair: float | None = None) -> None:
    """Removes the learner's future, writes off its unmerged work, and arranges its return."""
    now, m = self.clock.now(), learner.index
    if learner.inflight is not None and self.injector is not None and self.clock.virtual:
      try:
        learner.collect(now)  # the armed program fails here, a genuine device error
        why += " (its round had completed)"
      except Exception as error:  # pylint: disable=broad-except
        why += f", awaiting its round: {_describe(error)}"
    elif learner.failure:
      why += f", {learner.failure}"
    learner.failure = ""
    fired = self._armed_step_crash.pop(m, None)
    if fired is not None:
      self.step_crashes.remove(fired)
    lost = learner.drop_inflight()
    self._write_off(lost + learner.tokens - learner.reported_tokens)
    if not learner.reported_tokens:
      self.ledger.lost(learner.cycle_busy)
    if self.injector:
      self.injector.disarm(m)
    self.clock.cancel(lambda e: e.learner == m and e.kind in ("segment_done", "params_arrived"))
    learner.inbox = None
    learner.set_status(DOWN, now)
    self._record_fault("crash", m, why)
    logging.info("learner %d down at t=%.1f: %s", m, now, why)
    failed = learner.slice_index
    self._crashed_slices.add(failed)
    repair = self.run.faults.repair_seconds if repair is None else repair
    self._repairing.add(failed)
    self.clock.after(repair, Event("slice_repaired", payload=failed))
    learner.slice_index = -1
    if self.spares:
      spare = self.spares.pop(0)
      self.clock.after(self.run.faults.spare_swap_seconds, Event("rejoin", m, spare))
    else:
      self.waiting_for_slice.append(m)
    self._maybe_merge()

  def _settle_crashed_slices(self) -> None:
    """Runs one clean effectful program on every slice that crashed, so the failed program's error
    token is replaced now rather than re-raised by JAX at interpreter exit."""
    for s in sorted(self._crashed_slices if self.injector else ()):
      mesh = devices_lib.slice_mesh(self.slices[s])
      self.injector.disarm(0)
      check = jax.jit(faults_lib.device_check(self.injector, 0, mesh))
      jax.block_until_ready(check(jax.device_put(np.int32(-1), NamedSharding(mesh, P()))))
    self._crashed_slices.clear()

  def _on_slice_repaired(self, event: Event) -> None:
    s = event.payload
    self._repairing.discard(s)
    self._schedule_slice_crash(s)
    if self.waiting_for_slice:
      self._rejoin(self.learners[self.waiting_for_slice.pop(0)], s)
    else:
      self.spares.append(s)

  def _on_rejoin(self, event: Event) -> None:
    self._rejoin(self.learners[event.learner], event.payload)

  def _rejoin(self, learner: Learner, slice_index: int) -> None:
    """The learner comes back on a healthy slice: current Θ, fresh inner state, data after its last report.

    While a report it sent before failing is still on its way, the rejoin waits for that report's
    merge: if the syncer quarantines it, its data must be served again, so where the shard resumes
    is only known then.
    """
    if slice_index in self._repairing:  # the spare failed during the swap: wait for the next slice
      learner.rejoin_slice = None
      self.waiting_for_slice.insert(0, learner.index)
      return
    learner.rejoin_slice = slice_index if learner.reports_out else None
    if learner.rejoin_slice is not None:
      return
    if slice_index != learner.slice_index:
      learner.move_to(slice_index, self.slices[slice_index])
    learner.rewind(learner.reported_position)
    learner.reset(self.syncer.params, self.syncer.version, self.clock.now())
    self._record_fault("rejoin", learner.index, f"on slice {slice_index}")
    self._start_main(learner)

  def _on_straggler(self, event: Event) -> None:
    self.clock.set_slowdown(event.learner, event.payload)
    self._record_fault("straggler", event.learner, f"slowdown x{event.payload:g}")

  def _on_corrupt(self, event: Event) -> None:
    self.learners[event.learner].corrupt_next = event.payload
    self._record_fault("corrupt", event.learner, f"next report: {event.payload}")

  def _on_link(self, event: Event) -> None:
    self.link_down[event.learner] = event.payload
    self._record_fault("link", event.learner, f"{event.payload[1]} until t={event.payload[0]:g}")

  def _on_report_timeout(self, event: Event) -> None:
    """A learner whose report was lost pulls the current Θ and trains that data again."""
    learner, report = self.learners[event.learner], event.payload
    self._on_params_arrived(Event("params_arrived", learner.index, Delivery(
        self.syncer.version, self.syncer.params, report.cycle, rewind_to=report.data_start)))

  def _record_fault(self, kind: str, learner: int, detail: str) -> None:
    self.faults_seen.append(self.logger.log("fault", dict(fault=kind, learner=learner, time=self.clock.now(),
                                                          detail=detail)))

  # Metrics -------------------------------------------------------------------------

  def _log_merge(self, result: MergeResult, reports: list[Report], now: float) -> None:
    losses = [r.loss for r in reports if r.learner in result.merged]
    record = dict(
        version=self.syncer.version, tokens=self.tokens_merged, time=now, **self._wall(),
        loss=float(np.mean(losses)) if losses else float("nan"), merged=list(result.merged),
        num_merged=len(result.merged), quarantined=[m for m, _ in result.quarantined],
        staleness=list(result.staleness), weights=list(result.weights), update_norm=result.update_norm,
        busy=[l.busy_fraction(now) for l in self.learners], bytes_up=self.bytes_up, bytes_down=self.bytes_down,
        grace=self.grace_seconds(), quorum=self.effective_quorum(),
        goodput=self.ledger.goodput(now), alive=sum(l.status != DOWN for l in self.learners))
    self.merges.append(self.logger.log("merge", record))
    self.merge_times.append(now)

  def _evaluate(self, force: bool = False) -> None:
    """Evaluates Θ when the merged tokens pass the next eval point, or now if forced (once per version)."""
    if force and self._evaluated_version == self.syncer.version:
      return
    if force or self.tokens_merged >= self._next_eval:
      self._evaluated_version = self.syncer.version
      while self._next_eval <= self.tokens_merged:
        self._next_eval += self.run.eval_every * self.run.tokens_per_step
      self.eval_loss = self.exp.evaluate(self.syncer.params, self.host_mesh)
      self.logger.log("eval", dict(version=self.syncer.version, tokens=self.tokens_merged, time=self.clock.now(),
                                   eval_loss=self.eval_loss, **self._wall()))

  def _wall(self) -> dict:
    """Wall seconds, only under the real clock: virtual-time metrics must be bit-reproducible."""
    return {} if self.clock.virtual else {"wall": self.wall()}

  def _result(self, records: list[dict]) -> RunResult:
    now = max(self.clock.now(), 1e-9)
    busy = [l.busy_fraction(now) for l in self.learners]
    merged_counts = [m["num_merged"] for m in self.merges if m["num_merged"]]
    intervals = [i for l in self.learners for i in l.intervals]
    wall = self.wall()
    return RunResult(
        run=self.name, mode=self.run.mode, tokens=self.tokens_merged, final_eval_loss=self.eval_loss,
        wall_seconds=wall, virtual_seconds=now if self.clock.virtual else float("nan"),
        tokens_per_second=self.tokens_merged / wall, records=records, params=jax.device_get(self.syncer.params),
        extras=dict(merges=len(self.merges), learners_per_merge=float(np.mean(merged_counts or [0])),
                    busy_mean=float(np.mean(busy)), busy_min=float(np.min(busy)),
                    goodput=self.ledger.goodput(now), uptime=_uptime(intervals, now),
                    faults=sum(f["fault"] in ("crash", "straggler", "corrupt", "link") for f in self.faults_seen),
                    bytes_up=self.bytes_up, bytes_down=self.bytes_down),
        details=dict(busy=busy, intervals=intervals, merge_times=list(self.merge_times),
                     merged_ranges=list(self.merged_ranges), faults=list(self.faults_seen),
                     completions=[list(l.completions) for l in self.learners]))


def _describe(error: Exception) -> str:
  """The error's type and the last line of its message (callback errors carry a whole traceback)."""
  lines = str(error).strip().splitlines() or [""]
  return f"{type(error).__name__}: {lines[-1]}"


def _uptime(intervals: list[tuple[str, float, float, str]], end: float) -> float:
  """Fraction of [0, end] during which at least one learner was training toward Θ."""
  spans = sorted((a, b) for _, a, b, state in intervals if state == TRAINING)
  covered, reach = 0.0, 0.0
  for a, b in spans:
    if b > reach:
      covered += b - max(a, reach)
      reach = b
  return covered / end if end > 0 else 1.0


def train_diloco(run: RunConfig, exp: Experiment, workdir: str | os.PathLike | None, name: str) -> RunResult:
  """Decoupled (quorum K) or synchronous (K = M) DiLoCo under one controller."""
  return Controller(run, exp, workdir, name).train()
