"""One seed's failure trace of one setup (per slice: when it failed, when its repair ended), drawn or read from JSON.

JSON (`to_json`), times in seconds from the start of the run:
  {"format": "goodput-failure-trace/1", "setup": "Decoupled M=4", "kind": "decoupled", "learners": 4,
   "spares": 0, "slice_chips": 256.0, "step_s": 1.0, "horizon_s": 86400.0,
   "slices": [{"slice": 0, "learner": 0, "failures": [[t_fail, t_repaired], ...]}, ...],
   "syncer_failures": [[t_fail, t_back], ...]}
Slice i belongs to learner i // (len(slices) // learners). A slice is never interrupted while in repair
(its failures do not overlap); `spares` hot spare slices stand in for slices in repair (data-parallel and
restarting learners) and are not interrupted while they stand in or idle.
"""

import dataclasses
import json
import math

import numpy as np

from runtime.errors import ConfigError, UsageError, check
from runtime.sim.config import SETUP_KINDS, ClusterSimConfig, Setup, setups
from runtime.sim.timeline import downtime_starts

FORMAT = "goodput-failure-trace/1"


@dataclasses.dataclass(frozen=True, eq=False)
class FailureTrace:
  """Failures of one setup's slices (and its syncer) over one horizon, replayable in virtual time."""

  setup: Setup
  slices: int
  spares: int
  slice_chips: float
  step_s: float
  horizon_s: float
  slice_of: np.ndarray  # int64 per failure, failures ordered by (learner, time)
  fail_s: np.ndarray
  repaired_s: np.ndarray
  syncer_failures: np.ndarray  # shape (n, 2): the syncer's failure and the end of its recovery

  @property
  def slices_per_learner(self) -> int:
    """Slices of one learner (all of them for data-parallel and elastic data-parallel)."""
    return self.slices // self.setup.learners


def slices_per_learner(config: ClusterSimConfig, setup: Setup, chips: int) -> int:
  """Slices per learner: N / (M · slice_chips) rounded, at least one (validation keeps N/M >= a slice)."""
  return max(1, round(chips / (setup.learners * config.slice_chips)))


def spares_of(config: ClusterSimConfig, setup: Setup, slices: int) -> int:
  """Hot spares of a setup that swaps a failed slice for one: ceil(spare_fraction · slices), else 0."""
  swaps = setup.kind == "data-parallel" or (setup.kind == "decoupled" and config.learner_recovery == "restart")
  return math.ceil(config.spare_fraction * slices - 1e-9) if swaps else 0


def _poisson_line(rng: np.random.Generator, rate: float, length: float) -> np.ndarray:
  """Sorted arrival times of a Poisson process of `rate` on [0, length)."""
  mean = rate * length
  times = np.cumsum(rng.exponential(1.0 / rate, size=int(mean + 8.0 * math.sqrt(mean) + 16)))
  while times[-1] < length:
    times = np.append(times, times[-1] + np.cumsum(rng.exponential(1.0 / rate, size=times.size)))
  return times[:np.searchsorted(times, length)]


def draw(config: ClusterSimConfig, setup: Setup, chips: int, seed_index: int) -> FailureTrace:
  """The trace of one seed: every chip interrupted at rate 1/MTBI, except on slices in repair."""
  per_learner = slices_per_learner(config, setup, chips)
  slices = setup.learners * per_learner
  slice_chips = chips / slices
  horizon = config.horizon_s
  rng = np.random.default_rng([config.seed, seed_index, SETUP_KINDS.index(setup.kind), setup.learners, chips])
  # Learner u's failures lie at u·horizon on one line; each belongs to a uniformly drawn slice of it.
  line = _poisson_line(rng, per_learner * slice_chips / config.mtbi_s, setup.learners * horizon)
  learner = np.minimum((line // horizon).astype(np.int64), setup.learners - 1)
  fail = line - learner * horizon
  slice_of = learner * per_learner + rng.integers(per_learner, size=line.size)
  # A failure of a slice in repair is not one: keep the slice's first, then its first after each repair.
  by_slice = np.argsort(slice_of.astype(np.int16 if slices < 2**15 else np.int64), kind="stable")
  key = slice_of[by_slice] * (horizon + config.repair_s + 1.0) + fail[by_slice]
  kept = np.zeros(line.size, bool)
  kept[by_slice[downtime_starts(key, key + config.repair_s)]] = True
  slice_of, fail = slice_of[kept], fail[kept]
  syncer = np.zeros((0, 2))
  if setup.kind == "decoupled" and config.syncer_mtbi_days > 0:
    down = _poisson_line(rng, 1.0 / (config.syncer_mtbi_days * 86_400.0), horizon)
    down = down[downtime_starts(down, down + config.syncer_restart_s)]  # one recovery handles both
    syncer = np.stack([down, down + config.syncer_restart_s], axis=1)
  return FailureTrace(setup, slices, spares_of(config, setup, slices), slice_chips, config.step_s, horizon,
                      slice_of, fail, fail + config.repair_s, syncer)


def to_json(trace: FailureTrace) -> str:
  """The trace as JSON text (module docstring); floats are written so that they read back exactly."""
  per_slice = [[] for _ in range(trace.slices)]
  for index, fail, repaired in zip(trace.slice_of.tolist(), trace.fail_s.tolist(), trace.repaired_s.tolist()):
    per_slice[index].append([fail, repaired])
  k = trace.slices_per_learner
  return json.dumps({
      "format": FORMAT, "setup": trace.setup.name, "kind": trace.setup.kind, "learners": trace.setup.learners,
      "spares": trace.spares, "slice_chips": trace.slice_chips, "step_s": trace.step_s,
      "horizon_s": trace.horizon_s,
      "slices": [{"slice": i, "learner": i // k, "failures": f} for i, f in enumerate(per_slice)],
      "syncer_failures": trace.syncer_failures.tolist()})


def _field(data: dict, name: str, kind: type, minimum: float, allowed: str) -> object:
  """data[name] if it has the type and is at least minimum; else ConfigError naming trace.<name>."""
  value = data.get(name) if isinstance(data, dict) else None
  number_ok = kind is not float or (isinstance(value, (int, float)) and math.isfinite(value))
  ok = isinstance(value, (int, float) if kind is float else kind) and not isinstance(value, bool)
  check(ok and number_ok and value >= minimum, f"trace.{name}", value, allowed)
  return float(value) if kind is float else value


def _intervals(field: str, value: object, horizon_s: float) -> np.ndarray:
  """[[start, end], ...] in time order, each inside the horizon's start, none overlapping the next."""
  allowed = f"a list of [start, end] numbers, 0 <= start < {horizon_s:g} (horizon_s), start < end <= next start"
  try:
    pairs = np.array(value, dtype=np.float64).reshape(-1, 2) if isinstance(value, list) else None
  except (TypeError, ValueError):
    pairs = None
  ok = pairs is not None and len(pairs) == len(value) and bool(np.all(np.isfinite(pairs)))
  ok = ok and bool(np.all((pairs[:, 0] >= 0) & (pairs[:, 0] < horizon_s) & (pairs[:, 0] < pairs[:, 1])))
  check(ok and bool(np.all(pairs[1:, 0] >= pairs[:-1, 1])), field, value, allowed)
  return pairs


def from_json(text: str) -> FailureTrace:
  """Reads to_json's format; anything malformed raises ConfigError naming the trace field."""
  try:
    data = json.loads(text)
  except json.JSONDecodeError as error:
    raise ConfigError("trace", text[:40], f"JSON text ({error.msg})") from None
  check(isinstance(data, dict) and data.get("format") == FORMAT, "trace.format",
        data.get("format") if isinstance(data, dict) else data, repr(FORMAT))
  kind = data.get("kind")
  check(kind in SETUP_KINDS, "trace.kind", kind, f"one of {SETUP_KINDS}")
  learners = _field(data, "learners", int, 1, "an int >= 1")
  check(isinstance(data.get("setup"), str), "trace.setup", data.get("setup"), "the setup's name")
  horizon_s = _field(data, "horizon_s", float, 1e-300, "a finite number > 0")
  entries = data.get("slices")
  count_ok = isinstance(entries, list) and entries and len(entries) % learners == 0
  check(count_ok, "trace.slices", entries, f"a non-empty list, a multiple of learners = {learners} long")
  slice_of, fail, repaired = [], [], []
  for index, entry in enumerate(entries):
    check(isinstance(entry, dict) and entry.get("slice") == index, f"trace.slices[{index}].slice",
          entry.get("slice") if isinstance(entry, dict) else entry, str(index))
    pairs = _intervals(f"trace.slices[{index}].failures", entry.get("failures"), horizon_s)
    slice_of.append(np.full(len(pairs), index, np.int64))
    fail.append(pairs[:, 0])
    repaired.append(pairs[:, 1])
  slice_of, fail, repaired = map(np.concatenate, (slice_of, fail, repaired))
  order = np.lexsort((slice_of, fail, slice_of // (len(entries) // learners)))
  return FailureTrace(
      Setup(data["setup"], kind, learners), len(entries), _field(data, "spares", int, 0, "an int >= 0"),
      _field(data, "slice_chips", float, 1e-300, "a finite number > 0"),
      _field(data, "step_s", float, 1e-300, "a finite number > 0"), horizon_s,
      slice_of[order], fail[order], repaired[order],
      _intervals("trace.syncer_failures", data.get("syncer_failures", []), horizon_s))


def export(config: ClusterSimConfig, setup_name: str, chips: int, seed_index: int, path: str) -> str:
  """Draws the trace of one setup, chip count and seed (as simulate() does), writes its JSON to path."""
  by_name = {setup.name: setup for setup in setups(config)}
  learners = by_name[setup_name].learners if setup_name in by_name else 1
  for flag, value, ok, allowed in (
      ("--trace_setup", setup_name, setup_name in by_name, f"one of {sorted(by_name)}"),
      ("--trace_chips", chips, chips >= learners * config.slice_chips,
       f"at least learners · slice_chips = {learners * config.slice_chips}"),
      ("--trace_seed", seed_index, 0 <= seed_index < config.seeds, f"a seed index in [0, seeds = {config.seeds})")):
    if not ok:
      raise UsageError(f"{flag}={value}: allowed {allowed}")
  setup = by_name[setup_name]
  trace = draw(config, setup, chips, seed_index)
  with open(path, "w", encoding="utf-8") as file:
    file.write(to_json(trace))
  return (f"Wrote {path}: {setup_name}, {chips} chips in {trace.slices} slices ({trace.spares} spares), "
          f"{trace.fail_s.size} slice failures over {trace.horizon_s:g} s (seed index {seed_index}).")
