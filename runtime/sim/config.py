"""Typed settings of the goodput simulator, built once from a ConfigDict; the paper's Table 1."""

import dataclasses
import math

import ml_collections

from runtime.errors import check

SECONDS_PER_DAY = 86_400.0
SECONDS_PER_YEAR = 365.0 * SECONDS_PER_DAY
# The runtime's faults.learner_recovery offers the same two, meaning the same (runtime/diloco/slices/several_slices.py).
LEARNER_RECOVERIES = ("reconfigure", "restart")
SETUP_KINDS = ("data-parallel", "elastic", "decoupled")

# Table 1 of the paper (second-hand, PAPER.md): goodput in % at one interruption per chip-year.
PAPER_MTBI_YEARS = 1.0
PAPER_CHIPS = (150_000, 300_000, 600_000, 1_200_000, 2_400_000)
PAPER_GOODPUT = {
    "data-parallel": (72, 57, 38, 27, 18),
    "elastic data-parallel": (88, 80, 69, 58, 40),
    "Decoupled M=2": (94, 88, 80, 70, 54),
    "Decoupled M=4": (96, 93, 89, 82, 73),
    "Decoupled M=8": (98, 96, 94, 88, 80),
    "Decoupled M=16": (99, 98, 96, 93, 86),
}


@dataclasses.dataclass(frozen=True)
class Setup:
  """One table row: how the chips are organised into independently failing units."""

  name: str
  kind: str  # one of SETUP_KINDS
  learners: int


@dataclasses.dataclass(frozen=True)
class ClusterSimConfig:
  """Everything the simulator reads; see configs/goodput.py for the meaning of each field."""

  mtbi_years: float
  chips: tuple[int, ...]
  learners: tuple[int, ...]
  quorum: int
  slice_chips: int
  repair_s: float
  step_s: float
  restart_s: float
  reconfig_s: float
  checkpoint_every_steps: int
  sync_every_steps: int
  inflight_steps: int
  learner_recovery: str
  spare_fraction: float
  round_wait_s: float
  syncer_mtbi_days: float
  syncer_restart_s: float
  speed_jitter: float
  horizon_days: float
  seeds: int
  seed: int
  calibrate: bool
  calibration_chips: int

  @property
  def mtbi_s(self) -> float:
    """Mean time between interruptions of one chip, in seconds."""
    return self.mtbi_years * SECONDS_PER_YEAR

  @property
  def horizon_s(self) -> float:
    """Simulated wall-clock time per seed, in seconds."""
    return self.horizon_days * SECONDS_PER_DAY


def setups(config: ClusterSimConfig) -> tuple[Setup, ...]:
  """The table's rows in print order: data-parallel, elastic data-parallel, then one per M."""
  rows = [Setup("data-parallel", "data-parallel", 1),
          Setup("elastic data-parallel", "elastic", 1)]
  rows += [Setup(f"Decoupled M={m}", "decoupled", m) for m in config.learners]
  return tuple(rows)


def _number(field: str, value: object, minimum: float, strict: bool) -> float:
  """The value as a float, if it is a finite number above (or at) minimum."""
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  ok = ok and (value > minimum if strict else value >= minimum)
  check(ok, field, value, f"a finite number {'>' if strict else '>='} {minimum}")
  return float(value)


def _is_int(value: object, minimum: int) -> bool:
  """Whether the value is an int (not a bool) of at least minimum."""
  return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _int_tuple(field: str, value: object, minimum: int) -> tuple[int, ...]:
  """The value as a non-empty tuple of ints, each at least minimum."""
  items = tuple(value) if isinstance(value, (tuple, list)) else ()
  ok = bool(items) and all(_is_int(v, minimum) for v in items)
  check(ok, field, value, f"a non-empty tuple of ints >= {minimum}")
  return items


def from_config_dict(config: ml_collections.ConfigDict) -> ClusterSimConfig:
  """Validates the ConfigDict once and returns the frozen settings the library reads."""
  chips = _int_tuple("chips", config.chips, 1)
  learners = _int_tuple("learners", config.learners, 1)
  number = {f: _number(f, config[f], 0.0, strict=True)
            for f in ("mtbi_years", "step_s", "horizon_days")}
  number |= {f: _number(f, config[f], 0.0, strict=False)
             for f in ("repair_s", "restart_s", "reconfig_s", "speed_jitter", "spare_fraction",
                       "round_wait_s", "syncer_mtbi_days", "syncer_restart_s")}
  for field in ("slice_chips", "checkpoint_every_steps", "sync_every_steps", "inflight_steps", "seeds"):
    check(_is_int(config[field], 1), field, config[field], "an int >= 1")
  check(_is_int(config.seed, 0), "seed", config.seed, "an int >= 0")
  check(_is_int(config.quorum, 1) and config.quorum <= min(learners), "quorum", config.quorum,
         f"an int in [1, min(learners) = {min(learners)}]")
  smallest = min(chips) / max(learners)
  check(smallest >= config.slice_chips, "learners", config.learners,
        f"at most min(chips) / slice_chips = {min(chips) / config.slice_chips:g} learners (one slice each)")
  check(config.learner_recovery in LEARNER_RECOVERIES, "learner_recovery",
         config.learner_recovery, f"one of {LEARNER_RECOVERIES}")
  check(isinstance(config.calibrate, bool), "calibrate", config.calibrate, "True or False")
  check(config.calibration_chips in PAPER_CHIPS, "calibration_chips", config.calibration_chips,
         f"one of the paper's columns {PAPER_CHIPS}")
  return ClusterSimConfig(
      chips=chips, learners=learners, quorum=config.quorum, slice_chips=config.slice_chips,
      checkpoint_every_steps=config.checkpoint_every_steps,
      sync_every_steps=config.sync_every_steps, inflight_steps=config.inflight_steps,
      learner_recovery=config.learner_recovery, seeds=config.seeds, seed=config.seed,
      calibrate=config.calibrate, calibration_chips=config.calibration_chips, **number)
