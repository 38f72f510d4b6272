"""Timeline primitives of the goodput simulator: which events start a downtime, unions of intervals."""

import numpy as np


def downtime_starts(keys: np.ndarray, ends: np.ndarray) -> np.ndarray:
  """Indices of the sorted events that start a downtime; event i's downtime would end at ends[i]."""
  # Exact in O(n) memory. An event at or after every earlier end (a head) is a start whatever came
  # before. Between two heads the starts are the path of "the first event at or after my end" from the
  # first: all such paths advance together, one start per step, so the steps number the most starts
  # between two heads and the searches only the starts.
  n = keys.size
  start = np.ones(n, bool)
  start[1:] = keys[1:] >= np.maximum.accumulate(ends)[:-1]
  heads = np.flatnonzero(start)
  stop = np.append(heads[1:], n)  # each path ends at the next head
  longer = stop > heads + 1  # only heads followed by events inside their downtime have a path to walk
  current, stop = heads[longer], stop[longer]
  while current.size:
    following = np.maximum(np.searchsorted(keys, ends[current], side="left"), current + 1)
    going = following < stop
    current, stop = following[going], stop[going]
    start[current] = True
  return np.flatnonzero(start)


class IntervalUnion:
  """A union of intervals on one timeline, measured between any two points."""

  def __init__(self, starts: np.ndarray, ends: np.ndarray):
    if np.any(starts[1:] < starts[:-1]):
      order = np.argsort(starts, kind="stable")
      starts, ends = starts[order], ends[order]
    if np.any(starts[1:] <= ends[:-1]) or np.any(ends < starts):  # else already disjoint: keep them
      keep = ends > starts
      starts, ends = starts[keep], ends[keep]
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


def _intersect(a_from: np.ndarray, a_to: np.ndarray, b_from: np.ndarray, b_to: np.ndarray):
  """The intersection of two sorted lists of disjoint intervals, as (starts, ends)."""
  lo = np.searchsorted(b_to, a_from, side="right")
  hi = np.searchsorted(b_from, a_to, side="left")
  counts = np.maximum(hi - lo, 0)  # a's interval i meets b's intervals lo[i] .. hi[i] - 1
  a = np.repeat(np.arange(a_from.size), counts)
  b = np.arange(a.size) + np.repeat(lo - np.cumsum(counts) + counts, counts)
  starts, ends = np.maximum(a_from[a], b_from[b]), np.minimum(a_to[a], b_to[b])
  keep = ends > starts
  return starts[keep], ends[keep]


def below_quorum(down: IntervalUnion, span: float, units: int, quorum: int) -> tuple[np.ndarray, np.ndarray]:
  """Intervals (unit 0's time) when fewer than `quorum` of `units` are up; unit u's downtimes lie at u·span."""
  unit = np.floor(down.starts / span).astype(np.int64)
  if quorum == 1:  # every unit down: intersect them one by one (the intersection shrinks fast)
    bounds = np.searchsorted(unit, np.arange(units + 1))
    starts, ends = down.starts[:bounds[1]], down.ends[:bounds[1]]
    for u in range(1, units):
      part = slice(bounds[u], bounds[u + 1])
      starts, ends = _intersect(starts, ends, down.starts[part] - u * span, down.ends[part] - u * span)
    return starts, ends
  time = np.concatenate([down.starts - unit * span, down.ends - unit * span])
  change = np.concatenate([np.full(down.starts.size, -1), np.full(down.ends.size, 1)])
  order = np.argsort(time, kind="stable")
  time, up = time[order], units + np.cumsum(change[order])
  stalled = np.flatnonzero(up[:-1] < quorum)
  return time[stalled], time[stalled + 1]
