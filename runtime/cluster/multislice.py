"""Multislice hardware through pathwaysutils (the `pathways` extra): devices grouped by `slice_index`, whether a
device error lost a slice, whether a slice is healthy, and the Pathways backend.

Nothing here is written again: each answer is pathwaysutils' own. Without the extra the core install still runs on
devices that carry no `slice_index` (CPU, one accelerator slice): no error counts as a lost slice here (the
runtime's own injected crashes are recognised by `runtime.faults.injection`), and a repaired slice is taken back
unchecked.
"""

import functools
from typing import Any, Sequence

import jax

EXTRA = "the `pathways` extra (pip install -e '.[pathways]')"


@functools.cache
def _elastic() -> Any:
  """pathwaysutils.elastic.elastic, or None without the extra (imported once, when first needed: it is slow)."""
  try:
    from pathwaysutils.elastic import elastic  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return elastic


def installed() -> bool:
  return _elastic() is not None


def start_backend(backend: str) -> None:
  """Runs pathwaysutils.initialize() for the Pathways backend (config field `backend`, validated to need the
  extra), before JAX starts one; 'local' needs nothing."""
  if backend == "pathways":
    import pathwaysutils  # pylint: disable=g-import-not-at-top
    pathwaysutils.initialize()


def slice_groups(devices: Sequence[jax.Device]) -> list[list[jax.Device]] | None:
  """The devices grouped by hardware slice, in `slice_index` order; None on one slice (or devices without one)."""
  indices = {getattr(d, "slice_index", None) for d in devices}
  if None in indices or len(indices) < 2:
    return None
  if not installed():
    raise RuntimeError(f"the devices carry {len(indices)} slice_index values (multislice hardware): grouping them "
                       f"into slices needs {EXTRA}")
  by_index = _elastic().get_slice_to_devices(devices)
  return [list(by_index[i]) for i in sorted(by_index)]


def slice_lost(error: Exception) -> bool:
  """True when pathwaysutils reads the error as a lost slice (DATA_LOSS, DEADLINE_EXCEEDED, ...); False without it."""
  return installed() and _elastic().is_error_due_to_slice_down(error, log_traceback=False)


def healthy(slice_index: int, devices: Sequence[jax.Device]) -> bool:
  """True when a small program runs on every device of the slice (pathwaysutils' health check); True without it."""
  return not installed() or slice_index in _elastic().get_active_slice_indices({slice_index: list(devices)})
