"""Merging learners' outer gradients: token weighting, weighted mean and RDA, per tensor."""

from collections.abc import Callable, Sequence
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from runtime.config.run import MERGE_METHODS

PyTree = Any

# Norms at or below this count as zero: such a tensor has no direction.
DEFAULT_EPS = 1e-12


def token_weight(tokens: ArrayLike, steps: ArrayLike) -> np.ndarray:
  """Returns the learner weight tokens * (tokens / steps) in float32, 0 where steps or tokens is 0.

  NumPy on the host: the syncer's weights never touch the default (accelerator) device.
  """
  tokens = np.asarray(tokens, np.float32)
  steps = np.asarray(steps, np.float32)
  return tokens * np.divide(tokens, steps, out=np.zeros_like(tokens), where=steps > 0)


def is_embedding(path: str) -> bool:
  """Returns whether the leaf named by `path` is an embedding table."""
  return "embed" in path


def _safe_div(num: jax.Array, den: jax.Array, eps: float = 0.0) -> jax.Array:
  """Returns num / den where den > eps and 0 elsewhere."""
  # The inner where keeps 0/0 out of the unused branch, which would otherwise poison gradients.
  ok = den > eps
  return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def _probabilities(weights: jax.Array) -> jax.Array:
  """Returns weights / sum(weights) in fp32; all zeros (a zero merge) when they sum to 0."""
  weights = jnp.asarray(weights, jnp.float32)
  return _safe_div(weights, jnp.sum(weights))


def sum_of_squares(x: jax.Array) -> jax.Array:
  """Returns the fp32 sum of squares of one tensor's entries."""
  return jnp.sum(jnp.square(x.astype(jnp.float32)))


def _norm(x: jax.Array) -> jax.Array:
  """Returns the fp32 Frobenius norm of one tensor."""
  return jnp.sqrt(sum_of_squares(x))


def _combine(coeffs: jax.Array, leaves: Sequence[jax.Array]) -> jax.Array:
  """Returns sum_m coeffs[m] * leaves[m] in fp32."""
  # An unrolled sum, not a stack and a contraction: XLA fuses it into one loop that reads
  # each input once, where jnp.stack would first copy all M inputs.
  return sum(coeffs[m] * leaf.astype(jnp.float32) for m, leaf in enumerate(leaves))


def _mean_leaf(probs: jax.Array, leaves: Sequence[jax.Array]) -> jax.Array:
  """Returns the weighted mean of one tensor across learners."""
  return _combine(probs, leaves).astype(leaves[0].dtype)


def _rda_leaf(probs: jax.Array, leaves: Sequence[jax.Array], eps: float) -> jax.Array:
  """Returns the radial-directional average of one tensor across learners."""
  norms = jnp.stack([_norm(leaf) for leaf in leaves])
  radius = jnp.sum(probs * norms)
  # Dividing the weights rather than the tensors normalises every direction inside the one
  # fused pass that sums them; a zero tensor gets coefficient 0 and adds only its zero norm.
  direction = _combine(_safe_div(probs, norms, eps), leaves)
  return (direction * _safe_div(radius, _norm(direction), eps)).astype(leaves[0].dtype)


def _check_learners(deltas: Sequence[PyTree], weights: jax.Array) -> None:
  """Raises ValueError unless there is one weight per delta and at least one delta."""
  if not deltas or jnp.shape(weights) != (len(deltas),):
    raise ValueError(f"need one weight per delta: {len(deltas)} deltas, weights of shape "
                     f"{jnp.shape(weights)}")


@jax.jit
def weighted_mean(deltas: Sequence[PyTree], weights: jax.Array) -> PyTree:
  """Returns sum_m w_m delta_m / sum_m w_m, leaf by leaf."""
  _check_learners(deltas, weights)
  probs = _probabilities(weights)
  return jax.tree.map(lambda *leaves: _mean_leaf(probs, leaves), *deltas)


@jax.jit
def rda(deltas: Sequence[PyTree], weights: jax.Array, eps: float = DEFAULT_EPS) -> PyTree:
  """Returns the radial-directional average of the deltas, tensor by tensor."""
  _check_learners(deltas, weights)
  probs = _probabilities(weights)
  return jax.tree.map(lambda *leaves: _rda_leaf(probs, leaves, eps), *deltas)


@functools.partial(jax.jit, static_argnames=("method", "mean_for"))
def merge(deltas: Sequence[PyTree], weights: jax.Array, *, method: str = "rda",
          mean_for: Callable[[str], bool] | None = None) -> PyTree:
  """Returns the merged outer gradient; leaves whose path `mean_for` accepts use the mean."""
  # `mean_for` is a static argument: pass a module-level function such as is_embedding, since
  # a fresh lambda per call would recompile every time.
  if method not in MERGE_METHODS:
    raise ValueError(f"merge method {method!r} is invalid: allowed {MERGE_METHODS}")
  _check_learners(deltas, weights)
  probs = _probabilities(weights)

  def merge_leaf(path: jax.tree_util.KeyPath, *leaves: jax.Array) -> jax.Array:
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    if method == "mean" or (mean_for is not None and mean_for(name)):
      return _mean_leaf(probs, leaves)
    return _rda_leaf(probs, leaves, DEFAULT_EPS)

  return jax.tree_util.tree_map_with_path(merge_leaf, *deltas)


@jax.jit
def delta_is_finite(delta: PyTree) -> jax.Array:
  """Returns a scalar bool: True when no leaf holds a NaN or an Inf."""
  return functools.reduce(jnp.logical_and,
                          (jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(delta)),
                          jnp.array(True))


@jax.jit
def global_norm(tree: PyTree) -> jax.Array:
  """Returns the fp32 L2 norm of all leaves taken together."""
  return jnp.sqrt(sum((sum_of_squares(leaf) for leaf in jax.tree.leaves(tree)),
                      jnp.float32(0.0)))
