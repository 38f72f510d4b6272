"""Counts XLA compilations, persistent-cache hits and their seconds from JAX's monitoring events."""

import dataclasses
import threading
import time

import jax
from jax._src import dispatch

# jax 0.10.2: one backend-compile event per executable built, timed around compile-or-load from the persistent
# cache; a cache hit records its own event first, on the same thread. Trace and lowering have their own events.
_HIT = "/jax/compilation_cache/cache_hits"
_DURATIONS = {dispatch.BACKEND_COMPILE_EVENT: "backend", dispatch.JAXPR_TRACE_EVENT: "trace",
              dispatch.JAXPR_TO_MLIR_MODULE_EVENT: "lower"}


@dataclasses.dataclass(frozen=True)
class Build:
  """One executable: when it was ready (perf_counter), what, how long, and whether the cache supplied it."""

  at: float
  name: str
  seconds: float
  cache_hit: bool


class CompileCounter:
  """Listens to JAX's monitoring events from construction on (every thread); one per process."""

  def __init__(self):
    self.builds: list[Build] = []
    self.seconds = {kind: [] for kind in _DURATIONS.values()}  # per kind: (perf_counter, seconds)
    self._hits = threading.local()
    jax.monitoring.register_event_listener(self._on_event)
    jax.monitoring.register_event_duration_secs_listener(self._on_duration)

  def _on_event(self, event: str, **_) -> None:
    if event == _HIT:
      self._hits.pending = True

  def _on_duration(self, event: str, seconds: float, fun_name: str = "", **_) -> None:
    kind = _DURATIONS.get(event)
    if kind is None:
      return
    now = time.perf_counter()
    self.seconds[kind].append((now, seconds))
    if kind == "backend":
      self.builds.append(Build(now, fun_name, seconds, getattr(self._hits, "pending", False)))
      self._hits.pending = False

  def compiled(self, until: float = float("inf"), since: float = 0.0, name: str = "") -> int:
    """XLA compilations (persistent-cache hits excluded) in (since, until], of `name` if given."""
    return sum(since < b.at <= until and not b.cache_hit and name in ("", b.name) for b in self.builds)

  def loaded(self, until: float = float("inf")) -> int:
    """Executables the persistent cache supplied up to `until`."""
    return sum(b.at <= until and b.cache_hit for b in self.builds)

  def total_seconds(self, kind: str, until: float = float("inf")) -> float:
    """Summed seconds of `kind` ("backend": compile or cache load, "trace", "lower") up to `until`."""
    return sum(s for at, s in self.seconds[kind] if at <= until)
