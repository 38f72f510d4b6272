"""The failures a data-parallel job meets on its slices, and when it is up again: the goodput simulator's semantics.

Each slice fails at its trace's times (runtime/faults/replay.py, on the run's clock) and is back after its repair,
which starts at the failure, not when it is noticed. A job without elasticity is down from any failure of a slice it
trains on until a hot spare stands in (first come first served; a spare is free again when the slice it stood in for
is repaired) or the slice is back, and then pays a restart; failures meanwhile are handled by the same restart
(runtime/sim/model.py). Elastic DP drops failed slices and takes them back; failures during its reconfiguration are
handled by it. Times are the run's seconds, modeled or wall alike: this class never reads a clock.
"""

from typing import Callable

import numpy as np

from runtime.config.faults import FaultConfig
from runtime.faults import replay

_NEVER = (float("inf"), 0.0)


class JobFailures:
  """Each slice's next failure, which slices are down until when, and (without elasticity) when the job resumes."""

  def __init__(self, cfg: FaultConfig, num_slices: int, active: int, seed: int, elastic: bool,
               record: Callable[[int, float, dict], None]):
    """`active` slices are trained on, the rest are hot spares; `record(slice, time, detail)` hears of each
    failure."""
    self._traces = [replay.slice_failures(cfg, s, seed) for s in range(num_slices)]
    self._ahead = [next(trace, _NEVER) for trace in self._traces]  # each slice's next (time, repair seconds)
    self.down_until = [0.0] * num_slices
    self._active, self._elastic, self._record = active, elastic, record
    self._restart_seconds = cfg.restart_seconds
    self._spares = num_slices - active  # (they never fail while they stand in, as in the simulator)
    self._repairs: list[float] = []  # when each failed slice of the job is back, in failure order
    self.resume_at = 0.0  # without elasticity: when the job is up again
    self._last_ready = 0.0  # when its latest failure had a spare (or its slice back)
    self.count = 0

  def next_slice(self) -> int:
    """The slice that fails next."""
    return int(np.argmin([at for at, _ in self._ahead]))

  def next_time(self) -> float:
    return self._ahead[self.next_slice()][0]

  def healthy(self, now: float) -> tuple[int, ...]:
    """The slices trained on that are up at `now`."""
    return tuple(s for s in range(self._active) if self.down_until[s] <= now)

  def first_repair(self) -> float:
    """When the first of the trained-on slices now down is back."""
    return min(self.down_until[:self._active])

  def fail(self, s: int, detail: dict | None = None) -> None:
    """Slice s fails at its trace's time; its repair ends that long after. `detail` goes to its record."""
    at, repair = self._ahead[s]
    self.count += 1
    self.down_until[s] = at + repair
    if not self._elastic and s < self._active:  # down until this slice has a spare (or is back), then restarts
      n = len(self._repairs)
      if not self._spares:
        ready = at + repair
      else:  # spares first come first served, to the earlier failure first
        ready = at if n < self._spares else min(max(at, self._repairs[n - self._spares]), at + repair)
      self._last_ready = max(self._last_ready, ready)
      self._repairs.append(at + repair)
      if self._last_ready >= self.resume_at:  # a spare ready during a restart joins that restart
        self.resume_at = self._last_ready + self._restart_seconds
    self._ahead[s] = next(self._traces[s], _NEVER)
    self._record(s, at, detail or {})

  def fail_before(self, until: float) -> None:
    """Every failure before `until` (they fall inside a restart or reconfiguration that ends then, which handles
    them too)."""
    while self.next_time() < until:
      self.fail(self.next_slice())
