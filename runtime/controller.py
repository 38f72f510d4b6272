"""The single controller: dispatches learners' rounds, feeds the syncer, redistributes Θ.

One Python thread of control owns every slice. Each learner's round is an asynchronous device
program whose output arrays are its future; the clock hands completions back in the order they
happen (really, or in seeded virtual time). Merges run in the controller's worker thread while
learners keep training. A failed slice is just a removed future: its learner is marked down and
everyone else carries on.
"""

import concurrent.futures
import os
import time
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from models import lm
from runtime import devices as devices_lib
from runtime.clock import Event, make_clock
from runtime.config import RunConfig
from runtime.experiment import Experiment, RunResult, Stopwatch, make_logger
from runtime.goodput import Ema
from runtime.learner import DONE, DOWN, TRAINING, WAITING, Learner
from runtime.optim import inner_optimizer
from runtime.syncer import MergeResult, Report, Syncer

PyTree = Any


class Controller:
  """Runs Decoupled DiLoCo (or synchronous DiLoCo with quorum = M) to the token budget."""

  def __init__(self, run: RunConfig, exp: Experiment, workdir: str | os.PathLike | None, name: str,
               quarantine_factor: float = 100.0, max_delta_norm: float = 1e6):
    self.run, self.exp, self.workdir, self.name = run, exp, workdir, name
    slices = devices_lib.make_slices(devices_lib.controller_devices(run.num_devices), run.num_slices)
    host_mesh = devices_lib.slice_mesh([devices_lib.host_device()])
    self.host_mesh, self.host_sharding = host_mesh, NamedSharding(host_mesh, P())
    tx = inner_optimizer(run.inner, run.total_steps)
    per_learner = run.data.batch_size // run.learners
    self.learners = [Learner(m, slices[m], run, exp.shard(m, run.learners, per_learner), tx)
                     for m in range(run.learners)]
    self.spare_slices = slices[run.learners:]
    theta = jax.jit(lm.init_params, static_argnums=0, out_shardings=self.host_sharding)(
        run.model, jax.random.key(run.seed))
    self.param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(theta))
    self.syncer = Syncer(run.outer, theta, quarantine_factor, max_delta_norm)
    self.clock = make_clock(run.clock, run.learners, run.seed)
    self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="syncer")
    self.wall = Stopwatch()
    self.pending: list[Report] = []
    self.merge_state = "idle"  # "idle" | "scheduled" | "running"
    self.tokens_dispatched = self.tokens_merged = 0
    self.bytes_up = self.bytes_down = 0
    self.merges: list[dict] = []
    self.merge_times: list[float] = []
    self.eval_loss = float("nan")
    self._next_eval = run.eval_every * run.tokens_per_step
    self.xi_step, self.xi_quorum, self.xi_sync = (Ema(run.outer.ema_decay) for _ in range(3))
    self._handlers: dict[str, Callable[[Event], None]] = {
        "segment_done": self._on_segment_done, "report_arrived": self._on_report_arrived,
        "merge_due": self._on_merge_due, "merge_done": self._on_merge_done,
        "params_arrived": self._on_params_arrived,
    }

  # The event loop --------------------------------------------------------------

  def train(self) -> RunResult:
    """Runs to the token budget and a final merge; returns the summary."""
    with make_logger(self.run, self.workdir, self.name) as self.logger:
      for learner in self.learners:
        learner.reset(self.syncer.params, 0, 0.0)
        self._start_main(learner)
      while True:
        if not self.clock.pending():
          if not self.pending:
            break
          self._schedule_merge(0.0)  # the budget is spent: merge what is left, quorum or not
        _, event = self.clock.next_event()
        self._handlers[event.kind](event)
      for learner in self.learners:
        learner.set_status(DONE, self.clock.now())
        learner.close()
      self.pool.shutdown()
      self._evaluate(force=True)
      records = self.logger.records
    return self._result(records)

  # Learner side ------------------------------------------------------------------

  def _start_main(self, learner: Learner) -> None:
    self._dispatch(learner, "main", self.run.inner_steps - self.run.overlap_steps)

  def _dispatch(self, learner: Learner, kind: str, steps: int) -> bool:
    tokens = steps * learner.stream.tokens_per_batch
    if self.tokens_dispatched + tokens > self.run.token_budget:
      learner.set_status(DONE if kind == "main" else WAITING, self.clock.now())
      return False
    self.tokens_dispatched += tokens
    modeled = sum(self.clock.step_seconds(learner.index) for _ in range(steps))
    seg = learner.dispatch(kind, steps, self.clock.now(), modeled)
    self.clock.on_done((seg.state, seg.metrics), modeled, Event("segment_done", learner.index))
    return True

  def _on_segment_done(self, event: Event) -> None:
    learner, now = self.learners[event.learner], self.clock.now()
    seg = learner.collect(now)
    self.xi_step.update((seg.modeled_seconds or now - seg.started_at) / seg.steps)
    if seg.kind == "main":
      report = Report(learner.index, learner.params_to_host(self.host_sharding), learner.tokens, learner.steps,
                      learner.base_version, learner.last_loss, sent_at=now)
      learner.reported_position = learner.prefetcher.state()
      self.bytes_up += self.param_bytes
      self.clock.after(self.clock.transfer_seconds(self.param_bytes), Event("report_arrived", learner.index, report))
      if self.run.overlap_steps and self._dispatch(learner, "overlap", self.run.overlap_steps):
        return
      learner.set_status(WAITING, now)
    elif learner.inbox is not None:
      self._adopt(learner)
    else:
      learner.set_status(WAITING, now)

  def _on_params_arrived(self, event: Event) -> None:
    learner = self.learners[event.learner]
    learner.inbox = event.payload
    if learner.status == WAITING:
      self._adopt(learner)

  def _adopt(self, learner: Learner) -> None:
    """Applies the Θ in the learner's inbox and starts its next round."""
    version, theta, reset = learner.inbox
    now = self.clock.now()
    if reset:
      learner.reset(theta, version, now)
    else:
      overwrite = self.run.outer.receive == "overwrite"
      if overwrite and learner.steps:
        learner.rewind(learner.reported_position)  # overlap steps were discarded: serve their data again
      learner.receive(theta, version, 0.0 if overwrite else self.run.outer.mix_alpha, now)
    self._start_main(learner)

  # Syncer side -------------------------------------------------------------------

  def effective_quorum(self) -> int:
    """The quorum K, never more than the learners that can still report."""
    able = sum(l.status not in (DOWN, DONE) for l in self.learners)
    return max(1, min(self.run.outer.quorum, able))

  def _on_report_arrived(self, event: Event) -> None:
    report: Report = event.payload
    report.arrived_at = self.clock.now()
    self.pending.append(report)
    self._maybe_merge()

  def _maybe_merge(self) -> None:
    if self.merge_state == "idle" and len(self.pending) >= self.effective_quorum():
      first = min(r.sent_at for r in self.pending)
      self.xi_quorum.update(self.clock.now() - first)
      self._schedule_merge(self.grace_seconds())

  def grace_seconds(self) -> float:
    """Extra wait after quorum: fixed, or the learners' overlap slack not used by quorum and sync."""
    o = self.run.outer
    if o.grace == "fixed":
      return o.grace_seconds
    if o.grace == "adaptive":
      slack = self.run.overlap_steps * self.xi_step.value - self.xi_quorum.value - self.xi_sync.value
      return o.grace_gamma * max(slack, 0.0)
    return 0.0

  def _schedule_merge(self, delay: float) -> None:
    self.merge_state = "scheduled"
    self.clock.after(delay, Event("merge_due"))

  def _on_merge_due(self, event: Event) -> None:
    del event
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
    quarantined = {m for m, _ in result.quarantined}
    for report in reports:
      self.bytes_down += self.param_bytes
      payload = (self.syncer.version, self.syncer.params, report.learner in quarantined)
      self.clock.after(transfer, Event("params_arrived", report.learner, payload))
    self.tokens_merged += result.tokens
    self._log_merge(result, reports, now)
    self._evaluate()
    self._maybe_merge()

  # Metrics -------------------------------------------------------------------------

  def _log_merge(self, result: MergeResult, reports: list[Report], now: float) -> None:
    losses = [r.loss for r in reports if r.learner in result.merged]
    busy = [l.busy_fraction(now) for l in self.learners]
    record = dict(
        version=self.syncer.version, tokens=self.tokens_merged, time=now, **self._wall(),
        loss=float(np.mean(losses)) if losses else float("nan"), merged=list(result.merged),
        num_merged=len(result.merged), quarantined=[m for m, _ in result.quarantined],
        staleness=list(result.staleness), weights=list(result.weights), update_norm=result.update_norm,
        busy=busy, bytes_up=self.bytes_up, bytes_down=self.bytes_down, grace=self.grace_seconds(),
        quorum=self.effective_quorum())
    self.merges.append(self.logger.log("merge", record))
    self.merge_times.append(now)

  def _evaluate(self, force: bool = False) -> None:
    if force or self.tokens_merged >= self._next_eval:
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
    wall = self.wall()
    return RunResult(
        run=self.name, mode=self.run.mode, tokens=self.tokens_merged, final_eval_loss=self.eval_loss,
        wall_seconds=wall, virtual_seconds=now if self.clock.virtual else float("nan"),
        tokens_per_second=self.tokens_merged / wall, records=records, params=jax.device_get(self.syncer.params),
        extras=dict(merges=len(self.merges), learners_per_merge=float(np.mean(merged_counts or [0])),
                    busy_mean=float(np.mean(busy)), busy_min=float(np.min(busy)),
                    bytes_up=self.bytes_up, bytes_down=self.bytes_down),
        details=dict(busy=busy, intervals=[i for l in self.learners for i in l.intervals],
                     merge_times=list(self.merge_times)))


def train_diloco(run: RunConfig, exp: Experiment, workdir: str | os.PathLike | None, name: str) -> RunResult:
  """Decoupled (quorum K) or synchronous (K = M) DiLoCo under one controller."""
  return Controller(run, exp, workdir, name).train()
