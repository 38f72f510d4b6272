"""Each slice's failures: the seeded Poisson trace, or a recorded trace (the goodput simulator's) replayed exactly.

A recorded trace (`faults.trace`, the JSON of `runtime/sim/trace.py`) names, for each slice of the job, when it
failed and when its repair ended; the run's slices beyond the trace's (spares) never fail, as in the simulator.
"""

import functools
import pathlib
from typing import Iterator

from runtime.errors import ConfigError, check
from runtime.faults import plan
from runtime.sim import trace as trace_lib


@functools.lru_cache(maxsize=8)
def _read(path: str, mtime_ns: int) -> trace_lib.FailureTrace:
  del mtime_ns  # part of the cache key only: a rewritten file is read again
  return trace_lib.from_json(pathlib.Path(path).read_text(encoding="utf-8"))


def load(path: str) -> trace_lib.FailureTrace:
  """The trace at `path`; a missing file or malformed JSON raises ConfigError naming the field."""
  file = pathlib.Path(path).expanduser()
  if not file.is_file():
    raise ConfigError("faults.trace", path, "the path of a failure trace JSON file (python -m launch.simulate --trace)")
  return _read(str(file), file.stat().st_mtime_ns)


def slice_failures(cfg: plan.FaultConfig, slice_index: int, seed: int) -> Iterator[tuple[float, float]]:
  """(time, repair seconds) of each of the slice's failures, in time order, scaled by `time_scale` onto the run's
  clock."""
  if not cfg.trace:
    yield from plan.crash_times(cfg, slice_index, seed)
    return
  trace = load(cfg.trace)
  mine = trace.slice_of == slice_index
  for fail, repaired in zip(trace.fail_s[mine].tolist(), trace.repaired_s[mine].tolist()):
    yield fail * cfg.time_scale, (repaired - fail) * cfg.time_scale


def validate(run) -> None:
  """A trace replaces the random crashes, fits the job's slices, and has no syncer failures (not replayed)."""
  f = run.faults
  if not f.trace:
    return
  check(f.mtbi_chip_seconds == 0, "faults.mtbi_chip_seconds", f.mtbi_chip_seconds,
        "0 with faults.trace (the trace replaces the random crashes)")
  trace = load(f.trace)
  check(trace.slices <= run.num_slices, "faults.trace", f.trace,
        f"a trace of at most the run's {run.num_slices} slices (it has {trace.slices}); lent slices never fail")
  check(len(trace.syncer_failures) == 0, "faults.trace", f.trace,
        "a trace without syncer_failures (the runtime does not replay the syncer's failures: export it with "
        "--config.syncer_mtbi_days=0)")
