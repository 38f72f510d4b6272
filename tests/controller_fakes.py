"""Stand-ins for learners, the syncer and the run log, so the controller's collaborators are tested on their own."""

import types

from runtime.diloco.learner.interface import Failure
from runtime.diloco.learner.lifecycle import ABSENT, DONE, DOWN, RECONFIGURING, TRAINING, WAITING


class FakeLearner:
  """A learner's bookkeeping without devices: what the collaborators ask of it, and what they did to it."""

  def __init__(self, index: int, slices=(), tokens_per_batch: int = 10):
    self.index, self.tokens_per_batch = index, tokens_per_batch
    self.slices, self.slice_index = tuple(slices), slices[0] if slices else -1
    self.status, self.reports_out, self.round, self.total_steps, self.tokens = WAITING, 0, 0, 0, 0
    self.parts, self.inbox = [], None
    self.device = types.SimpleNamespace(last_seconds=0.0)
    self.unmerged_tokens = 0  # what a failure writes off
    self.lost = None  # (a test sets it: the learner's process found ended)
    self.calls: list[tuple] = []

  def _move(self, status: str, now: float) -> None:
    self.status = status
    self.calls.append(("status", status, now))

  def finish(self, now: float) -> None:
    self._move(DONE, now)

  def wait(self, now: float) -> None:
    self._move(WAITING, now)

  def reconfigure(self, now: float) -> None:
    self._move(RECONFIGURING, now)

  def await_repair(self, now: float) -> None:
    self._move(DOWN, now)

  def parts_in_flight(self) -> int:
    return len(self.parts)

  def steps_in_flight(self) -> int:
    return sum(p.steps for p in self.parts)

  def process_lost(self) -> Exception | None:
    return self.lost

  def resume_kind(self) -> str:
    return self.parts[0].kind if self.parts else ""

  def has_theta(self) -> bool:
    return self.inbox is not None

  def newest_part(self) -> str:
    return self.parts[-1].kind if self.parts else ""

  def parts_end_at(self, seconds_per_step: float) -> float:
    return max(p.started_at + p.steps * seconds_per_step for p in self.parts)

  def seconds_per_step(self, part) -> float:
    return (part.modeled_seconds or self.device.last_seconds) / part.steps

  def fail(self, now: float, status: str = DOWN) -> Failure:
    failure = Failure(self.slice_index, "", self.unmerged_tokens, 1.5)
    self.status, self.slices, self.slice_index, self.lost = status, (), -1, None
    self.calls.append(("fail", status, now))
    return failure

  def give_back_unreported(self) -> None:
    self.calls.append(("give_back_unreported",))

  def leave(self, now: float) -> Failure:
    self.calls.append(("leave", now))
    failure = self.fail(now)
    self.status = ABSENT
    return failure

  def rejoin(self, slice_index, devices, theta_host, version, now: float) -> None:
    del devices, theta_host
    self.slices = slice_index if isinstance(slice_index, tuple) else (slice_index,)
    self.slice_index, self.status = self.slices[0], WAITING
    self.calls.append(("rejoin", self.slices, version, now))

  def lose_part(self, now: float) -> Failure:
    """One of its slices failed: it reconfigures, losing its part in flight (none here)."""
    self.reconfigure(now)
    return Failure(self.slice_index, "", 0, 0.0)

  def regroup(self, slices: tuple, groups) -> None:
    del groups
    self.slices, self.slice_index = slices, slices[0]
    self.calls.append(("regroup", slices))

  def join_schedule(self, total_steps: int) -> None:
    self.total_steps = total_steps

  def dispatch(self, kind: str, steps: int, now: float, modeled_seconds: float, armed: bool = False,
               schedule_at: int | None = None, ahead: int | None = None):
    del armed, schedule_at, ahead
    part = types.SimpleNamespace(kind=kind, steps=steps, tokens=steps * self.tokens_per_batch, started_at=now,
                                 modeled_seconds=modeled_seconds, queued_seconds=0.0, future=("state", "metrics"))
    self.parts.append(part)
    self.status = TRAINING
    self.calls.append(("dispatch", kind, steps, now))
    return part

  def collect(self, now: float):
    part = self.parts.pop(0)
    self.tokens += part.steps * self.tokens_per_batch
    self.calls.append(("collect", now))
    return part

  def capture_report(self) -> None:
    self.calls.append(("capture",))

  def report(self, now: float):
    return types.SimpleNamespace(learner=self.index, payload=None, fragment=0, tokens=self.tokens, busy_seconds=2.0,
                                 sent_at=now)

  def report_sent(self, report) -> None:
    del report
    self.reports_out += 1

  def owed_fragment(self) -> int:
    return 0

  def needs_theta_at(self, now: float, seconds_per_step: float) -> float:
    del seconds_per_step
    return now

  def theta_landing(self):
    return None  # (Θ is laid out nowhere ahead: it has no devices)


class FakeLog:
  """The run log's fault records, and the merges it was told of."""

  def __init__(self):
    self.faults: list[dict] = []
    self.merged_ranges: list = []
    self.merges: list[tuple] = []

  def fault(self, kind: str, learner: int, now: float, detail: str, **cost: float) -> None:
    self.faults.append(dict(fault=kind, learner=learner, time=now, detail=detail, **cost))

  def merged(self, report) -> None:
    self.merged_ranges.append(report.learner)

  def merge(self, result, reports, now, stamp, learners, grace, quorum, goodput, lrs) -> None:
    del stamp, learners, goodput, lrs
    self.merges.append((result, list(reports), now, grace, quorum))

  def evaluate(self, params, version, now, stamp, force=False) -> None:
    pass

  def spent(self, call: str, seconds: float) -> None:
    del call, seconds

  def adopted(self, seconds: float) -> None:
    pass

  def kinds(self) -> list[str]:
    return [f["fault"] for f in self.faults]


class FakeBudget:
  """The budget's losses, recorded (each fault in the log as the budget would), over a real ledger."""

  def __init__(self, clock, log: FakeLog, ledger, tokens_dispatched: int = 0, tokens_per_step: int = 1):
    self.clock, self.log, self.ledger = clock, log, ledger
    self.tokens_dispatched, self.tokens_per_step = tokens_dispatched, tokens_per_step
    self.lost: list[tuple[int, float]] = []

  def lose(self, tokens: int, seconds: float, fault=None) -> None:
    if fault is not None:
      self.log.fault(fault[0], fault[1], self.clock.now(), fault[2])
    self.lost.append((tokens, seconds))
    self.ledger.lost(seconds)

  def schedule_step(self) -> int:
    return self.tokens_dispatched // self.tokens_per_step


class FakePost:
  """Θ pulled or sent outside a merge: who, and when."""

  def __init__(self, clock):
    self.clock, self.pulled, self.sent = clock, [], []

  def pull(self, learner: int, round_: int) -> None:
    del round_
    self.pulled.append((learner, self.clock.now()))

  def send(self, learner: int, delivery) -> None:
    self.sent.append((learner, delivery))


class FakeSyncer:
  """Θ's version and the reports waiting; a quorum of `quorum` reports makes fragment 0 ready."""

  def __init__(self, quorum: int = 2):
    self.params, self.version, self.pending, self.quorum_size = "theta", 3, [], quorum
    self.trees, self.mirrors = types.SimpleNamespace(num=1), None
    self.computed: list[list] = []
    self.xi_step = types.SimpleNamespace(value=0.1)  # seconds per inner step

  def receive(self, report) -> None:
    self.pending.append(report)

  def ready(self, able: list[int]) -> int | None:
    del able
    return 0 if len(self.pending) >= self.quorum_size else None

  def observe_quorum(self, now: float, fragment: int) -> None:
    pass

  def grace_seconds(self, now: float, needs_theta_at: list[float]) -> float:
    del now, needs_theta_at
    return 1.0

  def take_pending(self, fragment):
    del fragment
    taken, self.pending = self.pending, []
    return taken

  def compute(self, reports, members: int):
    self.computed.append(list(reports))
    return types.SimpleNamespace(merged=(), reports=tuple(reports), members=members, quarantined=(), params=None,
                                 fragment=0)

  def compile_merges(self) -> None:
    pass

  def observe_round(self, seconds_per_step: float) -> None:
    pass

  def answer(self, report, verdict: str):
    return types.SimpleNamespace(payload=None, fragment=0, verdict=verdict, learner=report.learner, params=None)

  def commit(self, result, live) -> None:
    del live
    self.version += 1

  def adopted(self, learner: int) -> None:
    pass

  def divergence(self) -> str:
    return ""

  def observe_sync(self, seconds: float) -> None:
    pass

  def quorum(self, able: int) -> int:
    return min(self.quorum_size, able)

  def latest(self, round_: int):
    return types.SimpleNamespace(payload=None, fragment=0, verdict="latest", round=round_)
