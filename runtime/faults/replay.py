"""Each slice's failures: the seeded Poisson trace, or a recorded trace (the goodput simulator's) replayed exactly.

A recorded trace (`faults.trace`, the JSON of `runtime/sim/trace.py`) names, for each slice of the job, when it
failed and when its repair ended; the run's slices beyond the trace's (spares) never fail, as in the simulator.
"""

from typing import Iterator

from runtime.config.faults import FaultConfig, load
from runtime.faults import plan


def slice_failures(cfg: FaultConfig, slice_index: int, seed: int) -> Iterator[tuple[float, float]]:
  """(time, repair seconds) of each of the slice's failures, in time order, scaled by `time_scale` onto the run's
  clock."""
  if not cfg.trace:
    yield from plan.crash_times(cfg, slice_index, seed)
    return
  trace = load(cfg.trace)
  mine = trace.slice_of == slice_index
  for fail, repaired in zip(trace.fail_s[mine].tolist(), trace.repaired_s[mine].tolist()):
    yield fail * cfg.time_scale, (repaired - fail) * cfg.time_scale
