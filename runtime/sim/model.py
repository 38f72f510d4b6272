"""Discrete-event goodput simulator: data-parallel, elastic DP and Decoupled DiLoCo on N chips.

The model, per seed, over a horizon T:
- Each chip is interrupted as a Poisson process with mean time between interruptions MTBI, so a
  unit (the whole job, or one of M learners) on c chips is interrupted at rate c / MTBI.
- An interruption takes its unit down for a fixed time: the full restart for data-parallel, the
  reconfiguration for elastic data-parallel and for learners. Interruptions that arrive while the
  unit is down are handled by that same restart or reconfiguration.
- Work since the unit's last save point is lost: the last checkpoint (data-parallel), the in-flight
  step (elastic DP and learners that reconfigure) or the last sync (learners that restart from Θ).
- Data-parallel and restarting learners swap the failed slice for a hot spare outside the
  allocation; elastic DP and reconfiguring learners train on without it until it returns after
  repair_s. (A slice already in repair is still drawn as failing: off by at most the fraction in
  repair.)
- The syncer merges only while at least K learners are up; learners that are up wait while it
  stalls.
- Optional chip-speed jitter: every step each slice takes step_s · (1 + jitter·|z|) and a
  synchronous group (the job, or one learner) waits for its slowest slice.
Goodput = useful chip-time / (N · T); uptime = fraction of time the job (for learners: the syncer)
advances.
"""

import dataclasses
import math

import numpy as np

from runtime.sim.config import SETUP_KINDS, ClusterSimConfig, Setup


@dataclasses.dataclass(frozen=True)
class CellResult:
  """Goodput and uptime of one setup at one chip count, one value per seed, as fractions."""

  setup: Setup
  chips: int
  goodput: np.ndarray
  uptime: np.ndarray


@dataclasses.dataclass(frozen=True)
class _Units:
  """How a setup maps onto units that are interrupted independently."""

  count: int
  downtime_s: float
  save_steps: int
  repair_idle: bool
  quorum: int


def _units(config: ClusterSimConfig, setup: Setup) -> _Units:
  """Downtime, save point and repair behaviour of the setup's units."""
  if setup.kind == "data-parallel":
    return _Units(1, config.restart_s, config.checkpoint_every_steps, repair_idle=False, quorum=1)
  if setup.kind == "elastic":
    return _Units(1, config.reconfig_s, 1, repair_idle=True, quorum=1)
  restart = config.learner_recovery == "restart"
  return _Units(setup.learners, config.reconfig_s, config.sync_every_steps if restart else 1,
                repair_idle=not restart, quorum=config.quorum)


def downtime_starts(times: np.ndarray, downtime_s: float) -> np.ndarray:
  """Indices of the sorted interruption times that start a downtime; the others fall inside one."""
  n = times.size
  if n == 0:
    return np.zeros(0, np.int64)
  following = np.maximum(np.searchsorted(times, times + downtime_s, side="left"),
                         np.arange(1, n + 1))
  # Binary lifting: jumps[j][i] is where 2**j downtimes starting at i lead; n means past the end.
  jumps = [np.append(following, n)]
  while (1 << len(jumps)) <= n:
    jumps.append(jumps[-1][jumps[-1]])
  length, position = 1, 0
  for level in reversed(range(len(jumps))):
    if jumps[level][position] < n:
      position = jumps[level][position]
      length += 1 << level
  steps = np.arange(length)
  path = np.zeros(length, np.int64)
  for level, jump in enumerate(jumps):
    take = ((steps >> level) & 1).astype(bool)
    path[take] = jump[path[take]]
  return path


class _IntervalUnion:
  """A union of intervals on one timeline, measured between any two points."""

  def __init__(self, starts: np.ndarray, ends: np.ndarray):
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    if starts.size:
      reach = np.maximum.accumulate(ends)
      head = np.ones(starts.size, bool)
      head[1:] = starts[1:] > reach[:-1]
      last = np.append(np.flatnonzero(head)[1:] - 1, starts.size - 1)
      starts, ends = starts[head], reach[last]
    self._starts, self._ends = starts, ends
    self._before = np.concatenate([[0.0], np.cumsum(ends - starts)])

  def _measure_before(self, x: np.ndarray) -> np.ndarray:
    if not self._starts.size:
      return np.zeros_like(x)
    count = np.searchsorted(self._starts, x, side="right")
    last = np.maximum(count - 1, 0)
    inside = np.clip(x - self._starts[last], 0.0, self._ends[last] - self._starts[last])
    return np.where(count > 0, self._before[last] + inside, 0.0)

  def measure(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of the union inside each [lo, hi]."""
    return self._measure_before(hi) - self._measure_before(lo)


def _stalls(seed_of: np.ndarray, down_from: np.ndarray, down_to: np.ndarray, per_seed: int,
            quorum: int, span: float) -> tuple[np.ndarray, np.ndarray]:
  """Intervals (on the seeds' joint timeline) when fewer than `quorum` units of a seed are up."""
  time = np.concatenate([seed_of * span + down_from, seed_of * span + down_to])
  change = np.concatenate([np.full(down_from.size, -1), np.full(down_to.size, 1)])
  order = np.argsort(time, kind="stable")
  time, up = time[order], per_seed + np.cumsum(change[order])
  stalled = np.flatnonzero(up[:-1] < quorum)
  return time[stalled], time[stalled + 1]


def straggler_efficiency(group_slices: int, jitter: float) -> float:
  """Nominal over expected step time of a group that waits for its slowest slice every step."""
  if jitter == 0.0:
    return 1.0
  x = np.linspace(0.0, 12.0, 4801)
  with np.errstate(divide="ignore"):
    log_cdf = np.log1p(-np.vectorize(math.erfc)(x / math.sqrt(2.0)))  # log P(|z| <= x)
  tail = -np.expm1(group_slices * log_cdf)  # P(max of the group's |z| > x)
  expected_max = float(np.sum((tail[1:] + tail[:-1]) * np.diff(x)) / 2.0)
  return 1.0 / (1.0 + jitter * expected_max)


def simulate(config: ClusterSimConfig, setup: Setup, chips: int) -> CellResult:
  """Simulates one table cell for every seed; its stream depends only on seed, setup and chips."""
  units = _units(config, setup)
  horizon = config.horizon_s
  span = horizon + units.downtime_s + 1.0  # each unit gets its own stretch of one shared timeline
  unit_chips = chips / units.count
  n_units = config.seeds * units.count
  rng = np.random.default_rng([config.seed, SETUP_KINDS.index(setup.kind), setup.learners, chips])
  counts = rng.poisson(unit_chips / config.mtbi_s * horizon, size=n_units)
  unit = np.repeat(np.arange(n_units), counts)
  fail = rng.uniform(0.0, horizon, size=unit.size)
  order = np.lexsort((fail, unit))
  unit, fail = unit[order], fail[order]
  origin = np.arange(n_units) * span

  starts = downtime_starts(origin[unit] + fail, units.downtime_s)
  down_unit, down_from = unit[starts], fail[starts]
  down_to = np.minimum(down_from + units.downtime_s, horizon)
  stall_from, stall_to = _stalls(down_unit // units.count, down_from, down_to, units.count,
                                 units.quorum, span)
  stall_seed = np.floor(stall_from / span).astype(np.int64)
  stall_units = stall_seed[:, None] * units.count + np.arange(units.count)
  stall_origin = origin[stall_units] - (stall_seed * span)[:, None]
  idle = _IntervalUnion(  # a unit is idle while it is down or the syncer stalls
      np.concatenate([origin[down_unit] + down_from, (stall_origin + stall_from[:, None]).ravel()]),
      np.concatenate([origin[down_unit] + down_to, (stall_origin + stall_to[:, None]).ravel()]))

  # Work since the save point is lost; a restart resumes from a save point.
  same_unit = np.append(False, down_unit[1:] == down_unit[:-1])
  resume = np.where(same_unit, np.append(0.0, down_to[:-1]), 0.0)
  at = origin[down_unit]
  progress = (down_from - resume) - idle.measure(at + resume, at + down_from)
  efficiency = straggler_efficiency(math.ceil(unit_chips / config.slice_chips),
                                    config.speed_jitter)
  save_s = units.save_steps * config.step_s / efficiency
  lost = np.bincount(down_unit, np.mod(np.maximum(progress, 0.0), save_s), minlength=n_units)
  busy = horizon - idle.measure(origin, origin + horizon)
  useful = unit_chips * (busy - lost)
  if units.repair_idle:
    back = np.minimum(fail + config.repair_s, horizon)
    in_repair = (back - fail) - idle.measure(origin[unit] + fail, origin[unit] + back)
    repaired = np.bincount(unit, in_repair, minlength=n_units)
    useful -= min(config.slice_chips, unit_chips) * repaired
  per_seed = useful.reshape(config.seeds, units.count).sum(axis=1)
  goodput = efficiency * per_seed / (chips * horizon)
  stalled = np.bincount(stall_seed, stall_to - stall_from, minlength=config.seeds)
  return CellResult(setup, chips, goodput, 1.0 - stalled / horizon)
