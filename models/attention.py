"""Causal self-attention shared by the built-in models: rotary positions, grouped-query heads, and a KV cache.

Training and evaluation (`decode=False`) see a whole window at once. Sampling (`decode=True`) keeps each layer's keys
and values in the 'cache' collection, [B, max_len, kv_heads, head_dim] with the next position's index: a call with L
new tokens writes their keys and values at the index, attends to every cached position up to each query's own, and
advances the index by L. A first call on a window padded to max_len fills the cache (the padding's entries lie after
the last real token, and are overwritten before any query can see them); each later call adds one token.
"""

import jax
import jax.numpy as jnp
from flax import linen as nn

from models.config import ROPE_BASE


def rotary(x_BxLxHxK: jax.Array, positions_L: jax.Array | None = None) -> jax.Array:
  """Rotates channel pairs (first half, second half) by position-dependent angles (RoPE, base 10,000)."""
  _, length, _, head_dim = x_BxLxHxK.shape
  half = head_dim // 2
  if positions_L is None:
    positions_L = jnp.arange(length, dtype=jnp.float32)
  freqs_F = 1.0 / (ROPE_BASE ** (jnp.arange(half, dtype=jnp.float32) / half))
  angles_LxF = positions_L.astype(jnp.float32)[:, None] * freqs_F[None, :]
  sin, cos = jnp.sin(angles_LxF)[None, :, None, :], jnp.cos(angles_LxF)[None, :, None, :]
  x1, x2 = x_BxLxHxK[..., :half], x_BxLxHxK[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxLxHxK.dtype)


class KVCache(nn.Module):
  """One layer's cached keys and values for sampling (see the module docstring)."""

  max_len: int
  rope: bool

  @nn.compact
  def __call__(self, q_BxLxHxK: jax.Array, k_BxLxGxK: jax.Array, v_BxLxGxK: jax.Array) -> jax.Array:
    """Attention of the new tokens' queries over every cached position, after caching their keys and values."""
    batch, length, groups, head_dim = k_BxLxGxK.shape
    shape = (batch, self.max_len, groups, head_dim)
    keys = self.variable("cache", "key", jnp.zeros, shape, k_BxLxGxK.dtype)
    values = self.variable("cache", "value", jnp.zeros, shape, v_BxLxGxK.dtype)
    index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    start = index.value
    positions_L = start + jnp.arange(length)
    if self.rope:
      q_BxLxHxK, k_BxLxGxK = rotary(q_BxLxHxK, positions_L), rotary(k_BxLxGxK, positions_L)
    keys.value = jax.lax.dynamic_update_slice(keys.value, k_BxLxGxK, (0, start, 0, 0))
    values.value = jax.lax.dynamic_update_slice(values.value, v_BxLxGxK, (0, start, 0, 0))
    index.value = start + length
    return attend(q_BxLxHxK, keys.value, values.value, q_BxLxHxK.dtype, positions_L)


def attend(q_BxLxHxK: jax.Array, k_BxTxGxK: jax.Array, v_BxTxGxK: jax.Array, dtype,
           query_positions_L: jax.Array | None = None) -> jax.Array:
  """Causal softmax attention; query head h reads key/value group h // (H / G) (grouped-query attention).

  Without `query_positions_L`, queries and keys are the same L positions (a whole window); with it, each query
  sees the keys at positions up to its own (a cache)."""
  num_heads, groups, head_dim = q_BxLxHxK.shape[2], k_BxTxGxK.shape[2], q_BxLxHxK.shape[3]
  if groups != num_heads:
    k_BxTxGxK = jnp.repeat(k_BxTxGxK, num_heads // groups, axis=2)
    v_BxTxGxK = jnp.repeat(v_BxTxGxK, num_heads // groups, axis=2)
  length, keys = q_BxLxHxK.shape[1], k_BxTxGxK.shape[1]
  if query_positions_L is None:
    mask_1x1xLxT = jnp.tril(jnp.ones((length, keys), dtype=bool))[None, None]
  else:
    mask_1x1xLxT = (jnp.arange(keys)[None, :] <= query_positions_L[:, None])[None, None]
  logits_BxHxLxT = jnp.einsum("bqhk,bthk->bhqt", q_BxLxHxK, k_BxTxGxK) / jnp.sqrt(head_dim).astype(dtype)
  logits_BxHxLxT = jnp.where(mask_1x1xLxT, logits_BxHxLxT, jnp.finfo(logits_BxHxLxT.dtype).min)
  probs_BxHxLxT = jax.nn.softmax(logits_BxHxLxT.astype(jnp.float32), axis=-1).astype(dtype)
  return jnp.einsum("bhqt,bthk->bqhk", probs_BxHxLxT, v_BxTxGxK)


def positioned(q_BxLxHxK: jax.Array, k_BxLxGxK: jax.Array, v_BxLxGxK: jax.Array, *, rope: bool, decode: bool,
               max_len: int, dtype) -> jax.Array:
  """Attention over a window (decode=False), or over the cache after adding these tokens (decode=True); with
  `rope`, queries and keys rotated by their positions first. Call inside the attention module's compact method."""
  if decode:
    return KVCache(max_len, rope, name="cache")(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK)
  if rope:
    q_BxLxHxK, k_BxLxGxK = rotary(q_BxLxHxK), rotary(k_BxLxGxK)
  return attend(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, dtype)
