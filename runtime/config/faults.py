"""The faults section of the config: the scheduled faults' language, the recovery costs, and their checks.

Pure bookkeeping (no JAX), parsed once at the config boundary; runtime/faults/ plans and injects what this describes.
"""

import dataclasses
import functools
import math
import pathlib
from typing import Any

from runtime.config import schedule as schedule_lib
from runtime.errors import ConfigError, check
from runtime.sim import trace as trace_lib

KINDS = ("crash", "straggler", "corrupt", "link", "bug")
# What a learner of several slices does when one of them fails; the goodput simulator's options (runtime/sim), with
# the same meaning: "reconfigure" trains on without it, "restart" goes down and comes back from Θ.
LEARNER_RECOVERIES = ("reconfigure", "restart")
# Each kind's fields in sorted order (errors list them so).
_FIELDS = {
    "crash": {"ends": str, "learner": int, "repair": float, "slice": int, "step": int, "time": float},
    "straggler": {"duration": float, "factor": float, "learner": int, "time": float},
    "corrupt": {"how": str, "learner": int, "time": float},
    "link": {"duration": float, "learner": int, "mode": str, "time": float},
    "bug": {"learner": int, "time": float},  # from `time` on, every dispatch of the learner's program fails
}
# how=flip|truncate damage a compressed report's payload bytes (runtime/wire/payload.py). A crash ends=program fails
# the learner's program (the default); ends=process kills its process mid-step, ends=hang stops it there for good,
# answering nothing until its deadline kills it (a learner in a Ray actor).
_CHOICES = {"how": ("nan", "inf", "huge", "flip", "truncate"), "mode": ("delay", "drop"),
            "ends": ("program", "process", "hang")}


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
  ends: str = "program"  # crash: what it ends: the program, the process (SIGKILL), or it hangs (backend ray)
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
    check(fault.ends == "program" or (run.backend == "ray" and run.clock.kind == "real"), "faults.schedule",
          fault.text, "ends=program unless backend is 'ray' and clock.kind 'real' (ends=process kills, ends=hang "
          "stops the learner's own process: only a learner in a Ray actor has one, and only wall time a moment for it)")
  check(f.time_scale > 0, "faults.time_scale", f.time_scale, "a float > 0 (the run's seconds per trace second)")
  if f.trace:  # a trace replaces the random crashes, fits the job's slices, and has no syncer failures (not replayed)
    check(f.mtbi_chip_seconds == 0, "faults.mtbi_chip_seconds", f.mtbi_chip_seconds,
          "0 with faults.trace (the trace replaces the random crashes)")
    trace = load(f.trace)
    check(trace.slices <= run.num_slices, "faults.trace", f.trace,
          f"a trace of at most the run's {run.num_slices} slices (it has {trace.slices}); lent slices never fail")
    check(len(trace.syncer_failures) == 0, "faults.trace", f.trace,
          "a trace without syncer_failures (the runtime does not replay the syncer's failures: export it with "
          "--config.syncer_mtbi_days=0)")
