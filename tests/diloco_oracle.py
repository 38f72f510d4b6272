"""An independent synchronous DiLoCo loop: M replicas, H inner AdamW steps each on its own batches, outer Nesterov.

Written from the algorithm's description (../shared/PAPER.md, docs/architecture.md) directly in JAX and optax's
primitives, sharing nothing with runtime/ but the model's loss and the batches: the inner schedule, AdamW, token
weights, RDA and the outer step are all its own. A test holds the runtime's outer loop to it.
"""

import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from models import lm
from models.config import ModelConfig

PyTree = Any


def schedule(peak: float, warmup: int, total: int, end_ratio: float) -> Callable[[jax.Array], jax.Array]:
  """Linear warmup from 0 to `peak` over `warmup` steps, then cosine decay to end_ratio × peak at `total`."""

  def lr(count: jax.Array) -> jax.Array:
    count = jnp.asarray(count, jnp.float32)
    decay = jnp.clip((count - warmup) / max(total - warmup, 1), 0.0, 1.0)
    cosine = end_ratio + (1 - end_ratio) * 0.5 * (1 + jnp.cos(math.pi * decay))
    return jnp.where(count < warmup, peak * count / max(warmup, 1), peak * cosine)

  return lr


def adamw(lr: Callable, b1: float, b2: float, weight_decay: float, clip: float) -> optax.GradientTransformation:
  """Clip by global norm, Adam's moments, decoupled weight decay, the scheduled step."""
  return optax.chain(optax.clip_by_global_norm(clip), optax.scale_by_adam(b1=b1, b2=b2),
                     optax.add_decayed_weights(weight_decay), optax.scale_by_learning_rate(lr))


def rda(deltas: Sequence[np.ndarray], probs: np.ndarray) -> np.ndarray:
  """Radial-directional average of one tensor: the weighted mean norm along the weighted mean unit direction."""
  norms = [np.linalg.norm(d) for d in deltas]
  direction = sum(p * d / n for p, d, n in zip(probs, deltas, norms) if n > 0)
  radius = sum(p * n for p, n in zip(probs, norms))
  return direction * (radius / np.linalg.norm(direction))


def merge(deltas: Sequence[PyTree], tokens: Sequence[int], steps: Sequence[int], method: str) -> PyTree:
  """Token-weighted (w = tokens²/steps) merge per tensor: RDA, or the mean for embeddings and method 'mean'."""
  weights = np.asarray([t * t / s for t, s in zip(tokens, steps)], np.float64)
  probs = weights / weights.sum()

  def one(path, *leaves):
    name = jax.tree_util.keystr(path)
    arrays = [np.asarray(x, np.float64) for x in leaves]
    if method == "mean" or "embed" in name:
      return sum(p * a for p, a in zip(probs, arrays))
    return rda(arrays, probs)

  return jax.tree_util.tree_map_with_path(one, *deltas)


def synchronous_diloco(model: ModelConfig, params: PyTree, batches: Sequence[Sequence[np.ndarray]], *, rounds: int,
                       inner_steps: int, total_steps: int, lr: float, warmup: int, end_ratio: float, b1: float,
                       b2: float, weight_decay: float, clip: float, outer_lr: float, momentum: float,
                       method: str = "rda") -> PyTree:
  """Θ after `rounds` outer steps; `batches[m]` is replica m's stream of [b, L+1] batches, consumed H per round.

  Each replica keeps its own AdamW state across rounds and restarts every round from Θ; Θ's outer gradient is
  Θ − θ_m, merged, then Nesterov: v ← μ·v + Δ, Θ ← Θ − lr·(Δ + μ·v).
  """
  tx = adamw(schedule(lr, warmup, total_steps, end_ratio), b1, b2, weight_decay, clip)

  @jax.jit
  def step(p, state, batch):
    grads = jax.grad(lambda q: lm.train_loss(q, model, batch)[0])(p)
    updates, state = tx.update(grads, state, p)
    return optax.apply_updates(p, updates), state

  theta = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  velocity = jax.tree.map(np.zeros_like, theta)
  states = [tx.init(params) for _ in batches]
  streams = [iter(b) for b in batches]
  for _ in range(rounds):
    finals, tokens = [], []
    for m, stream in enumerate(streams):
      local = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), theta)
      seen = 0
      for _ in range(inner_steps):
        batch = next(stream)
        local, states[m] = step(local, states[m], batch)
        seen += batch.shape[0] * (batch.shape[1] - 1)
      finals.append(local)
      tokens.append(seen)
    deltas = [jax.tree.map(lambda t, x: t - np.asarray(x, np.float64), theta, f) for f in finals]
    delta = merge(deltas, tokens, [inner_steps] * len(finals), method)
    velocity = jax.tree.map(lambda v, d: momentum * v + d, velocity, delta)
    theta = jax.tree.map(lambda t, d, v: t - outer_lr * (d + momentum * v), theta, delta, velocity)
  return theta
