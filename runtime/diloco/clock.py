"""Two clocks behind one controller: wall time, or seeded discrete-event virtual time.

The controller never asks "what time is it" and "what happened" separately: it schedules events
(timers, device programs, merges) on the clock and takes them back in the order the clock decides.
The virtual clock orders them by modeled time, so the same seed gives the same run; the real clock
orders them as they actually finish.
"""

import concurrent.futures
import dataclasses
import enum
import functools
import heapq
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from runtime.config.run import ClockConfig


class EventKind(str, enum.Enum):
  """What can happen to the controller; each kind has one handler in its table (a str: checkpoints save the value)."""

  PART_DONE = "part_done"  # a learner's part of a round finished (or failed)
  PARAMS_ARRIVED = "params_arrived"  # Θ reached a learner
  REPORT_ARRIVED = "report_arrived"  # a learner's report reached the syncer
  REPORT_TIMEOUT = "report_timeout"  # a lost report's learner stops waiting for its answer
  THETA_PULLED = "theta_pulled"  # a (re)starting learner has Θ whole
  MERGE_DUE = "merge_due"  # a fragment's grace window ended
  MERGE_DONE = "merge_done"  # the worker finished a merge
  SLICE_CRASH = "slice_crash"
  LEARNER_CRASH = "learner_crash"
  SLICE_REPAIRED = "slice_repaired"
  REJOIN = "rejoin"  # a spare reaches a learner
  RECONFIGURED = "reconfigured"  # a learner of several slices finished moving onto others
  STRAGGLER = "straggler"
  CORRUPT = "corrupt"
  LINK = "link"
  LEND = "lend"  # slices lent to the run
  RECLAIM = "reclaim"  # lent slices taken back


@dataclasses.dataclass(frozen=True)
class Event:
  """Something that happens to the controller: `kind` with an optional learner and payload."""

  kind: EventKind | str  # (a str where read back from a checkpoint or a fault plan)
  learner: int = -1
  payload: Any = None



def pack_event(packer, event: Event) -> dict:
  """An event in a checkpoint (runtime/checkpoint/snapshot.py), its payload packed."""
  return {"kind": event.kind, "learner": event.learner, "payload": packer.value(event.payload)}


def unpack_event(unpacker, encoded: dict) -> Event:
  return Event(encoded["kind"], encoded["learner"], unpacker.value(encoded["payload"]))

class _Timeline:
  """Events kept in time order; ties break in scheduling order."""

  def __init__(self):
    self._heap: list[tuple[float, int, Event]] = []
    self._seq = 0

  def push(self, at: float, event: Event) -> None:
    heapq.heappush(self._heap, (at, self._seq, event))
    self._seq += 1

  def peek_time(self) -> float:
    return self._heap[0][0] if self._heap else float("inf")

  def pop(self) -> tuple[float, Event]:
    at, _, event = heapq.heappop(self._heap)
    return at, event

  def __len__(self) -> int:
    return len(self._heap)

  def snapshot(self, encode: Callable[[Event], Any]) -> dict:
    return dict(entries=[[at, seq, encode(event)] for at, seq, event in sorted(self._heap)], seq=self._seq)

  def restore(self, saved: dict, decode: Callable[[Any], Event]) -> None:
    """The saved events; ties keep their order."""
    self._heap = [(at, seq, decode(event)) for at, seq, event in saved["entries"]]
    heapq.heapify(self._heap)
    self._seq = saved["seq"]

  def amend(self, predicate: Callable[[Event], bool], change: Callable[[Event], Event]) -> None:
    """Events that `predicate` accepts become `change(event)`, each at its time and place (the heap's keys stay)."""
    self._heap = [(at, seq, change(event) if predicate(event) else event) for at, seq, event in self._heap]

  def without(self, predicate: Callable[[Event], bool]) -> "_Timeline":
    """A timeline of the events that `predicate` rejects, in the same order."""
    kept = _Timeline()
    for at, _, event in sorted(self._heap):
      if not predicate(event):
        kept.push(at, event)
    return kept


class VirtualClock:
  """Deterministic time: work takes its modeled duration, whatever the host really spent."""

  def __init__(self, cfg: ClockConfig, num_learners: int, seed: int, batch_shares: Sequence[float] = ()):
    self.cfg = cfg
    # A learner's step time scales with its hardware (speeds) and its share of the work (batch_shares: its
    # batch over an equal share; a smaller batch on a slower class evens their step times).
    speeds = tuple(cfg.speeds or ()) + (1.0,) * (num_learners - len(cfg.speeds or ()))  # lent learners: 1
    self._speeds = (np.asarray(speeds, np.float64)
                    * np.asarray(batch_shares or (1.0,) * num_learners, np.float64))
    self._rng = np.random.default_rng(seed)
    self._timeline = _Timeline()
    self._now = 0.0
    self._slowdown: dict[int, float] = {}

  def now(self) -> float:
    return self._now

  def set_slowdown(self, learner: int, factor: float) -> None:
    """Extra slowdown factor for a learner (a straggler fault); 1 clears it."""
    self._slowdown[learner] = factor

  def step_seconds(self, learner: int) -> float:
    """Modeled seconds per inner step for this learner now (speed × straggling × seeded jitter)."""
    jitter = 1.0 + self.cfg.jitter * self._rng.standard_normal() if self.cfg.jitter else 1.0
    return self.cfg.step_seconds * self._speeds[learner] * self._slowdown.get(learner, 1.0) * max(jitter, 0.05)

  def expected_step_seconds(self, learner: int) -> float:
    """`step_seconds` without its jitter (and no draw from the jitter's generator: a plan reads it freely)."""
    return self.cfg.step_seconds * self._speeds[learner] * self._slowdown.get(learner, 1.0)

  def slowest_step_seconds(self, learners: Sequence[int]) -> float:
    """The configured step time of the slowest of `learners`: speed × batch share, no straggling, no jitter."""
    return self.cfg.step_seconds * max(float(self._speeds[m]) for m in learners) if learners else 0.0

  def transfer_seconds(self, num_bytes: int) -> float:
    return self.cfg.latency_s + num_bytes / self.cfg.bandwidth_bytes_per_s

  def after(self, delay: float, event: Event) -> None:
    self._timeline.push(self._now + max(delay, 0.0), event)

  def on_done(self, work: Any, modeled_seconds: float, event: Event) -> None:
    """`event` fires `modeled_seconds` from now; the controller awaits `work` when handling it."""
    self.after(modeled_seconds, event)

  def cancel(self, predicate: Callable[[Event], bool]) -> None:
    self._timeline = self._timeline.without(predicate)

  def amend(self, predicate: Callable[[Event], bool], change: Callable[[Event], Event]) -> None:
    """Scheduled events that `predicate` accepts become `change(event)`, still due when they were."""
    self._timeline.amend(predicate, change)

  def pending(self) -> int:
    return len(self._timeline)

  def next_event(self) -> tuple[float, Event]:
    at, event = self._timeline.pop()
    self._now = at
    return at, event

  def wall_stamp(self) -> dict:
    """Nothing: virtual-time records must be bit-reproducible, so they carry no wall time."""
    return {}

  def virtual_seconds(self) -> float:
    """Modeled seconds elapsed."""
    return self._now

  def close(self) -> None:
    pass

  def resume(self) -> None:
    pass  # (modeled time passes only where modeled)

  def snapshot(self, packer) -> dict:
    """The time, the jitter's random state, the slowdowns and every scheduled event."""
    return dict(now=self._now, rng=self._rng.bit_generator.state, slowdown=sorted(self._slowdown.items()),
                timeline=self._timeline.snapshot(functools.partial(pack_event, packer)))

  def restore(self, saved: dict, unpacker) -> None:
    decode = functools.partial(unpack_event, unpacker)
    self._now = saved["now"]
    self._rng.bit_generator.state = saved["rng"]
    self._slowdown = {learner: factor for learner, factor in saved["slowdown"]}
    self._timeline.restore(saved["timeline"], decode)


class RealClock:
  """Wall time: device programs and merges fire when they really finish."""

  def __init__(self, cfg: ClockConfig, num_learners: int, seed: int, batch_shares: Sequence[float] = ()):
    del seed, batch_shares  # real hardware takes as long as it takes
    self.cfg = cfg
    self._start = self._paused_at = time.perf_counter()  # (paused until `resume`)
    self._timeline = _Timeline()
    self._watching: list[tuple[concurrent.futures.Future, Event]] = []  # in the order they were watched
    # A thread per in-flight program waits for it (without the GIL), so the controller sleeps until
    # something finishes instead of polling: polling took 10-15% of a core from the device threads.
    self._waiters = concurrent.futures.ThreadPoolExecutor(2 * num_learners + 2, thread_name_prefix="clock")
    self._slowdown: dict[int, float] = {}  # learner -> how much longer its parts take (a straggler)
    # Learner -> the waiter of its part dispatched last, and when that part really ended (set by the waiter)
    self._last_part: dict[int, tuple[concurrent.futures.Future, list[float]]] = {}

  def now(self) -> float:
    return (self._paused_at if self._paused_at is not None else time.perf_counter()) - self._start

  def wall_stamp(self) -> dict:
    """The wall seconds since the start, for records that rates are computed from."""
    return {"wall": self.now()}

  def virtual_seconds(self) -> float:
    """NaN: nothing is modeled."""
    return float("nan")

  def close(self) -> None:
    self._waiters.shutdown(wait=False, cancel_futures=True)

  def resume(self) -> None:
    """The run's time starts (or goes on after a restore) now: it stands still from the clock's making until the
    first part is dispatched (set-up and compiles), so a fault due 1 s into the run falls 1 s after the first part."""
    if self._paused_at is not None:
      self._start += time.perf_counter() - self._paused_at
      self._paused_at = None

  def snapshot(self, packer) -> dict:
    """The time, the timers, and the events of work in progress (saved finished: the snapshot awaits it)."""
    encode = functools.partial(pack_event, packer)
    return dict(now=self.now(), timeline=self._timeline.snapshot(encode),
                watching=[encode(event) for _, event in self._watching], slowdown=sorted(self._slowdown.items()))

  def restore(self, saved: dict, unpacker) -> None:
    """Time goes on from the snapshot's (the time the run was down is not counted); saved work is done now."""
    decode = functools.partial(unpack_event, unpacker)
    self._start = time.perf_counter() - saved["now"]
    self._paused_at = None if self._paused_at is None else time.perf_counter()  # (still paused: from saved["now"])
    self._slowdown = {learner: factor for learner, factor in saved.get("slowdown", ())}
    self._timeline.restore(saved["timeline"], decode)
    for event in saved["watching"]:
      self._timeline.push(saved["now"], decode(event))

  def set_slowdown(self, learner: int, factor: float) -> None:
    """A straggler: each part of the learner's dispatched from now on takes `factor` times as long as its program
    ran (its completion is held back; 1 ends it). Real hardware is as slow as it is; this is a fault injected."""
    if factor == 1.0:
      self._slowdown.pop(learner, None)
    else:
      self._slowdown[learner] = factor

  def step_seconds(self, learner: int) -> float:
    del learner
    return 0.0

  def expected_step_seconds(self, learner: int) -> float:
    """0: a real step's time is measured, not modeled (the round plan keeps the measurements)."""
    del learner
    return 0.0

  def slowest_step_seconds(self, learners: Sequence[int]) -> float:
    del learners
    return 0.0

  def transfer_seconds(self, num_bytes: int) -> float:
    """A transfer on the learner's link takes its latency and bandwidth's time in wall seconds too: its arrival is
    held back that long (the copy itself, device to host, spends its own real time in the merge worker)."""
    return self.cfg.latency_s + num_bytes / self.cfg.bandwidth_bytes_per_s

  def after(self, delay: float, event: Event) -> None:
    self._timeline.push(self.now() + max(delay, 0.0), event)

  def on_done(self, work: Any, modeled_seconds: float, event: Event) -> None:
    """`event` fires when `work` (a JAX result pytree or a concurrent future) finishes or fails."""
    del modeled_seconds
    if isinstance(work, concurrent.futures.Future):
      pass
    elif event.kind == EventKind.PART_DONE:
      ended: list[float] = []
      work = self._waiters.submit(self._part_finished_at, work, self.now(), self._slowdown.get(event.learner, 1.0),
                                  self._last_part.get(event.learner), ended)
      self._last_part[event.learner] = (work, ended)
    else:
      work = self._waiters.submit(self._finished_at, work)
    self._watching.append((work, event))

  def _finished_at(self, arrays: Any) -> float:
    """Waits (off the controller thread) for device work; returns when it really finished."""
    jax.block_until_ready(arrays)
    return self.now()

  def _part_finished_at(self, arrays: Any, dispatched: float, slowdown: float,
                        ahead: tuple[concurrent.futures.Future, list[float]] | None, ended: list[float]) -> float:
    """When a learner's part finished (waited for off the controller thread). A straggler's part takes `slowdown`
    times the time its program ran: its completion is held back, waited out here. A part queued behind another
    starts when the one ahead finished (held back, if so) and ran from when the device reached it, so a straggler's
    delay carries to the parts behind and each completes (or fails) after the one ahead. `ended`: set to its real
    end."""
    failure = None
    try:
      jax.block_until_ready(arrays)
    except Exception as error:  # pylint: disable=broad-except  # (raised once the part ahead is handed back)
      failure = error
    ended.append(self.now())
    started, ran_from = dispatched, dispatched
    if ahead is not None:
      future, ahead_ended = ahead
      try:
        held = future.result()  # (waits: the part ahead completes first)
      except Exception:  # pylint: disable=broad-except  # (it failed: its learner went down, and this one with it)
        held = None
      if held is not None and ahead_ended:
        started, ran_from = max(dispatched, held), max(dispatched, ahead_ended[0])
    if failure is not None:
      raise failure
    if slowdown == 1.0 and started == ran_from:
      return ended[0]
    finished = started + slowdown * (ended[0] - ran_from)
    time.sleep(max(finished - self.now(), 0.0))
    return finished

  def cancel(self, predicate: Callable[[Event], bool]) -> None:
    self._timeline = self._timeline.without(predicate)
    for work, event in (w for w in self._watching if predicate(w[1])):  # (a cancelled part is followed by none)
      if event.kind == EventKind.PART_DONE and self._last_part.get(event.learner, (None,))[0] is work:
        del self._last_part[event.learner]
    self._watching = [w for w in self._watching if not predicate(w[1])]

  def amend(self, predicate: Callable[[Event], bool], change: Callable[[Event], Event]) -> None:
    """Scheduled events and awaited work's events that `predicate` accepts become `change(event)`."""
    self._timeline.amend(predicate, change)
    self._watching = [(work, change(event) if predicate(event) else event) for work, event in self._watching]

  def pending(self) -> int:
    return len(self._timeline) + len(self._watching)

  def next_event(self) -> tuple[float, Event]:
    while True:
      now = self.now()
      if self._timeline.peek_time() <= now:
        return self._timeline.pop()
      for i, (work, event) in enumerate(self._watching):
        if work.done():
          del self._watching[i]
          finished = work.result() if work.exception() is None else None
          return (finished if isinstance(finished, float) else now), event  # device work: its real end
      if not self._watching and not len(self._timeline):
        raise RuntimeError("next_event() with nothing scheduled")
      timeout = self._timeline.peek_time() - now if len(self._timeline) else None
      if self._watching:
        concurrent.futures.wait([w for w, _ in self._watching], timeout, concurrent.futures.FIRST_COMPLETED)
      else:
        time.sleep(timeout)


def make_clock(cfg: ClockConfig, num_learners: int, seed: int,
               batch_shares: Sequence[float] = ()) -> VirtualClock | RealClock:
  """The clock named by cfg.kind."""
  return (VirtualClock if cfg.kind == "virtual" else RealClock)(cfg, num_learners, seed, batch_shares)
