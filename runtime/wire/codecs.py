"""Codecs of outer gradients: bf16, block-wise int8/int4 (int4 packed two per byte) and top-k.

Quantization runs inside the learner's jitted program (jnp); the syncer dequantizes on its host CPU (NumPy).
Both sides share `dequantize` (written once for either array module), so what the learner's error feedback
assumes was sent is what the syncer decodes. Shapes, formats and sizes follow from the config and the model,
so only the parts' bytes travel (see payload.py).
"""

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from runtime.wire import payload as payload_lib
from runtime.wire.config import CompressionConfig

PyTree = Any
_LEVELS = {"int8": 127, "int4": 7}  # symmetric: q in [-L, L], x ≈ q · scale with scale = max|x| / L


@dataclasses.dataclass(frozen=True)
class Leaf:
  """How one tensor travels: `fmt` on its `size` values (top-k: `k` of them, then `values` on those)."""

  shape: tuple[int, ...]
  dtype: Any
  fmt: str  # "fp32" | "bf16" | "int8" | "int4" | "topk"
  block: int
  k: int = 0
  values: str = ""  # topk: the kept values' format

  @property
  def size(self) -> int:
    return math.prod(self.shape)

  def parts(self) -> list[tuple[np.dtype, int]]:
    """(dtype, count) of every array this tensor sends, in order."""
    if self.fmt == "topk":
      index = np.uint16 if self.size <= 1 << 16 else np.uint32
      return [(np.dtype(index), self.k), *_dense_parts(self.values, self.k, self.block)]
    return _dense_parts(self.fmt, self.size, self.block)


def _dense_parts(fmt: str, n: int, block: int) -> list[tuple[np.dtype, int]]:
  if fmt in ("fp32", "bf16"):
    return [(np.dtype(np.float32 if fmt == "fp32" else jnp.bfloat16), n)]
  values = (np.dtype(np.int8), n) if fmt == "int8" else (np.dtype(np.uint8), (n + 1) // 2)
  return [(np.dtype(np.float32), -(-n // block)), values]


def quantize(x: jax.Array, fmt: str, block: int) -> list[jax.Array]:
  """The parts of a 1-D fp32 vector in a dense format (jnp: runs inside the learner's program)."""
  if fmt == "fp32":
    return [x]
  if fmt == "bf16":
    return [x.astype(jnp.bfloat16)]
  n, levels = x.shape[0], _LEVELS[fmt]
  blocks = jnp.pad(x, (0, -n % block)).reshape(-1, block)
  scale = jnp.max(jnp.abs(blocks), axis=1) / levels
  safe = jnp.where(scale > 0, scale, 1.0)
  q = jnp.clip(jnp.round(blocks / safe[:, None]), -levels, levels).reshape(-1)[:n].astype(jnp.int8)
  if fmt == "int4":  # offset to [1, 15] and packed two per byte, low nibble first
    u = jnp.pad(q + 8, (0, n % 2)).astype(jnp.uint8).reshape(-1, 2)
    q = u[:, 0] | (u[:, 1] << 4)
  return [scale, q]


def dequantize(parts: Sequence[Any], fmt: str, n: int, block: int, xp: Any = np) -> Any:
  """The fp32 vector of n values a dense format's parts encode; `xp` is np (the syncer) or jnp (the learner)."""
  if fmt in ("fp32", "bf16"):
    return parts[0].astype(xp.float32)
  scale, q = parts
  if fmt == "int4":
    q = xp.stack([q & 15, q >> 4], axis=1).reshape(-1)[:n].astype(xp.int8) - 8
  return q.astype(xp.float32) * xp.repeat(scale, block)[:n]


def topk(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """The indices and values of the k entries of largest magnitude (ties: the lower index)."""
  _, index = jax.lax.top_k(jnp.abs(x), k)
  return index, x[index]


class Codec:
  """A pytree's codec: every tensor's `Leaf`, quantize on the learner, dequantize on the syncer."""

  def __init__(self, cfg: CompressionConfig, like: PyTree):
    self.cfg = cfg
    leaves, self.treedef = jax.tree.flatten(like)
    self.leaves = [self._leaf(x) for x in leaves]
    self.specs = [spec for leaf in self.leaves for spec in leaf.parts()]

  def _leaf(self, x: Any) -> Leaf:
    shape, c = tuple(x.shape), self.cfg
    if c.up != "topk":
      return Leaf(shape, x.dtype, c.up, c.block_size)
    return Leaf(shape, x.dtype, "topk", c.block_size, k=max(1, math.ceil(c.topk_fraction * math.prod(shape))),
                values=c.topk_values)

  def encode(self, delta: PyTree) -> list[jax.Array]:
    """Every part of every tensor of an fp32 outer gradient, in order (jnp, traced in the learner's program)."""
    parts = []
    for leaf, x in zip(self.leaves, jax.tree.leaves(delta)):
      x = x.reshape(-1).astype(jnp.float32)
      if leaf.fmt == "topk":
        index, values = topk(x, leaf.k)
        parts += [index.astype(leaf.parts()[0][0]), *quantize(values, leaf.values, leaf.block)]
      else:
        parts += quantize(x, leaf.fmt, leaf.block)
    return parts

  def decode(self, parts: Sequence[Any], xp: Any = np) -> PyTree:
    """The fp32 outer gradient the parts encode: on the syncer (np), or on the learner (jnp, error feedback)."""
    out, i = [], 0
    for leaf in self.leaves:
      count = len(leaf.parts())
      mine, i = parts[i:i + count], i + count
      if leaf.fmt == "topk":
        values = dequantize(mine[1:], leaf.values, leaf.k, leaf.block, xp)
        flat = _scatter(xp.zeros(leaf.size, xp.float32), mine[0].astype(xp.int32), values, xp)
      else:
        flat = dequantize(mine, leaf.fmt, leaf.size, leaf.block, xp)
      out.append(flat.reshape(leaf.shape))
    return jax.tree.unflatten(self.treedef, out)

  def open(self, payload: payload_lib.Payload) -> PyTree:
    """The outer gradient in a payload (raises CorruptPayload if its bytes are not what was sent)."""
    return self.decode(payload_lib.unpack(payload, self.specs))


def _scatter(out: Any, index: Any, values: Any, xp: Any) -> Any:
  if xp is np:
    out[index] = values
    return out
  return out.at[index].set(values)
