"""What a learner's own progress becomes when Θ arrives (outer.receive): carried onto Θ, or mixed with it."""

from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


@jax.jit
def carry(theta: PyTree, local: PyTree, at_report: PyTree) -> PyTree:
  """Θ plus the progress made since the report: θ ← Θ + (θ_local − θ_at_report)."""
  return jax.tree.map(lambda g, l, r: g + (l - r), theta, local, at_report)


@jax.jit
def mix(theta: PyTree, local: PyTree, alpha: jax.Array) -> PyTree:
  """θ ← (1 − α)·Θ + α·θ_local."""
  return jax.tree.map(lambda g, l: (1 - alpha) * g + alpha * l, theta, local)


def taken(receive: str, theta: PyTree, local: PyTree, at_report: PyTree, alpha: float, may_carry: bool,
          may_mix: bool) -> PyTree:
  """Θ as the learner takes it under outer.receive: its progress carried on (where `may_carry`), mixed in (where
  `may_mix`), or Θ itself ("overwrite")."""
  if receive == "carry" and may_carry:
    return carry(theta, local, at_report)
  if receive == "mix" and may_mix:
    return mix(theta, local, jnp.float32(alpha))
  return theta
