"""A learner's end of compressed reports: the Θ it measures its outer gradient from, the error-feedback
residual, and the program on its slice that quantizes Δ_m = Θ − θ_m.

The residual (what a lossy codec did not send) stays on the learner and is added to its next outer
gradient. It is dropped explicitly whenever the learner's work since its last report never reaches Θ:
on a (re)start from Θ, after a quarantined report, and when its data is served again (a lost report).
"""

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from runtime.checkpoint import snapshot as snapshot_lib
from runtime.faults import injection
from runtime.wire import codecs
from runtime.wire import payload as payload_lib
from runtime.wire.config import PAYLOAD_CORRUPTIONS, CompressionConfig

PyTree = Any


def _encode(theta: PyTree, params: PyTree, residual: PyTree | None, *, codec: codecs.Codec):
  """The codec's parts of Δ = Θ − θ (+ residual), and the new residual: Δ minus what the parts decode to."""
  delta = jax.tree.map(lambda t, p: t.astype(jnp.float32) - p.astype(jnp.float32), theta, params)
  if residual is not None:
    delta = jax.tree.map(jnp.add, delta, residual)
  parts = codec.encode(delta)
  if residual is not None:
    residual = jax.tree.map(jnp.subtract, delta, codec.decode(parts, jnp))
  return parts, residual


@jax.jit
def _copy(tree: PyTree) -> PyTree:
  return jax.tree.map(jnp.copy, tree)


class Uplink:
  """Quantizes the learner's outer gradient on its slice and packs it into the payload the syncer decodes."""

  def __init__(self, cfg: CompressionConfig):
    self.cfg = cfg
    self.codec: codecs.Codec | None = None
    self.theta: PyTree = None  # Θ as the learner received it, on its slice
    self.residual: PyTree = None  # on its slice; None without error feedback
    self._program = None

  def start(self, theta: PyTree, keep_residual: bool = False) -> None:
    """Θ was adopted: outer gradients are measured from it; the residual is dropped unless `keep_residual`."""
    self._compile(theta)
    self.theta = _copy(theta)  # the learner's next round donates the buffers it adopted
    if self.cfg.error_feedback and not (keep_residual and self.residual is not None):
      shardings = jax.tree.map(lambda x: x.sharding, theta)  # zeros depend on no input: placed explicitly
      self.residual = jax.jit(lambda t: jax.tree.map(jnp.zeros_like, t), out_shardings=shardings)(theta)

  def _compile(self, like: PyTree) -> None:
    """The codec and the quantizing program, made once (shapes follow from Θ)."""
    if self.codec is None:
      self.codec = codecs.Codec(self.cfg, like)
      self._program = jax.jit(functools.partial(_encode, codec=self.codec), donate_argnums=2)

  def encode(self, params: PyTree, corrupt: str = "") -> payload_lib.Payload:
    """The payload of Δ = Θ − θ; `corrupt` injects a fault into θ (nan, inf, huge) or into the payload's bytes."""
    return self.pack(self.quantize(params, corrupt), corrupt)

  def quantize(self, params: PyTree, corrupt: str = "") -> PyTree:
    """Enqueues the quantizing program on the slice and returns its parts at once (awaited in `pack`)."""
    if corrupt and corrupt not in PAYLOAD_CORRUPTIONS:
      params = injection.corrupt(params, corrupt)
    parts, self.residual = self._program(self.theta, params, self.residual)
    return parts

  @staticmethod
  def pack(parts: PyTree, corrupt: str = "") -> payload_lib.Payload:
    """The payload of the parts `quantize` returned (waits for them)."""
    payload = payload_lib.pack(jax.device_get(parts))
    return payload_lib.corrupted(payload, corrupt) if corrupt in PAYLOAD_CORRUPTIONS else payload

  def move(self, move: Callable[[PyTree], PyTree]) -> None:
    """The learner moved onto another set of slices: Θ and the residual go with it (`move` lays a tree out there)."""
    self.theta, self.residual = move(self.theta), move(self.residual)

  def snapshot(self, packer: snapshot_lib.Packer, group: str) -> dict:
    """Θ and the residual, into the learner's `group` (the residual copied: the next report donates it)."""
    residual = None if self.residual is None else snapshot_lib.copied(self.residual)
    return dict(theta=packer.tree(self.theta, "params", group), residual=packer.tree(residual, "params", group))

  def restore(self, saved: dict | None, unpacker: snapshot_lib.Unpacker, place: Any, group: str) -> None:
    """Θ and the residual as `snapshot` saw them, each leaf placed by `place` (on the learner's slice)."""
    if saved is None:  # a checkpoint from before the uplink was saved: start() sets it at the next Θ
      return
    self.theta = unpacker.tree(saved["theta"], place, where=group)
    self.residual = unpacker.tree(saved["residual"], place, where=group)
    if self.theta is not None:
      self._compile(self.theta)
