"""Fault plans driven from the controller: scheduled faults, seeded random crashes, and injection.

A crash is injected from inside the learner's device program: a host callback in every inner
step raises once the step reaches the armed one, so the controller sees a genuine JAX runtime
error, either at dispatch or when it awaits the result.
"""

import dataclasses
from typing import Iterator

import numpy as np

from runtime.config import FaultConfig
from runtime.errors import ConfigError

KINDS = ("crash", "straggler", "corrupt", "link")
_FIELDS = {
    "crash": {"learner": int, "time": float, "step": int, "repair": float},
    "straggler": {"learner": int, "time": float, "duration": float, "factor": float},
    "corrupt": {"learner": int, "time": float, "how": str},
    "link": {"learner": int, "time": float, "duration": float, "mode": str},
}
_CHOICES = {"how": ("nan", "inf", "huge"), "mode": ("delay", "drop")}


@dataclasses.dataclass(frozen=True)
class Fault:
  """One scheduled fault; `time` is virtual seconds, or `step` a learner's inner step (crash only)."""

  kind: str
  learner: int
  time: float = -1.0
  step: int = -1
  duration: float = 0.0
  factor: float = 1.0
  how: str = "nan"
  mode: str = "delay"
  repair: float = -1.0  # < 0: the config's repair_seconds


class SliceCrash(RuntimeError):
  """Raised inside a learner's device program to fail its slice."""


def parse_schedule(text: str, num_learners: int) -> list[Fault]:
  """Parses FaultConfig.schedule; errors name `faults.schedule` and what is allowed."""
  faults = []
  for item in filter(None, (part.strip() for part in text.split(";"))):
    kind, _, args = item.partition(":")
    kind = kind.strip()
    if kind not in KINDS:
      raise ConfigError("faults.schedule", item, f"a fault kind in {KINDS}")
    values = {}
    for pair in filter(None, (p.strip() for p in args.split(","))):
      key, _, raw = pair.partition("=")
      key = key.strip()
      if key not in _FIELDS[kind]:
        raise ConfigError("faults.schedule", item, f"{kind} fields {sorted(_FIELDS[kind])}")
      try:
        values[key] = _FIELDS[kind][key](raw.strip())
      except ValueError:
        raise ConfigError("faults.schedule", item, f"{key} of type {_FIELDS[kind][key].__name__}") from None
      if key in _CHOICES and values[key] not in _CHOICES[key]:
        raise ConfigError("faults.schedule", item, f"{key} in {_CHOICES[key]}")
    fault = Fault(kind, **values)
    if not 0 <= fault.learner < num_learners:
      raise ConfigError("faults.schedule", item, f"learner in [0, {num_learners})")
    if (fault.time < 0) == (fault.step < 0):
      raise ConfigError("faults.schedule", item, "exactly one of time >= 0 or step >= 0 (step: crash only)")
    faults.append(fault)
  return faults


def crash_times(cfg: FaultConfig, slice_index: int, seed: int) -> Iterator[float]:
  """Seeded Poisson crash times of one slice (each chip fails at 1 / mtbi_chip_seconds).

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
    yield t
    t += cfg.repair_seconds


class Injector:
  """Arms crashes inside device programs and answers the controller's fault questions."""

  def __init__(self, num_learners: int):
    self._armed = [np.iinfo(np.int64).max] * num_learners

  def arm(self, learner: int, step: int) -> None:
    """The learner's program raises when it reaches inner step `step` (its global step count)."""
    self._armed[learner] = step

  def disarm(self, learner: int) -> None:
    self._armed[learner] = np.iinfo(np.int64).max

  def check(self, learner: int, step: np.ndarray) -> None:
    """Host callback run at every inner step of an armed-capable program."""
    if int(step) >= self._armed[learner]:
      raise SliceCrash(f"injected crash of learner {learner}'s slice at inner step {int(step)}")


def corrupt(params, how: str):
  """A corrupted copy of a report's parameters: NaN, Inf, or an absurdly scaled update."""
  import jax  # pylint: disable=g-import-not-at-top
  scale = {"nan": float("nan"), "inf": float("inf"), "huge": 1e9}[how]
  return jax.tree.map(lambda x: x * scale, params)


def device_check(injector: Injector, learner: int, mesh):
  """A step hook that runs the injector's check on every device of the slice.

  Each device calls the host itself (shard_map), so an injected crash fails every device's
  program at the same step; a single host call would leave the other devices waiting forever
  in the next collective.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental import io_callback  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top

  def per_device(step):
    io_callback(lambda s: injector.check(learner, s), None, step, ordered=False)
    return step

  return lambda step: jax.shard_map(per_device, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)(step)
