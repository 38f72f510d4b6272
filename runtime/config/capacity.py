"""Capacity lent for a while (scavenging): slices that arrive mid-run, each for a new learner, and are reclaimed.

Parsed once, at the config boundary, from text like the fault schedule:
"lend:slices=4,time=100,duration=300" lends 4 slices at virtual second 100 for 300 s;
"random:slices=4,gap=200,duration=300" is a seeded availability trace of 4 slices that are absent for an
exponential gap (mean 200 s), then lent for an exponential duration (mean 300 s), again and again.
"""

import dataclasses
import math
from typing import Iterator

import numpy as np

from runtime.config import schedule as schedule_lib
from runtime.errors import ConfigError, check

_FIELDS = {"lend": {"slices": int, "time": float, "duration": float},
           "random": {"slices": int, "gap": float, "duration": float}}


@dataclasses.dataclass(frozen=True)
class Lend:
  """One item of the capacity schedule: a fixed lend, or a random availability trace."""

  kind: str  # "lend" | "random"
  slices: int
  duration: float  # lend: seconds lent; random: mean seconds lent
  time: float = 0.0  # lend: when the slices arrive
  gap: float = 0.0  # random: mean seconds absent before each lend
  text: str = dataclasses.field(default="", compare=False)


@dataclasses.dataclass(frozen=True)
class CapacityConfig:
  """Slices lent to the run for a while; each lent slice runs a new learner until it is reclaimed."""

  # ';'-separated items: "lend:slices=4,time=100,duration=300" and/or "random:slices=4,gap=200,duration=300"
  # (seconds of the run's clock; modes decoupled and diloco_sync; needs data.assignment='service'). Empty = a fixed set.
  schedule: tuple[Lend, ...] = ()


def parse(text: str) -> tuple[Lend, ...]:
  """Parses the capacity schedule; errors name `capacity.schedule` and what is allowed."""
  items = []
  for kind, values, item in schedule_lib.parse(text, "capacity.schedule", _FIELDS, "an item kind", "{key} a number"):
    if set(values) != set(_FIELDS[kind]):
      raise ConfigError("capacity.schedule", item, f"every {kind} field: {list(_FIELDS[kind])}")
    if values["slices"] < 1 or not all(math.isfinite(v) and v >= 0 for v in values.values()):
      raise ConfigError("capacity.schedule", item, "slices >= 1 and finite times >= 0")
    if values["duration"] <= 0 or (kind == "random" and values["gap"] <= 0):
      raise ConfigError("capacity.schedule", item, "duration > 0 (and gap > 0)")
    items.append(Lend(kind, text=item, **values))
  return tuple(items)


def most_lent(schedule: tuple[Lend, ...]) -> int:
  """The most slices lent at once: fixed lends touching in time count as overlapping; a trace lends its own."""
  edges = sorted([(l.time, 0, l.slices) for l in schedule if l.kind == "lend"]
                 + [(l.time + l.duration, 1, -l.slices) for l in schedule if l.kind == "lend"])
  level = peak = 0
  for _, _, change in edges:  # arrivals sort before reclaims at equal times
    level += change
    peak = max(peak, level)
  return peak + sum(l.slices for l in schedule if l.kind == "random")


def trace(item: Lend, seed: int, index: int) -> Iterator[tuple[float, float]]:
  """(gap, duration) of each lend of a random item, seeded by (seed, its index in the schedule)."""
  rng = np.random.default_rng([seed, 4421, index])
  while True:
    yield float(rng.exponential(item.gap)), float(rng.exponential(item.duration))


def validate(run) -> None:
  """Lent capacity runs Decoupled DiLoCo learners fed by the data service (lends at seconds of the run's clock)."""
  if not run.capacity.schedule:
    return
  text = "; ".join(l.text for l in run.capacity.schedule)
  check(run.mode == "decoupled", "capacity.schedule", text, f"empty in mode '{run.mode}' (lent slices run "
        "Decoupled DiLoCo learners: mode decoupled)")
  check(run.data.assignment == "service", "capacity.schedule", text, "empty unless data.assignment='service' "
        "(learners that join and leave take their data from the service)")
  check(not run.data.learner_batches, "capacity.schedule", text, "empty with data.learner_batches (lent learners "
        "take the equal share data.batch_size / learners)")
