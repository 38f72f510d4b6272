"""Goodput of data-parallel, elastic DP and Decoupled DiLoCo under a failure trace, and of a table cell over seeds.

The model, per seed, over a horizon T (the trace, runtime/sim/trace.py, holds every random draw):
- Each chip is interrupted as a Poisson process with mean time between interruptions MTBI, except while its
  slice is in repair (repair_s): a slice alternates exponential up-times and repairs. A learner has
  round(N / (M · slice_chips)) slices (at least one); data-parallel and elastic DP are one unit of all slices.
- Data-parallel and restarting learners (learner_recovery="restart") swap a failed slice for a hot spare
  (spares = ceil(spare_fraction · slices), counted in the goodput denominator) and pay restart_s. Spares are
  handed out first come first served; with none free the unit waits for one (or its own slice's repair)
  before restarting. Elastic DP and reconfiguring learners drop the slice, pay reconfig_s, train on without it,
  and pay reconfig_s again when it rejoins after repair; while all of a learner's slices are in repair it is down.
- An interruption (or rejoin) that arrives while its unit is down is handled by the same restart or
  reconfiguration. Work since the unit's save point is lost: the last checkpoint (data-parallel, whose
  checkpoint phase restarts when the job does), the in-flight step (elastic DP and reconfiguring learners) or
  the round since the last sync (restarting learners). Chips of slices in repair idle, except while their
  unit is down anyway.
- The syncer merges only while at least K learners are up and the syncer itself is up (it fails every
  syncer_mtbi_days and is back syncer_restart_s later, restored from its checkpoint, which it writes after
  every merge). During such a stall a learner that is up finishes the round it is in (a round is
  sync_every_steps steps plus round_wait_s, its phase counted from when the learner last came up) and then
  waits for Θ; the stall's end merges that work, so it is not lost.
- Each round a learner is blocked round_wait_s (transfer not hidden by the overlap, grace-window wait).
- Optional chip-speed jitter: every step each slice takes step_s · (1 + jitter·|z|). A synchronous group (the
  data-parallel job, or one learner's slices) waits each step for its slowest slice: that wait is lost; a
  slower step is not (a lone slice, or learners with K=1, which never wait for each other, lose nothing).
Goodput = useful chip-time / ((N + spare chips) · T); uptime = fraction of time the job (for learners: the
syncer) advances.
"""

import dataclasses
import functools
import math

import numpy as np

from runtime.sim.config import ClusterSimConfig, Setup
from runtime.sim.timeline import IntervalUnion, below_quorum, downtime_starts
from runtime.sim.trace import FailureTrace, draw


@dataclasses.dataclass(frozen=True)
class CellResult:
  """Goodput and uptime of one setup at one chip count, one value per seed, as fractions."""

  setup: Setup
  chips: int
  goodput: np.ndarray
  uptime: np.ndarray


@functools.lru_cache
def expected_max_abs_normal(count: int) -> float:
  """E[max of `count` independent |z|], z standard normal."""
  if count == 1:
    return math.sqrt(2.0 / math.pi)
  x = np.linspace(0.0, 12.0, 4801)
  with np.errstate(divide="ignore"):
    log_cdf = np.log1p(-np.vectorize(math.erfc)(x / math.sqrt(2.0)))  # log P(|z| <= x)
  tail = -np.expm1(count * log_cdf)  # P(max of the group's |z| > x)
  return float(np.sum((tail[1:] + tail[:-1]) * np.diff(x)) / 2.0)


def straggler_efficiency(group_slices: int, jitter: float) -> float:
  """Share of a synchronous group's chip-time not spent waiting each step for its slowest slice."""
  if jitter == 0.0:
    return 1.0
  return (1.0 + jitter * math.sqrt(2.0 / math.pi)) / (1.0 + jitter * expected_max_abs_normal(group_slices))


def spare_ready(fail: np.ndarray, repaired: np.ndarray, spares: int) -> np.ndarray:
  """When each failed slice (in any order) has a spare: first come first served, or its own repair's end."""
  order = np.argsort(fail, kind="stable")
  fail_g, repaired_g = fail[order], repaired[order]
  ready_g = repaired_g.copy()
  if spares:  # the spare of the failure `spares` earlier comes back when that slice's repair ends
    ready_g[spares:] = np.minimum(np.maximum(fail_g[spares:], repaired_g[:-spares]), repaired_g[spares:])
    ready_g[:spares] = fail_g[:spares]
  ready = np.empty_like(fail)
  ready[order] = np.maximum.accumulate(ready_g)  # a spare goes to the earlier failure first
  return ready


def _stall_idle(down: IntervalUnion, stalls: IntervalUnion, span: float, units: int, round_s: float):
  """Per unit and stall, (start, end) on the joint line of the wait after the unit finishes its round."""
  unit = np.arange(units)[:, None]
  origin = unit * span
  lo, hi = stalls.starts[None, :] + origin, stalls.ends[None, :] + origin
  ends = np.append(down.ends, -1.0)  # index -1: no downtime before the stall's end
  last = np.searchsorted(down.ends, hi, side="right") - 1
  same = np.floor(np.append(down.starts, -span)[last] / span).astype(np.int64) == unit
  came_up = np.where(same, ends[last], origin)
  idle_from = np.where(came_up <= lo, lo + round_s - np.mod(lo - came_up, round_s), came_up + round_s)
  keep = idle_from < hi
  return idle_from[keep], hi[keep]


def evaluate(config: ClusterSimConfig, trace: FailureTrace) -> tuple[float, float]:
  """Goodput and uptime of the trace's setup under the trace (failures ordered by learner, then time)."""
  setup, horizon, per_learner = trace.setup, trace.horizon_s, trace.slices_per_learner
  units, decoupled = setup.learners, setup.kind == "decoupled"
  restart = setup.kind == "data-parallel" or (decoupled and config.learner_recovery == "restart")
  cost = config.restart_s if restart else config.reconfig_s
  group = per_learner if decoupled else trace.slices
  efficiency = straggler_efficiency(group, config.speed_jitter)
  wall_step_s = trace.step_s * (1.0 + config.speed_jitter * expected_max_abs_normal(group))
  round_s = config.sync_every_steps * wall_step_s + config.round_wait_s
  save_s = (round_s if restart else config.inflight_steps * wall_step_s) if decoupled else (
      config.checkpoint_every_steps * wall_step_s if restart else wall_step_s)
  unit, fail, repaired = trace.slice_of // per_learner, trace.fail_s, trace.repaired_s

  if restart:
    ready = spare_ready(fail, repaired, trace.spares)
    span = horizon + cost + 1.0 + float(np.max(ready - fail, initial=0.0))
    key = unit * span + ready
    starts = downtime_starts(key, key + cost)
    down_unit, down_from = unit[starts], fail[starts]
    down_to, loses = np.minimum(ready[starts] + cost, horizon), np.ones(starts.size, bool)
    out_from = out_to = np.zeros(0)
  else:
    back = repaired < horizon
    span = horizon + cost + 1.0
    event_unit = np.concatenate([unit, unit[back]])
    key = event_unit * span + np.concatenate([fail, repaired[back]])
    order = np.argsort(key, kind="stable")
    key, event_unit = key[order], event_unit[order]
    is_fail = order < fail.size
    starts = downtime_starts(key, key + cost)
    down_unit, down_from, loses = event_unit[starts], key[starts] - event_unit[starts] * span, is_fail[starts]
    down_to = np.minimum(down_from + cost, horizon)
    # While every slice of a learner is in repair it cannot train, until the next rejoin (or the horizon).
    in_repair = np.cumsum(np.where(is_fail, 1, -1))
    first = np.searchsorted(event_unit, np.arange(units))
    in_repair -= np.concatenate([[0], in_repair])[first][event_unit]
    out = np.flatnonzero(in_repair == per_learner)
    following = np.minimum(out + 1, key.size - 1)
    out_from = key[out]
    out_to = np.where((out + 1 < key.size) & (event_unit[following] == event_unit[out]), key[following],
                      event_unit[out] * span + horizon)
  down = IntervalUnion(np.concatenate([down_unit * span + down_from, out_from]),
                       np.concatenate([down_unit * span + down_to, out_to]))
  stall_from, stall_to = below_quorum(down, span, units, min(config.quorum, units) if decoupled else 1)
  syncer = np.minimum(trace.syncer_failures, horizon)
  stalls = IntervalUnion(np.concatenate([stall_from, syncer[:, 0]]), np.concatenate([stall_to, syncer[:, 1]]))
  idle = down  # and, in a stall, up learners wait once they have finished their round
  idle_from, idle_to = _stall_idle(down, stalls, span, units, round_s) if decoupled else (np.zeros(0),) * 2
  if idle_from.size:
    idle = IntervalUnion(np.concatenate([down.starts, idle_from]), np.concatenate([down.ends, idle_to]))

  origin = np.arange(units) * span
  busy = horizon - idle.measure(origin, origin + horizon)
  # Work since the save point is lost; the save points restart when the unit comes back.
  same_unit = np.append(False, down_unit[1:] == down_unit[:-1])
  resume = np.where(same_unit, np.append(0.0, down_to[:-1]), 0.0)[loses]
  down_unit, down_from = down_unit[loses], down_from[loses]
  progress = down_from - resume
  if out_from.size or idle_from.size:  # idle besides the downtimes (which end in order) lies between two
    at = origin[down_unit]
    progress -= idle.measure(at + resume, at + down_from)
  lost = np.bincount(down_unit, np.mod(np.maximum(progress, 0.0), save_s), minlength=units)
  useful = per_learner * trace.slice_chips * (busy - lost)
  if not restart:  # chips of a slice in repair idle, except while their unit idles anyway
    back_at = np.minimum(repaired, horizon)
    in_repair_s = (back_at - fail) - idle.measure(origin[unit] + fail, origin[unit] + back_at)
    useful -= trace.slice_chips * np.bincount(unit, in_repair_s, minlength=units)
  rounds = config.sync_every_steps * wall_step_s / round_s if decoupled else 1.0
  allocated = (trace.slices + trace.spares) * trace.slice_chips * horizon
  goodput = efficiency * rounds * float(useful.sum()) / allocated
  return goodput, 1.0 - float(stalls.measure(np.zeros(1), np.full(1, horizon))[0]) / horizon


def simulate(config: ClusterSimConfig, setup: Setup, chips: int) -> CellResult:
  """Simulates one table cell for every seed; each seed's stream depends only on seed, setup and chips."""
  results = np.array([evaluate(config, draw(config, setup, chips, s)) for s in range(config.seeds)])
  return CellResult(setup, chips, results[:, 0], results[:, 1])
