"""Stand-ins for learners, the syncer and the run log, so the controller's collaborators are tested on their own."""

import types

from runtime.diloco.learner.learner import ABSENT, DOWN, RECONFIGURING, TRAINING, WAITING
from runtime.diloco.sync.messages import Failure


class FakeLearner:
  """A learner's bookkeeping without devices: what the collaborators ask of it, and what they did to it."""

  def __init__(self, index: int, slices=(), tokens_per_batch: int = 10):
    self.index, self.tokens_per_batch = index, tokens_per_batch
    self.slices, self.slice_index = tuple(slices), slices[0] if slices else -1
    self.status, self.reports_out, self.round, self.total_steps, self.tokens = WAITING, 0, 0, 0, 0
    self.parts, self.inbox = [], None
    self.device = types.SimpleNamespace(last_seconds=0.0)
    self.unmerged_tokens = 0  # what a failure writes off
    self.calls: list[tuple] = []

  def set_status(self, status: str, now: float) -> None:
    self.status = status
    self.calls.append(("status", status, now))

  def fail(self, now: float, status: str = DOWN) -> Failure:
    failure = Failure(self.slice_index, "", self.unmerged_tokens, 1.5)
    self.status, self.slices, self.slice_index = status, (), -1
    self.calls.append(("fail", status, now))
    return failure

  def leave(self, now: float) -> Failure:
    self.calls.append(("leave", now))
    failure = self.fail(now)
    self.status = ABSENT
    return failure

  def rejoin(self, slices, devices, theta, version, now: float) -> None:
    del devices, theta
    self.slices = slices if isinstance(slices, tuple) else (slices,)
    self.slice_index, self.status = self.slices[0], WAITING
    self.calls.append(("rejoin", self.slices, version, now))

  def lose_part(self, now: float) -> Failure:
    """One of its slices failed: it reconfigures, losing its part in flight (none here)."""
    self.set_status(RECONFIGURING, now)
    return Failure(self.slice_index, "", 0, 0.0)

  def regroup(self, slices: tuple, devices) -> None:
    del devices
    self.slices, self.slice_index = slices, slices[0]
    self.calls.append(("regroup", slices))

  def join_schedule(self, total_steps: int) -> None:
    self.total_steps = total_steps

  inflight = property(lambda self: self.parts[0] if self.parts else None)

  def dispatch(self, kind: str, steps: int, now: float, modeled_seconds: float, armed: bool = False,
               schedule_at: int | None = None):
    del armed, schedule_at
    part = types.SimpleNamespace(kind=kind, steps=steps, started_at=now, modeled_seconds=modeled_seconds,
                                 state="state", metrics="metrics", queued_seconds=0.0)
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


class FakeLog:
  """The run log's fault records."""

  def __init__(self):
    self.faults: list[dict] = []
    self.merged_ranges: list = []

  def fault(self, kind: str, learner: int, now: float, detail: str) -> None:
    self.faults.append(dict(fault=kind, learner=learner, time=now, detail=detail))

  def kinds(self) -> list[str]:
    return [f["fault"] for f in self.faults]


class FakeSyncer:
  """Θ's version and the reports waiting; a quorum of `quorum` reports makes fragment 0 ready."""

  def __init__(self, quorum: int = 2):
    self.params, self.version, self.pending, self.quorum = "theta", 3, [], quorum
    self.trees, self.mirrors = types.SimpleNamespace(num=1), None
    self.computed: list[list] = []
    self.xi_step = types.SimpleNamespace(value=0.1)  # seconds per inner step

  def receive(self, report) -> None:
    self.pending.append(report)

  def ready(self, able: list[int]) -> int | None:
    del able
    return 0 if len(self.pending) >= self.quorum else None

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
    return types.SimpleNamespace(merged=(), reports=tuple(reports), members=members)

  def compile_merges(self) -> None:
    pass

  def observe_round(self, seconds_per_step: float) -> None:
    pass

  def answer(self, report, verdict: str):
    return types.SimpleNamespace(payload=None, fragment=0, verdict=verdict, learner=report.learner)

  def latest(self, round_: int):
    return types.SimpleNamespace(payload=None, fragment=0, verdict="latest", round=round_)
