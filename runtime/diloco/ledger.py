"""Availability accounting: goodput (slice time whose work reached Θ) and uptime."""

import math
from typing import Sequence


class Ledger:
  """Slice-time accounting: goodput = slice time whose work reached Θ / slice time allocated."""

  def __init__(self, num_slices: int):
    self.num_slices = num_slices
    self.useful_seconds = 0.0  # slice-seconds of merged work
    self.lost_seconds = 0.0  # slice-seconds of work that crashed, was dropped or quarantined
    # tokens trained (or in flight) that never reached Θ, their data served again (NaN: resumed from a checkpoint
    # that did not count them)
    self.lost_tokens: float = 0
    self.lent_seconds = 0.0  # slice-seconds of lent slices already reclaimed
    self._lent: dict[int, float] = {}  # lent slice -> since when

  def useful(self, slice_seconds: float) -> None:
    self.useful_seconds += slice_seconds

  def lost(self, slice_seconds: float, tokens: int = 0) -> None:
    self.lost_seconds += slice_seconds
    self.lost_tokens += tokens

  def lend(self, slice_index: int, now: float) -> None:
    """A lent slice is allocated to the run from `now` on."""
    self._lent[slice_index] = now

  def reclaim(self, slice_index: int, now: float) -> None:
    self.lent_seconds += now - self._lent.pop(slice_index)

  def lent_slice_seconds(self, now: float) -> float:
    return self.lent_seconds + sum(now - at for at in self._lent.values())

  def snapshot(self) -> dict:
    return dict(useful_seconds=self.useful_seconds, lost_seconds=self.lost_seconds, lost_tokens=self.lost_tokens,
                lent_seconds=self.lent_seconds, lent=sorted(self._lent.items()))

  def restore(self, saved: dict) -> None:
    self.useful_seconds, self.lost_seconds = saved["useful_seconds"], saved["lost_seconds"]
    self.lost_tokens = saved.get("lost_tokens", math.nan)  # (not counted before: unknown)
    self.lent_seconds, self._lent = saved["lent_seconds"], {s: at for s, at in saved["lent"]}

  def goodput(self, elapsed: float) -> float:
    """Useful slice-time over allocated slice-time (every owned slice, spares included, for `elapsed`, and
    lent slices while they were lent)."""
    allocated = self.num_slices * elapsed + self.lent_slice_seconds(elapsed)
    return self.useful_seconds / allocated if elapsed > 0 else 0.0


def uptime(training: Sequence[tuple[float, float]], end: float) -> float:
  """Fraction of [0, end] covered by at least one of the (start, end) spans of training toward Θ."""
  covered, reach = 0.0, 0.0
  for a, b in sorted(training):
    if b > reach:
      covered += b - max(a, reach)
      reach = b
  return covered / end if end > 0 else 1.0
