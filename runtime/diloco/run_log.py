"""What a Decoupled DiLoCo run records: merge, eval and fault records as they happen, and its summary."""

import concurrent.futures
import math
import time
from typing import Any, Sequence

import jax
import numpy as np

from runtime.config.run import RunConfig
from runtime.diloco.learner.interface import LearnerPort
from runtime.diloco.learner.lifecycle import ABSENT, DOWN, FAILED, TRAINING
from runtime.diloco.ledger import Ledger, uptime
from runtime.network.links import Links
from runtime.diloco.sync.messages import Report
from runtime.diloco.sync.syncer import MergeResult
from runtime.train.harness import Experiment, RunResult, Stopwatch, run_time_kind
from runtime.reporting.metrics import MetricsLogger
from runtime.config import network as links_config
from runtime.periodic import Marks

PyTree = Any
# Fault records that count as injected faults (the rest are their consequences: rejoin, expand, quarantine, ...);
# a shrink is the crash of one slice of a learner that reconfigures.
INJECTED = ("crash", "shrink", "straggler", "corrupt", "link", "program_error")


class RunLog:
  """Tallies of what reached Θ (tokens, bytes, data ranges) and the records the run writes."""

  def __init__(self, run: RunConfig, exp: Experiment, name: str, mesh: jax.sharding.Mesh, links: Links,
               background_evals: bool = False):
    self.run, self.exp, self.name, self.mesh, self.links = run, exp, name, mesh, links
    self.logger: MetricsLogger | None = None  # the records' writer, open while the run trains (`open`)
    # Evaluations off the controller thread (real time), so that no dispatch waits behind one; in virtual
    # time they run inline, where they cost no modeled time and keep the records' order reproducible.
    self._evaluator = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="eval") if background_evals else None
    self._evals: list[tuple[concurrent.futures.Future, dict]] = []  # submitted, not yet recorded
    self.wall = Stopwatch()  # (restarted when the run opens its records, from a resumed run's seconds)
    self._wall_before = 0.0
    self.tokens_merged = 0
    self.merges: list[dict] = []
    self.merged_ranges: list[tuple[int, int, int]] = []  # (learner, first batch, end batch) that reached Θ
    self.faults: list[dict] = []
    self.eval_loss = float("nan")
    self._evaluated_version = -1
    self._eval_marks = Marks(run.eval_every * run.tokens_per_step)
    self._adopt_seconds: list[float] = []  # host time of each adoption since the last merge record
    # Since the last merge record (real clock): the controller's host seconds in learners' `report` and `deliver`
    # calls (a learner in another process: its report's and Θ's way), and its thread's CPU seconds
    self._calls = dict.fromkeys(("report", "deliver"), 0.0)
    self._cpu_mark = time.thread_time()

  def open(self, logger: MetricsLogger) -> None:
    """Records go to `logger` from now on (it keeps the records of a resumed run, which the tallies continue)."""
    self.logger, self.wall = logger, Stopwatch(self._wall_before)
    self._cpu_mark = time.thread_time()  # (the controller's thread opens the records and runs the loop)
    self.merges = [r for r in logger.records if r["kind"] == "merge"]
    self.faults = [r for r in logger.records if r["kind"] == "fault"]

  def adopted(self, seconds: float) -> None:
    """A learner adopted Θ in `seconds` of host time."""
    self._adopt_seconds.append(seconds)

  def spent(self, call: str, seconds: float) -> None:
    """The controller spent `seconds` of host time in a learner's `call` ("report" or "deliver")."""
    self._calls[call] += seconds

  def take_host_seconds(self) -> dict[str, float]:
    """For the merge record (real clock), since the last one: the host seconds in learners' report and deliver calls,
    and the controller thread's CPU seconds (called on that thread)."""
    cpu, self._cpu_mark = time.thread_time() - self._cpu_mark, time.thread_time()
    taken = {f"host_{call}_s": seconds for call, seconds in self._calls.items()}
    self._calls = dict.fromkeys(self._calls, 0.0)
    return dict(taken, host_controller_cpu_s=cpu)

  def take_adopt_seconds(self) -> float:
    """The mean host time of the adoptions since the last call (NaN if none), for the merge record."""
    seconds, self._adopt_seconds = self._adopt_seconds, []
    return sum(seconds) / len(seconds) if seconds else float("nan")

  def fault(self, kind: str, learner: int, now: float, detail: str, **cost: float) -> None:
    """A fault's record; `cost`: what work it lost (Budget.lose: tokens_written_off, slice_seconds_lost)."""
    self.faults.append(self.logger.log("fault", dict(fault=kind, learner=learner, time=now, detail=detail, **cost)))

  def merged(self, report: Report) -> None:
    """The report's data reached Θ."""
    self.merged_ranges.append((report.learner, report.data_start["position"], report.data_end["position"]))

  def merge(self, result: MergeResult, reports: Sequence[Report], now: float, stamp: dict,
            learners: Sequence[LearnerPort], grace: float, quorum: int, goodput: float, lrs: Sequence[float]) -> None:
    """The record of one outer step, with the learners' state at its end.

    Per merged learner, in the order of `merged`: its round's mean train loss (`losses`, their mean is `loss`)
    and the inner learning rate of its last step (`lr`, `lrs`: the merge worker evaluates them).
    """
    self.tokens_merged += result.tokens
    kept = [r for r in reports if r.learner in result.merged]
    losses = [r.loss for r in kept]
    record = dict(
        version=result.version, tokens=self.tokens_merged, time=now, **stamp,
        loss=float(np.mean(losses)) if losses else float("nan"), merged=list(result.merged), losses=losses,
        lr=list(lrs),
        num_merged=len(result.merged), quarantined=[m for m, _ in result.quarantined],
        staleness=list(result.staleness), weights=list(result.weights), update_norm=result.update_norm,
        busy=[l.busy_fraction(now) for l in learners], bytes_up=self.links.bytes_up,
        bytes_down=self.links.bytes_down, grace=grace, quorum=quorum, goodput=goodput,
        alive=sum(l.status not in (DOWN, FAILED, ABSENT) for l in learners))
    if self.run.fragments > 1:  # (recorded runs, of one fragment, keep their records)
      record.update(fragment=result.fragment)
    if links_config.active(self.run.links):  # off by default: recorded runs keep their records
      record.update(self._link_fields(reports))
    self.merges.append(self.logger.log("merge", record))

  def _link_fields(self, reports: Sequence[Report]) -> dict:
    """Bytes of this merge's reports up and of Θ down to each, whether each crossed regions, and the totals."""
    return dict(up_bytes=[self.links.report_bytes(r.payload, r.fragment) for r in reports],
                down_bytes=self.links.down_bytes([r.learner for r in reports]),
                crossed=[self.links.paths.crosses(r.learner) for r in reports],
                cross_bytes_up=self.links.cross_up, cross_bytes_down=self.links.cross_down)

  def evaluate(self, params: PyTree, version: int, now: float, stamp: dict, force: bool = False) -> None:
    """Evaluates Θ when the merged tokens pass the next eval point, or now if forced (once per version)."""
    if force and self._evaluated_version == version:
      return
    if force or self._eval_marks.reached(self.tokens_merged):
      self._evaluated_version = version
      self._eval_marks.advance_past(self.tokens_merged)
      record = dict(version=version, tokens=self.tokens_merged, time=now, **stamp)
      # Θ evaluated on the host: with the syncer in shards its tensors are gathered there first (a copy)
      params = jax.device_put(params, jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec()))
      if self._evaluator is None or force:
        self.record_evals(wait=True)
        self._record_eval(self.exp.evaluate(params, self.mesh), record)
      else:
        self._evals.append((self._evaluator.submit(self.exp.evaluate, params, self.mesh), record))
    self.record_evals(wait=False)

  def record_evals(self, wait: bool) -> None:
    """Writes the records of finished background evaluations, in order (all of them if `wait`)."""
    while self._evals and (wait or self._evals[0][0].done()):
      future, record = self._evals.pop(0)
      self._record_eval(future.result(), record)

  def close(self) -> None:
    self.record_evals(wait=True)
    if self._evaluator is not None:
      self._evaluator.shutdown()

  def snapshot(self, packer=None) -> dict:
    """The tallies and how many records were written (background evaluations are recorded first)."""
    del packer  # (plain data)
    self.record_evals(wait=True)
    return dict(tokens_merged=self.tokens_merged, merged_ranges=self.merged_ranges, eval_loss=self.eval_loss,
                evaluated_version=self._evaluated_version, next_eval=self._eval_marks.next, wall=self.wall(),
                records=len(self.logger.records))

  def restore(self, saved: dict, unpacker=None) -> None:
    """The tallies as saved (the merge and fault records are those the logger keeps: `open`)."""
    del unpacker
    self.tokens_merged, self.eval_loss = saved["tokens_merged"], saved["eval_loss"]
    self.merged_ranges = [tuple(r) for r in saved["merged_ranges"]]
    self._evaluated_version, self._eval_marks.next = saved["evaluated_version"], saved["next_eval"]
    self._wall_before = saved["wall"]

  def _record_eval(self, loss: float, record: dict) -> None:
    self.eval_loss = loss
    self.logger.log("eval", dict(record, **self.exp.eval_fields(loss)))

  def result(self, learners: Sequence[LearnerPort], ledger: Ledger, now: float, virtual_seconds: float,
             params: PyTree) -> RunResult:
    """The run's summary row and the per-learner details behind it."""
    now = max(now, 1e-9)
    present = [l for l in learners if l.completions or any(i[3] != ABSENT for i in l.intervals)]  # lent: if ever
    busy = [l.busy_fraction(now) for l in present]
    idle = [x for x in (l.device_idle() for l in present) if not math.isnan(x)] or [math.nan]
    merged_counts = [m["num_merged"] for m in self.merges if m["num_merged"]]
    intervals = [i for l in learners for i in l.intervals]
    wall = self.wall()
    return RunResult(
        run=self.name, mode=self.run.mode, tokens=self.tokens_merged, final_eval_loss=self.eval_loss,
        wall_seconds=wall, virtual_seconds=virtual_seconds, tokens_per_second=self.tokens_merged / wall,
        records=self.logger.records, params=jax.device_get(params), time_kind=run_time_kind(self.run),
        extras=dict(merges=len(self.merges), learners_per_merge=float(np.mean(merged_counts or [0])),
                    gathered=float(np.mean([n > 1 for n in merged_counts] or [0])),
                    busy_mean=float(np.mean(busy)), busy_min=float(np.min(busy)),
                    device_idle_max=float(np.max(idle)), device_idle_mean=float(np.mean(idle)),
                    goodput=ledger.goodput(now), tokens_written_off=ledger.lost_tokens,
                    slice_seconds_lost=ledger.lost_seconds,
                    uptime=uptime([(a, b) for _, a, b, state in intervals if state == TRAINING], now),
                    faults=sum(f["fault"] in INJECTED for f in self.faults),
                    bytes_up=self.links.bytes_up, bytes_down=self.links.bytes_down,
                    bytes_per_report=self.links.bytes_up / max(self.links.reports_up, 1),
                    bytes_per_token=(self.links.bytes_up + self.links.bytes_down) / max(self.tokens_merged, 1),
                    **traffic(self.links, self.tokens_merged), **self._real_time(learners, now)),
        details=dict(busy=busy, device_idle=idle, intervals=intervals, merge_times=[m["time"] for m in self.merges],
                     merged_ranges=list(self.merged_ranges), faults=list(self.faults),
                     completions=[list(l.completions) for l in learners]))

  def _real_time(self, learners: Sequence[LearnerPort], now: float) -> dict:
    """Under the real clock: the run's seconds (from its first part) and the mean wall seconds of an inner step."""
    if self.run.clock.kind != "real":
      return {}
    steps, busy = sum(l.total_steps for l in learners), sum(l.busy_seconds for l in learners)
    return dict(run_seconds=now, step_seconds=busy / steps if steps else math.nan)


def traffic(links: Links, tokens: int) -> dict:
  """Cross-region bytes per trained token (in all, and up alone) and the peak bytes in flight."""
  per_learner, total = links.peaks()
  return dict(cross_bytes_per_token=(links.cross_up + links.cross_down) / max(tokens, 1),
              cross_up_bytes_per_token=links.cross_up / max(tokens, 1),
              peak_in_flight_learner=per_learner, peak_in_flight_total=total)
