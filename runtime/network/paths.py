"""A transfer's time on the path learner ↔ syncer (in region 0), and the bytes in flight over time (under either
clock: the real clock holds a transfer's arrival back by as long).

A learner in region 0 uses only its own link: latency + bytes / bandwidth (the clock's link). A learner in
another region also crosses its region's inter-region link, shared by that region's learners: transfers on it
are served one after another at its full bandwidth, per direction (FIFO; the same total throughput as fair
sharing, and the same finish time for the last of a burst). The path is pipelined: the bytes arrive when the
slower of the two links has carried them, plus both latencies. The syncer's own ingress is not a bottleneck.
"""

from typing import Callable, Sequence

from runtime.config.network import LinksConfig, region_of


class Paths:
  """Every learner's path to the syncer, with each inter-region link's queue (per direction)."""

  def __init__(self, cfg: LinksConfig, own_link_seconds: Callable[[int], float], own_bandwidth: float):
    self.cfg = cfg
    self._own = own_link_seconds  # the learner's own link (the clock's)
    self._own_bandwidth = own_bandwidth
    self._free_at: dict[tuple[int, str], float] = {}  # (region, "up" | "down") -> when its link is free

  def crosses(self, learner: int) -> bool:
    """Whether the learner's transfers cross regions (it sits outside the syncer's region 0)."""
    return region_of(self.cfg, learner) != 0

  def seconds(self, learner: int, now: float, num_bytes: int, direction: str) -> float:
    """Seconds from now until `num_bytes` sent now reach the other end; queues on the inter-region link."""
    if not self.crosses(learner):
      return self._own(num_bytes)
    key = (region_of(self.cfg, learner), direction)
    start = max(now, self._free_at.get(key, 0.0))
    self._free_at[key] = start + num_bytes / self.cfg.inter_region_bandwidth_bytes_per_s
    carried = max(now + num_bytes / self._own_bandwidth, self._free_at[key])
    return carried - now + self._own(0) + self.cfg.inter_region_latency_s

  def snapshot(self) -> list:
    return [[r, d, t] for (r, d), t in sorted(self._free_at.items())]

  def restore(self, saved: list) -> None:
    self._free_at = {(r, d): t for r, d, t in saved}


def peak_in_flight(transfers: Sequence[tuple[int, float, float, int]]) -> tuple[int, int]:
  """The most bytes in flight at once for any one learner, and in all; transfers are (learner, sent, arrives, bytes).

  A transfer is in flight from when it is sent (queued ones too) until it arrives, both ends included.
  """
  def peak(items) -> int:
    events = sorted((t, order, b) for _, sent, arrives, b in items for t, order, b in ((sent, 0, b), (arrives, 1, -b)))
    level = best = 0
    for _, _, b in events:
      level += b
      best = max(best, level)
    return best
  learners = {m for m, *_ in transfers}
  return max((peak([t for t in transfers if t[0] == m]) for m in learners), default=0), peak(transfers)
