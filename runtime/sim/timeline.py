"""Timeline primitives of the goodput simulator: which events start a downtime, unions of intervals."""

import numpy as np


def downtime_starts(keys: np.ndarray, ends: np.ndarray) -> np.ndarray:
  """Indices of the sorted events that start a downtime; event i's downtime would end at ends[i]."""
  # Exact in O(n) memory: an event at or after every earlier end is a start whatever came before, and
  # the starts after it are the path of `following` from it; each round marks the points 2**r further
  # along every marked path (pointer doubling), so the rounds grow with the log of the longest run of
  # overlapping downtimes, not with the number of events.
  n = keys.size
  if n == 0:
    return np.zeros(0, np.int64)
  following = np.maximum(np.searchsorted(keys, ends, side="left"), np.arange(1, n + 1))
  head = np.ones(n, bool)
  head[1:] = keys[1:] >= np.maximum.accumulate(ends)[:-1]
  marked = np.append(head, True)  # index n means past the end: marked so that it never counts as new
  jump = np.append(following, n)
  while True:
    targets = jump[np.flatnonzero(marked)]
    fresh = targets[~marked[targets]]
    if not fresh.size:
      return np.flatnonzero(marked[:n])
    marked[fresh] = True
    jump = jump[jump]


class IntervalUnion:
  """A union of intervals on one timeline, measured between any two points."""

  def __init__(self, starts: np.ndarray, ends: np.ndarray):
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size:
      reach = np.maximum.accumulate(ends)
      head = np.ones(starts.size, bool)
      head[1:] = starts[1:] > reach[:-1]
      last = np.append(np.flatnonzero(head)[1:] - 1, starts.size - 1)
      starts, ends = starts[head], reach[last]
    self.starts, self.ends = starts, ends
    self._before = np.concatenate([[0.0], np.cumsum(ends - starts)])

  def _measure_before(self, x: np.ndarray) -> np.ndarray:
    if not self.starts.size:
      return np.zeros_like(x, dtype=np.float64)
    count = np.searchsorted(self.starts, x, side="right")
    last = np.maximum(count - 1, 0)
    inside = np.clip(x - self.starts[last], 0.0, self.ends[last] - self.starts[last])
    return np.where(count > 0, self._before[last] + inside, 0.0)

  def measure(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of the union inside each [lo, hi]."""
    return self._measure_before(hi) - self._measure_before(lo)


def below_quorum(down: IntervalUnion, span: float, units: int, quorum: int) -> tuple[np.ndarray, np.ndarray]:
  """Intervals (unit 0's time) when fewer than `quorum` of `units` are up; unit u's downtimes lie at u·span."""
  unit = np.floor(down.starts / span)
  time = np.concatenate([down.starts - unit * span, down.ends - unit * span])
  change = np.concatenate([np.full(down.starts.size, -1), np.full(down.ends.size, 1)])
  order = np.argsort(time, kind="stable")
  time, up = time[order], units + np.cumsum(change[order])
  stalled = np.flatnonzero(up[:-1] < quorum)
  return time[stalled], time[stalled + 1]
