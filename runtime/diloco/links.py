"""The links between learners and the syncer: what a transfer costs in modeled time and bytes, and
link faults (reports delayed until the link is back, or dropped)."""

from typing import Any, Callable


class Links:
  """Every learner's link to the syncer; a report up carries the full model or its compressed payload, Θ down the
  full model."""

  def __init__(self, transfer_seconds: Callable[[int], float], param_bytes: int):
    self._transfer_seconds = transfer_seconds
    self.param_bytes = param_bytes
    self.bytes_up = self.bytes_down = 0
    self.reports_up = 0  # reports sent (each charged its bytes, even when the link drops it)
    self._faults: dict[int, tuple[float, str]] = {}  # learner -> (until, "delay" | "drop")

  def fail(self, learner: int, until: float, mode: str) -> None:
    """The learner's link delays or drops reports until `until`."""
    self._faults[learner] = (until, mode)

  def send_up(self, learner: int, now: float, payload: Any = None) -> float | None:
    """Seconds until a report sent now (its compressed `payload`, or the full model) reaches the syncer, or None
    when the link drops it."""
    num_bytes = self.param_bytes if payload is None else payload.nbytes
    self.bytes_up += num_bytes
    self.reports_up += 1
    delay = self._transfer_seconds(num_bytes)
    until, mode = self._faults.get(learner, (-1.0, ""))
    if now < until and mode == "drop":
      return None
    if now < until:
      delay += until - now
    return delay

  def down_seconds(self) -> float:
    """Seconds for Θ to reach a learner."""
    return self._transfer_seconds(self.param_bytes)

  def sent_down(self) -> None:
    self.bytes_down += self.param_bytes

  def snapshot(self) -> dict:
    return dict(bytes_up=self.bytes_up, bytes_down=self.bytes_down, reports_up=self.reports_up,
                faults=[[m, until, mode] for m, (until, mode) in sorted(self._faults.items())])

  def restore(self, saved: dict) -> None:
    self.bytes_up, self.bytes_down = saved["bytes_up"], saved["bytes_down"]
    self.reports_up = saved.get("reports_up", 0)  # checkpoints from before it was counted
    self._faults = {m: (until, mode) for m, until, mode in saved["faults"]}
