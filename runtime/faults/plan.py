"""Fault plans: typed scheduled faults, seeded random crash traces, and when a round crashes.

Everything here is pure bookkeeping (no JAX): the schedule is parsed once, at the config boundary,
into `Fault`s; the Poisson trace of each slice depends only on the seed, so every mode faces the
same failures; `round_crash` says where in a learner's round the first of its crashes falls.
"""

import dataclasses
import math
from typing import Any, Iterator, Sequence

import numpy as np

from runtime.config import schedule as schedule_lib
from runtime.errors import ConfigError, check

KINDS = ("crash", "straggler", "corrupt", "link", "bug")
# What a learner of several slices does when one of them fails; the goodput simulator's options (runtime/sim), with
# the same meaning: "reconfigure" trains on without it, "restart" goes down and comes back from Θ.
LEARNER_RECOVERIES = ("reconfigure", "restart")
# Each kind's fields in sorted order (errors list them so).
_FIELDS = {
    "crash": {"learner": int, "repair": float, "slice": int, "step": int, "time": float},
    "straggler": {"duration": float, "factor": float, "learner": int, "time": float},
    "corrupt": {"how": str, "learner": int, "time": float},
    "link": {"duration": float, "learner": int, "mode": str, "time": float},
    "bug": {"learner": int, "time": float},  # from `time` on, every dispatch of the learner's program fails
}
# how=flip|truncate damage a compressed report's payload bytes (runtime/wire/payload.py).
_CHOICES = {"how": ("nan", "inf", "huge", "flip", "truncate"), "mode": ("delay", "drop")}


@dataclasses.dataclass(frozen=True)
class Fault:
  """One scheduled fault; `time` is seconds of the run's clock (modeled or wall), or `step` a learner's inner step
  (crash only)."""

  kind: str
  learner: int
  time: float = -1.0
  step: int = -1
  duration: float = 0.0
  factor: float = 1.0
  how: str = "nan"
  mode: str = "delay"
  repair: float = -1.0  # < 0: the config's repair_seconds
  slice: int = -1  # crash: only the learner's slice of this index fails (a learner of several); < 0: all of them
  text: str = dataclasses.field(default="", compare=False)  # as written in the schedule, for messages


@dataclasses.dataclass(frozen=True)
class FaultConfig:
  """Failures injected from the controller, and what recovering from them costs in every mode."""

  # Scheduled faults, parsed from the config's ';'-separated text, e.g. "crash:learner=1,time=40;
  # straggler:learner=2,time=10,duration=50,factor=3; corrupt:learner=0,time=20,how=nan;
  # link:learner=3,time=5,duration=20,mode=drop; bug:learner=1,time=40" (a program bug: stops the learner for good).
  # A crash takes down every slice of its learner, or with slice=J only the J-th of a learner of several slices.
  schedule: tuple[Fault, ...] = ()
  mtbi_chip_seconds: float = 0.0  # per-chip mean time between interruptions; 0 = no random crashes
  chips_per_slice: int = 256
  repair_seconds: float = 60.0  # a crashed slice is back after this long
  spare_swap_seconds: float = 5.0  # a spare slice takes over a crashed learner after this long
  report_timeout_seconds: float = 30.0  # a learner whose report got no answer pulls Θ after this long
  restart_seconds: float = 30.0  # DP without elasticity: restart after every failure
  # DP without elasticity: steps between the checkpoints it restarts from (work after the last one is lost); not the
  # run's own checkpoint_every, from which a killed run resumes
  restart_checkpoint_every: int = 10
  reconfig_seconds: float = 8.0  # elastic DP, and a learner of several slices that reconfigures: drop or re-add one
  # A learner of several slices (slices_per_learner > 1) that loses one: "reconfigure" (keeps its state and trains on
  # the others, growing back when a slice returns) or "restart" (down, its unmerged work lost, back from Θ on a full
  # set); one of LEARNER_RECOVERIES. A learner of one slice always restarts.
  learner_recovery: str = "reconfigure"
  trace: str = ""  # a recorded failure trace (JSON of `launch.simulate --trace`) replayed instead of mtbi's crashes
  # Seconds of the run's clock per second of a random or replayed crash trace (its failure and repair times): under
  # the real clock, 1e-4 replays a year-scale trace in under an hour of wall time; 1 = as drawn.
  time_scale: float = 1.0


def parse_schedule(text: str) -> tuple[Fault, ...]:
  """Parses the schedule text; errors name `faults.schedule` and what is allowed."""
  faults = []
  for kind, values, item in schedule_lib.parse(text, "faults.schedule", _FIELDS, "a fault kind",
                                               "{key} of type {type}", _value_problem):
    if "learner" not in values:
      raise ConfigError("faults.schedule", item, "a learner=M field")
    fault = Fault(kind, **values, text=item)
    if (fault.time < 0) == (fault.step < 0):
      raise ConfigError("faults.schedule", item, "exactly one of time >= 0 or step >= 0 (step: crash only)")
    faults.append(fault)
  return tuple(faults)


def _value_problem(key: str, value: Any) -> str | None:
  """What a fault field's value needs, or None when it is allowed."""
  if isinstance(value, float) and not math.isfinite(value):
    return f"{key} a finite number"
  if key in ("learner", "duration", "factor", "slice") and value < 0:
    return f"{key} >= 0"
  if key in _CHOICES and value not in _CHOICES[key]:
    return f"{key} in {_CHOICES[key]}"
  return None


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

  def fired(self, learner: int) -> None:
    """The learner crashed: the step-scheduled crash its round was armed with, if any, is spent."""
    fault = self._armed.pop(learner, None)
    if fault is not None:
      self._step_crashes.remove(fault)


def validate(run) -> None:
  """The run's fault settings and schedule (learners, then those of lent slices)."""
  f = run.faults
  for name in ("mtbi_chip_seconds", "repair_seconds", "spare_swap_seconds", "report_timeout_seconds",
               "restart_seconds", "reconfig_seconds"):
    check(getattr(f, name) >= 0, f"faults.{name}", getattr(f, name), "a float >= 0")
  check(f.chips_per_slice >= 1, "faults.chips_per_slice", f.chips_per_slice, "an integer >= 1")
  check(f.restart_checkpoint_every >= 1, "faults.restart_checkpoint_every", f.restart_checkpoint_every,
        "an integer >= 1")
  check(f.learner_recovery in LEARNER_RECOVERIES, "faults.learner_recovery", f.learner_recovery,
        f"one of {LEARNER_RECOVERIES}")
  for fault in f.schedule:
    check(0 <= fault.learner < run.learners + run.lent_slices, "faults.schedule", fault.text,
          f"learner in [0, {run.learners + run.lent_slices}) (learners, then those of lent slices)")
    check(fault.slice < run.slices_per_learner, "faults.schedule", fault.text,
          f"slice in [0, slices_per_learner={run.slices_per_learner}) (the learner's J-th slice), or no slice field")
  check(f.time_scale > 0, "faults.time_scale", f.time_scale, "a float > 0 (the run's seconds per trace second)")
