"""Fault plans: seeded random crash traces, and when a round crashes.

Pure bookkeeping (no JAX) over the `Fault`s parsed at the config boundary (runtime/config/faults.py): the
Poisson trace of each slice depends only on the seed, so every mode faces the same failures; `round_crash` says
where in a learner's round the first of its crashes falls.
"""

import dataclasses
from typing import Any, Iterator, Sequence

import numpy as np

from runtime.config.faults import Fault, FaultConfig


def crash_times(cfg: FaultConfig, slice_index: int, seed: int) -> Iterator[tuple[float, float]]:
  """(time, repair seconds) of each failure of one slice: seeded Poisson (each chip fails at 1 / mtbi_chip_seconds),
  both scaled by `time_scale` onto the run's clock.

  The trace depends only on (seed, slice) and the repair time, never on the training mode,
  so every mode faces the same failures. A slice cannot fail again while it is being repaired.
  """
  if cfg.mtbi_chip_seconds <= 0:
    return
  rng = np.random.default_rng([seed, 7919, slice_index])
  mean_gap = cfg.mtbi_chip_seconds / cfg.chips_per_slice
  t = 0.0
  while True:
    t += rng.exponential(mean_gap)
    yield t * cfg.time_scale, cfg.repair_seconds * cfg.time_scale
    t += cfg.repair_seconds


def timed_events(schedule: Sequence[Fault]) -> list[tuple[float, str, int, Any]]:
  """(time, event kind, learner, payload) of each time-scheduled fault, in schedule order; a
  straggler also ends, and a step-scheduled crash is armed at dispatch instead (see round_crash), as is a bug
  (see program_bug)."""
  events = []
  for fault in (f for f in schedule if f.time >= 0 and f.kind != "bug"):
    if fault.kind == "crash":
      events.append((fault.time, "learner_crash", fault.learner, fault))
    elif fault.kind == "straggler":
      events += [(fault.time, "straggler", fault.learner, fault.factor),
                 (fault.time + fault.duration, "straggler", fault.learner, 1.0)]
    elif fault.kind == "corrupt":
      events.append((fault.time, "corrupt", fault.learner, fault.how))
    else:
      events.append((fault.time, "link", fault.learner, (fault.time + fault.duration, fault.mode)))
  return events


def program_bug(schedule: Sequence[Fault], learner: int, now: float) -> Fault | None:
  """The learner's first program bug due by `now`, or None: a function of the schedule alone, so nothing to save."""
  return next((f for f in schedule if f.kind == "bug" and f.learner == learner and f.time <= now), None)


@dataclasses.dataclass(frozen=True)
class RoundCrash:
  """Where a round fails: at modeled time `at`, in inner step `step`; `fault` if step-scheduled."""

  at: float
  step: int
  fault: Fault | None


def round_crash(now: float, modeled: float, first_step: int, steps: int, step_faults: Sequence[Fault],
                next_crash_time: float) -> RoundCrash | None:
  """The first crash inside a round of `steps` inner steps from `first_step`, dispatched at `now`.

  `modeled` is the round's modeled duration (0 when time is not modeled, under the real clock: then
  only step-scheduled crashes fall in it, at `now`); `next_crash_time` is when the learner or its
  slice is next due to fail.
  """
  ordered = sorted((f for f in step_faults if first_step <= f.step < first_step + steps), key=lambda f: f.step)
  candidates = [RoundCrash(now + (f.step - first_step) / steps * modeled, f.step, f) for f in ordered]
  if now <= next_crash_time < now + modeled:
    candidates.append(RoundCrash(next_crash_time, first_step + int((next_crash_time - now) / modeled * steps), None))
  return min(candidates, key=lambda c: c.at, default=None)


def fault_index(schedule: tuple[Fault, ...], fault: Fault) -> int:
  """The fault's position in its schedule, by identity (two faults may be equal)."""
  return next(i for i, f in enumerate(schedule) if f is fault)


class CrashPlan:
  """A run's progress through its crash plan: each learner's and slice's next crash, and the
  step-scheduled crashes not yet fired (each fires once: a learner that rejoins and passes the same
  step again does not fail again)."""

  def __init__(self, schedule: Sequence[Fault], traces: Sequence[Iterator[tuple[float, float]]]):
    self._traces = list(traces)
    self._repair: dict[int, float] = {}  # slice -> repair seconds of its latest drawn failure
    self._drawn = [0] * len(self._traces)  # times drawn from each slice's trace
    self._schedule = tuple(schedule)
    self._step_crashes = [f for f in schedule if f.kind == "crash" and f.step >= 0]
    self._armed: dict[int, Fault] = {}  # learner -> the step-scheduled crash its round is armed with
    self._next: dict[tuple[str, int], float] = {}  # ("slice" | "learner", index) -> time
    for fault in schedule:
      if fault.kind == "crash" and fault.time >= 0:
        self._next[("learner", fault.learner)] = fault.time

  def next_slice_crash(self, slice_index: int) -> float | None:
    """Draws the slice's next crash time from its trace (None when the trace is empty)."""
    self._drawn[slice_index] += 1
    at = self._draw(slice_index)
    if at is not None:
      self._next[("slice", slice_index)] = at
    return at

  def _draw(self, slice_index: int) -> float | None:
    failure = next(self._traces[slice_index], None)
    if failure is None:
      return None
    at, self._repair[slice_index] = failure
    return at

  def repair_of(self, slice_index: int) -> float:
    """How long the slice's latest drawn failure takes to repair."""
    return self._repair[slice_index]

  def happened(self, kind: str, index: int) -> None:
    """The slice's or learner's due crash took place."""
    self._next.pop((kind, index), None)

  def in_round(self, learner: int, slices: Sequence[int], first_step: int, steps: int, now: float,
               modeled: float) -> RoundCrash | None:
    """The crash that falls in the learner's next round on `slices` (remembered if step-scheduled), or None."""
    self._armed.pop(learner, None)
    at = min([self._next.get(("learner", learner), float("inf"))] + [self._next.get(("slice", s), float("inf"))
                                                                     for s in slices])
    crash = round_crash(now, modeled, first_step, steps, [f for f in self._step_crashes if f.learner == learner], at)
    if crash is not None and crash.fault is not None:
      self._armed[learner] = crash.fault
    return crash

  def snapshot(self) -> dict:
    """How far the plan has got (faults by their index in the schedule)."""
    index = lambda fault: fault_index(self._schedule, fault)
    return dict(drawn=list(self._drawn), step_crashes=[index(f) for f in self._step_crashes],
                armed=[[m, index(f)] for m, f in sorted(self._armed.items())],
                next=[[kind, i, at] for (kind, i), at in sorted(self._next.items())])

  def restore(self, saved: dict) -> None:
    """Back where `snapshot` was; the traces (fresh, as the plan was built) are drawn again as far."""
    for s, drawn in enumerate(saved["drawn"]):
      for _ in range(drawn):
        self._draw(s)
    self._drawn = list(saved["drawn"])
    self._step_crashes = [self._schedule[i] for i in saved["step_crashes"]]
    self._armed = {m: self._schedule[i] for m, i in saved["armed"]}
    self._next = {(kind, i): at for kind, i, at in saved["next"]}

  def armed(self, learner: int) -> Fault | None:
    """The step-scheduled crash the learner's round is armed with, if any."""
    return self._armed.get(learner)

  def fired(self, learner: int) -> None:
    """The step-scheduled crash the learner's round was armed with, if any, took it down: it is spent."""
    fault = self._armed.pop(learner, None)
    if fault is not None:
      self._step_crashes.remove(fault)

  def disarmed(self, learner: int) -> None:
    """The learner's round is gone before the step-scheduled crash it was armed with fired: that crash stays in the
    plan, to fire where the learner reaches its step again."""
    self._armed.pop(learner, None)
