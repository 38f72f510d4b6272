"""What a learner's own progress becomes when Θ arrives (outer.receive): carried onto Θ, or mixed with it."""

from typing import Any

import jax

PyTree = Any


@jax.jit
def carry(theta: PyTree, local: PyTree, at_report: PyTree) -> PyTree:
  """Θ plus the progress made since the report: θ ← Θ + (θ_local − θ_at_report)."""
  return jax.tree.map(lambda g, l, r: g + (l - r), theta, local, at_report)


@jax.jit
def mix(theta: PyTree, local: PyTree, alpha: jax.Array) -> PyTree:
  """θ ← (1 − α)·Θ + α·θ_local."""
  return jax.tree.map(lambda g, l: (1 - alpha) * g + alpha * l, theta, local)
