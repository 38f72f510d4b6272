"""A data-parallel job's time under either clock: modeled seconds, or wall seconds of real steps and waits.

The DP baselines under faults (dp_faults.py) run one loop on either. Under the virtual clock a step takes its modeled
seconds and a failure that comes before a step would end loses that step; under the real clock a step takes as long
as its program runs, waits (for a repair, a restart, a reconfiguration) are slept, and a failure that has come due
fails the next program the job dispatches, with a genuine device error (runtime/faults/injection.py).
"""

import contextlib
import time
from typing import Any, Iterator

import jax
import numpy as np

GIVE_UP_FACTOR = 50  # a job that fails faster than it checkpoints never finishes: it stops after this many budgets


class ModeledTime:
  """Modeled seconds: a step takes `step_s`, nothing else takes time unless waited for."""

  real = False

  def __init__(self, step_s: float, total_steps: int):
    self.step_s = step_s  # (elastic DP's changes with its slices' all-reduce)
    self._give_up_at = GIVE_UP_FACTOR * total_steps * step_s

  def start(self) -> None:
    self._t = 0.0

  def now(self) -> float:
    return self._t

  def wait_until(self, at: float) -> None:
    self._t = max(self._t, at)

  def fails_in_step(self, at: float) -> bool:
    """Whether a failure at `at` comes before the step about to start would end (which it loses)."""
    return at < self._t + self.step_s

  def stepped(self, started: float, outputs: Any) -> float:
    """The seconds of the step dispatched at `started`; the time moves on to its end."""
    del started, outputs  # (its results are awaited where they are read)
    self._t += self.step_s
    return self.step_s

  def gave_up(self) -> bool:
    return self._t >= self._give_up_at

  def extras(self) -> dict:
    return {}  # (its time is the result's virtual_seconds, its step time the config's)

  @contextlib.contextmanager
  def aside(self) -> Iterator[None]:
    """Work that is no part of the job's time (evaluation)."""
    yield


class WallTime:
  """Wall seconds from `start` (after the compiles), less the time set aside for evaluation."""

  real = True
  step_s = 0.0  # (unread: a step takes as long as its program runs)

  def __init__(self, total_steps: int):
    self._total_steps = total_steps
    self._steps: list[float] = []  # each step's seconds
    self._start = time.perf_counter()

  def start(self) -> None:
    self._start = time.perf_counter()

  def now(self) -> float:
    return time.perf_counter() - self._start

  def wait_until(self, at: float) -> None:
    time.sleep(max(at - self.now(), 0.0))

  def fails_in_step(self, at: float) -> bool:
    """Whether a failure at `at` has come: the program dispatched next fails (its check runs as it starts)."""
    return at <= self.now()

  def stepped(self, started: float, outputs: Any) -> float:
    """Awaits the step dispatched at `started` (its device error, if any, is raised here); its seconds."""
    jax.block_until_ready(outputs)
    self._steps.append(self.now() - started)
    return self._steps[-1]

  def gave_up(self) -> bool:
    """After GIVE_UP_FACTOR times the budget's steps at the median step's seconds (never before a step)."""
    return bool(self._steps) and self.now() >= GIVE_UP_FACTOR * self._total_steps * float(np.median(self._steps))

  def extras(self) -> dict:
    """The run's wall seconds (from the start, evaluations set aside) and its mean step's."""
    return dict(run_seconds=self.now(), step_seconds=float(np.mean(self._steps)) if self._steps else float("nan"))

  @contextlib.contextmanager
  def aside(self) -> Iterator[None]:
    """Work that is no part of the job's time (evaluation): the clock stands still meanwhile."""
    began = time.perf_counter()
    try:
      yield
    finally:
      self._start += time.perf_counter() - began
