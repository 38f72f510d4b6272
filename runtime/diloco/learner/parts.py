"""A learner's parts in flight: queued on its slices in dispatch order, collected oldest first, and its device timeline.

The controller bounds how many parts a learner keeps in flight (`rounds.queue_depth`: one, or two so that the
next part is enqueued before the current one finishes). A part queued behind the adoption of a Θ that replaced what
it trains on is void: its tokens were written off when Θ was adopted, and it books none when collected. A learner
that keeps its state across a lost slice (several slices, reconfiguring) runs one part at a time and keeps what that
part started from: its state and data position.
"""

from typing import Any, Iterator

import jax

from runtime.checkpoint import snapshot as snapshot_lib
from runtime.diloco.learner.device_timeline import DeviceTimeline
from runtime.diloco.sync.messages import RoundPart
from runtime.diloco.learner.part_snapshot import pack_before, pack_part, unpack_before, unpack_part
from runtime.train.programs import TrainState


class PartQueue:
  """The parts in flight, oldest first (a sequence: `len`, `[i]`, iteration), and when each ran."""

  def __init__(self):
    self._parts: list[RoundPart] = []
    self._void = 0  # how many of the oldest parts trained on what an adopted Θ replaced
    self.before: tuple[TrainState, dict] | None = None  # (state, data position) the oldest started from, if kept
    self.device = DeviceTimeline()

  def __len__(self) -> int:
    return len(self._parts)

  def __getitem__(self, i: int) -> RoundPart:
    return self._parts[i]

  def __iter__(self) -> Iterator[RoundPart]:
    return iter(self._parts)

  def queued_seconds(self, now: float, modeled_seconds: float) -> float:
    """The modeled time a part dispatched now waits behind those in flight (0 when time is not modeled)."""
    return max(self._parts[-1].ends_at(0.0) - now, 0.0) if self._parts and modeled_seconds else 0.0

  def push(self, part: RoundPart, before: tuple[TrainState, dict] | None = None) -> None:
    if not self._parts:
      self.before = before
    self._parts.append(part)
    self.device.enqueued(part.started_at)

  def pop(self, now: float) -> tuple[RoundPart, float, bool]:
    """The oldest part, which ended at `now`: it, its device seconds, and whether it is void."""
    part, self.before = self._parts.pop(0), None
    void, self._void = self._void > 0, max(self._void - 1, 0)
    return part, self.device.ran(part.started_at, now), void

  def live_tokens(self) -> int:
    """Tokens of the parts in flight that are not void."""
    return sum(part.tokens for part in self._parts[self._void:])

  def void_all(self) -> None:
    """An adopted Θ replaced what every part in flight trains on."""
    self._void = len(self._parts)

  def clear(self) -> None:
    """The parts' futures are dropped (the learner failed)."""
    self._parts, self._void, self.before = [], 0, None

  def ends_at(self, seconds_per_step: float) -> float:
    """When the last part in flight finishes: modeled, or estimated from a typical step time."""
    ends = 0.0
    for part in self._parts:
      ends = part.ends_at(seconds_per_step, ends)
    return ends

  def snapshot(self, packer: snapshot_lib.Packer, group: str) -> dict:
    """The oldest part under the checkpoint's old key `inflight`, those queued behind it, and the timeline."""
    return dict(before=pack_before(self.before, packer, group),
                inflight=pack_part(self._parts[0] if self._parts else None, packer, group),
                queued=[pack_part(p, packer, group) for p in self._parts[1:]], void=self._void,
                device=self.device.snapshot())

  def restore(self, saved: dict, unpacker: snapshot_lib.Unpacker, group: str, state: TrainState | None,
              mesh: jax.sharding.Mesh | None, failure: str, like: Any) -> None:
    """What `snapshot` saved (each part producing `state`, the state before placed like `like`; a checkpoint from
    before the queue holds one part)."""
    self.before = unpack_before(saved["before"], unpacker, group, like)
    saved_parts = [p for p in (saved["inflight"], *saved.get("queued", ())) if p is not None]
    self._parts = [unpack_part(p, unpacker, group, state, mesh, failure) for p in saved_parts]
    self._void, self.device = saved.get("void", 0), DeviceTimeline.restored(saved.get("device"))
