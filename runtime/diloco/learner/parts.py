"""A learner's parts in flight: queued on its slices in dispatch order, collected oldest first, and its device timeline.

The controller bounds how many parts a learner keeps in flight (`rounds.queue_depth`: one, or two so that the
next part is enqueued before the current one finishes). A part queued behind the adoption of a Θ that replaced what
it trains on is void: its tokens were written off when Θ was adopted, and it books none when collected. A learner
that keeps its state across a lost slice (several slices, reconfiguring) runs one part at a time and keeps what that
part started from: its state and data position.
"""

import dataclasses
from typing import Any, Iterator, Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from runtime.checkpoint import snapshot as snapshot_lib
from runtime.diloco.learner.device_timeline import DeviceTimeline
from runtime.diloco.round_plan import OVERLAP
from runtime.train.programs import TrainState


def ends_at(times: Sequence[tuple[float, float, float, int]], seconds_per_step: float) -> float:
  """When the last of these parts in flight (oldest first, each as `RoundPart.times`) finishes: modeled, or estimated
  from a typical step time, each part after the one ahead of it. Plain values: a learner in another process answers
  with them (ray_host.figures), and the controller reads the same time off them."""
  ends = 0.0
  for started_at, queued_seconds, modeled_seconds, steps in times:
    ends = (started_at + queued_seconds + modeled_seconds if modeled_seconds
            else max(started_at, ends) + steps * seconds_per_step)
  return ends


def needs_theta_at(kinds: Sequence[str], times: Sequence[tuple[float, float, float, int]], now: float,
                   seconds_per_step: float) -> float:
  """When a learner with these parts in flight (their kinds and times, oldest first) will wait for Θ: the end of its
  last part if that is an overlap part, else now."""
  return ends_at(times, seconds_per_step) if kinds and kinds[-1] == OVERLAP else now


@dataclasses.dataclass(frozen=True)
class RoundPart:
  """A dispatched part of a round: its futures and what it consumed."""

  kind: str  # "main": ends in a report; "overlap": trains while the report syncs
  steps: int
  tokens: int
  started_at: float
  modeled_seconds: float  # 0 when time is not modeled (real clock)
  state: TrainState
  metrics: dict
  failure: str = ""  # the device error of a program that failed before it was awaited, raised when it is
  queued_seconds: float = 0.0  # modeled time it waits behind the learner's parts ahead of it (parts_in_flight > 1)

  @property
  def future(self) -> tuple[TrainState, dict]:
    """What the clock awaits: the part's device results."""
    return self.state, self.metrics

  @property
  def times(self) -> tuple[float, float, float, int]:
    """What says when it ends (`ends_at`): when it started, its modeled wait and time, its steps."""
    return self.started_at, self.queued_seconds, self.modeled_seconds, self.steps

  def modeled_end(self) -> float:
    """When its modeled time ends: the clock's time of its PART_DONE event (the same sum, to the bit)."""
    return self.started_at + (self.queued_seconds + self.modeled_seconds)



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
    return max(self.ends_at(0.0) - now, 0.0) if self._parts and modeled_seconds else 0.0  # (the last part's end)

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

  def live_steps(self) -> int:
    """Inner steps of the parts in flight that are not void: the batches they took past the data they follow (a
    void part's were served again from before it)."""
    return sum(part.steps for part in self._parts[self._void:])

  def void_all(self) -> None:
    """An adopted Θ replaced what every part in flight trains on."""
    self._void = len(self._parts)

  def clear(self) -> None:
    """The parts' futures are dropped (the learner failed)."""
    self._parts, self._void, self.before = [], 0, None

  def ends_at(self, seconds_per_step: float) -> float:
    """When the last part in flight finishes: modeled, or estimated from a typical step time."""
    return ends_at([part.times for part in self._parts], seconds_per_step)

  def needs_theta_at(self, now: float, seconds_per_step: float) -> float:
    """When its learner will wait for Θ (`needs_theta_at`)."""
    return needs_theta_at([p.kind for p in self._parts], [p.times for p in self._parts], now, seconds_per_step)

  def snapshot(self, packer: snapshot_lib.Packer, group: str, with_state: bool = True) -> dict:
    """The oldest part under the checkpoint's old key `inflight`, those queued behind it, and the timeline; the
    state before the oldest if it is kept (and `with_state`: the learner's state is saved)."""
    return dict(before=pack_before(self.before if with_state else None, packer, group),
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


# A part in flight in the learner's checkpoint: its figures and metrics, and what it started from (the part's train
# state is the learner's own, saved with it; a learner that reconfigures keeps the state and data position before it).

def pack_part(part: RoundPart | None, packer: snapshot_lib.Packer, group: str) -> dict | None:
  """The part's figures, its metrics' arrays in `group`."""
  if part is None:
    return None
  return dict(kind=part.kind, steps=part.steps, tokens=part.tokens, started_at=part.started_at,
              modeled_seconds=part.modeled_seconds, metrics=packer.tree(part.metrics, "dict", group),
              failure=part.failure, queued_seconds=part.queued_seconds)


def unpack_part(saved: dict | None, unpacker: snapshot_lib.Unpacker, group: str, state: TrainState | None,
                mesh: jax.sharding.Mesh, failure: str) -> RoundPart | None:
  """The part `pack_part` saved, producing `state`, its metrics replicated on `mesh` (none once it failed: its
  error, or the `failure` of its group's arrays; a checkpoint from before parts kept their queued time: none)."""
  if saved is None:
    return None
  replicated = NamedSharding(mesh, P())
  failure = saved["failure"] or failure
  metrics = None if failure else unpacker.tree(saved["metrics"], lambda x, _: jax.device_put(x, replicated), group)
  return RoundPart(saved["kind"], saved["steps"], saved["tokens"], saved["started_at"], saved["modeled_seconds"],
                   state, metrics, failure=failure, queued_seconds=saved.get("queued_seconds", 0.0))


def pack_before(before: tuple[TrainState, dict] | None, packer: snapshot_lib.Packer, group: str) -> dict | None:
  """The state and data position before the part, the state's arrays in `group`.before."""
  return None if before is None else dict(state=packer.tree(before[0], "train", f"{group}.before"), data=before[1])


def unpack_before(saved: dict | None, unpacker: snapshot_lib.Unpacker, group: str,
                  like: Any) -> tuple[TrainState, dict] | None:
  """What `pack_before` saved, the state placed like the train state `like`."""
  if saved is None:
    return None
  return unpacker.tree(saved["state"], snapshot_lib.like(like), f"{group}.before"), saved["data"]
