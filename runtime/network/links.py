"""The links between learners and the syncer: what a transfer costs in time (modeled, or held back in wall time
under the real clock) and bytes (on the path through the learner's region, see network/paths.py), and link faults
(reports delayed until the link is back, or dropped)."""

from typing import Any, Callable, Sequence

from runtime.config.run import RunConfig
from runtime.config.fragment_plan import WHOLE
from runtime.network import paths as paths_lib


class Links:
  """Every learner's link to the syncer; a report up carries the full model (one fragment of it) or its compressed
  payload, Θ down the full model (one fragment, or all of it) or its compressed update."""

  def __init__(self, run: RunConfig, transfer_seconds: Callable[[int], float], fragment_bytes: Sequence[int]):
    self.paths = paths_lib.Paths(run.links, transfer_seconds, run.clock.bandwidth_bytes_per_s)
    self.fragment_bytes = tuple(fragment_bytes)  # bytes of each fragment's tensors (one fragment: the full model)
    self.param_bytes = sum(self.fragment_bytes)
    self.whole_down = run.compression.down == "none" and run.fragments == 1  # Θ always goes down as the full model
    self._last_down: dict[int, int] = {}  # learner -> bytes of the Θ last sent to it
    self.bytes_up = self.bytes_down = 0
    self.cross_up = self.cross_down = 0  # bytes of transfers that crossed regions
    self.reports_up = 0  # reports sent (each charged its bytes, even when the link drops it)
    self.transfers: list[tuple[int, float, float, int]] = []  # (learner, sent, arrives, bytes), for peaks in flight
    self._faults: dict[int, tuple[float, str]] = {}  # learner -> (until, "delay" | "drop")

  def fail(self, learner: int, until: float, mode: str) -> None:
    """The learner's link delays or drops reports until `until`."""
    self._faults[learner] = (until, mode)

  def report_bytes(self, payload: Any = None, fragment: int = WHOLE) -> int:
    """Bytes of a report or of Θ: its compressed payload, or the fragment's tensors (WHOLE: the full model)."""
    if payload is not None:
      return payload.nbytes
    return self.param_bytes if fragment == WHOLE else self.fragment_bytes[fragment]

  def send_up(self, learner: int, now: float, payload: Any = None, fragment: int = 0) -> float | None:
    """Seconds until a report sent now (its compressed `payload`, or its fragment's tensors) reaches the syncer, or
    None when the link drops it."""
    num_bytes = self.report_bytes(payload, fragment)
    self.bytes_up += num_bytes
    self.cross_up += num_bytes if self.paths.crosses(learner) else 0
    self.reports_up += 1
    delay = self.paths.seconds(learner, now, num_bytes, "up")
    until, mode = self._faults.get(learner, (-1.0, ""))
    dropped = now < until and mode == "drop"
    if now < until and not dropped:
      delay += until - now
    self.transfers.append((learner, now, now + delay, num_bytes))
    return None if dropped else delay

  def send_down(self, learner: int, now: float, payload: Any = None, fragment: int = WHOLE) -> float:
    """Seconds for Θ sent now (its compressed update `payload`, or the fragment's tensors, WHOLE: the full model) to
    reach the learner; its bytes are charged."""
    num_bytes = self.report_bytes(payload, fragment)
    delay = self.paths.seconds(learner, now, num_bytes, "down")
    self.bytes_down += num_bytes
    self._last_down[learner] = num_bytes
    self.cross_down += num_bytes if self.paths.crosses(learner) else 0
    self.transfers.append((learner, now, now + delay, num_bytes))
    return delay

  def down_bytes(self, learners: list[int]) -> int | list[int]:
    """Bytes of the Θ last sent to each learner (one number, the full model's, while Θ always goes down whole)."""
    return self.param_bytes if self.whole_down else [self._last_down[m] for m in learners]

  def peaks(self) -> tuple[int, int]:
    """The most bytes in flight at once for one learner, and in all."""
    return paths_lib.peak_in_flight(self.transfers)

  def snapshot(self, packer=None) -> dict:
    del packer  # (plain data: a checkpoint part's protocol, runtime/diloco/durability.py)
    return dict(bytes_up=self.bytes_up, bytes_down=self.bytes_down, reports_up=self.reports_up,
                faults=[[m, until, mode] for m, (until, mode) in sorted(self._faults.items())],
                cross=[self.cross_up, self.cross_down], queues=self.paths.snapshot(),
                transfers=[list(t) for t in self.transfers])

  def restore(self, saved: dict, unpacker=None) -> None:
    del unpacker
    self.bytes_up, self.bytes_down = saved["bytes_up"], saved["bytes_down"]
    self.reports_up = saved.get("reports_up", 0)  # checkpoints from before it was counted
    self._faults = {m: (until, mode) for m, until, mode in saved["faults"]}
    self.cross_up, self.cross_down = saved.get("cross", (0, 0))  # (and before regions)
    self.paths.restore(saved.get("queues", []))
    self.transfers = [tuple(t) for t in saved.get("transfers", [])]
