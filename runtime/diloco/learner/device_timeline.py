"""A learner's device timeline: when each part of its rounds ran, and the share of its active span its device idled.

A part is enqueued at its dispatch; its device work begins then, or when the part ahead of it ends if it was queued
behind one (parts of one learner run in order, on its slices), and ends when its program finishes (really, or in
modeled time). The device is idle whenever the learner has no program of its own enqueued or running. The idle
fraction is taken over the learner's active span, from its first dispatch to the end of its last part, less the
time it had no slice to run on (down, failed, reconfiguring, or absent as lent capacity not lent).
"""

import dataclasses
import math
from typing import Iterable

from runtime.diloco.learner.lifecycle import ABSENT, DOWN, FAILED, RECONFIGURING

NO_SLICE = (DOWN, FAILED, RECONFIGURING, ABSENT)  # statuses in which the learner has no device to keep busy


@dataclasses.dataclass
class DeviceTimeline:
  """Running sums over the parts that ended: enough to give the idle fraction, and small enough to checkpoint."""

  first_enqueued: float = math.nan
  last_ended: float = math.nan
  busy_seconds: float = 0.0
  parts: int = 0
  last_seconds: float = 0.0  # the device seconds of the part that ended last

  def enqueued(self, at: float) -> None:
    """A part was dispatched at `at`."""
    if math.isnan(self.first_enqueued):
      self.first_enqueued = at

  def ran(self, enqueued_at: float, ended_at: float) -> float:
    """The oldest part in flight, enqueued at `enqueued_at`, ended at `ended_at`; returns its device seconds (from
    when it began: its enqueueing, or the end of the part ahead of it)."""
    began = enqueued_at if math.isnan(self.last_ended) else max(enqueued_at, self.last_ended)
    seconds = max(ended_at - began, 0.0)
    self.busy_seconds += seconds
    self.last_ended = ended_at if math.isnan(self.last_ended) else max(self.last_ended, ended_at)
    self.parts += 1
    self.last_seconds = seconds
    return seconds

  def idle_fraction(self, intervals: Iterable[tuple[str, float, float, str]],
                    status: tuple[str, float] | None = None) -> float:
    """The share of the active span with no program of the learner's own on its device (`intervals`: its status
    timeline, (who, from, to, status), and `status`: the one it is in, since when; time without a slice does not
    count). NaN before any part ended."""
    if not self.parts:
      return math.nan
    start, end = self.first_enqueued, self.last_ended
    if status is not None:
      intervals = [*intervals, ("", status[1], end, status[0])]
    away = sum(max(0.0, min(b, end) - max(a, start)) for _, a, b, status in intervals if status in NO_SLICE)
    span = end - start - away
    return min(max(1.0 - self.busy_seconds / span, 0.0), 1.0) if span > 0 else 0.0

  def snapshot(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def restored(cls, saved: dict | None) -> "DeviceTimeline":
    """The timeline `snapshot` saved (a checkpoint from before it was kept: empty, so the figure covers the time
    since the resume)."""
    return cls(**saved) if saved else cls()
