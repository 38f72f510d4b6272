"""How Θ travels syncer → learner compressed: the update Θ − Θ̃_m from a mirror Θ̃_m of what learner m holds.

The syncer quantizes Θ − Θ̃_m on its host CPU and both ends then add the same decoded update to the same Θ̃_m in
NumPy, so the syncer's mirror and the Θ the learner adopts are equal bit for bit; what was not sent stays in the
next difference (error feedback down). A held Θ is named by a key (mirror, version): mirror is -1 for Θ whole
(version `version` of Θ's history, as a (re)start or a reset receives it), else the sequence number of the mirror.
A learner's report names the key it started from, so the syncer rebuilds θ_m from exactly that Θ.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from runtime.checkpoint import snapshot as snapshot_lib
from runtime.wire import codecs
from runtime.wire import payload as payload_lib
from runtime.wire.config import CompressionConfig

PyTree = Any
NO_MIRROR = -1  # the mirror number of a Θ received whole (no mirror of it is kept)


def _host(tree: PyTree) -> PyTree:
  return jax.tree.map(lambda x: np.array(x, np.float32), jax.device_get(tree))


def _add(base: PyTree, update: PyTree) -> PyTree:
  """Θ̃ + deQ(…) in NumPy fp32, the same on both ends."""
  return jax.tree.map(lambda b, u: np.add(b, u, dtype=np.float32), base, update)


def _codec(cfg: CompressionConfig, like: PyTree) -> codecs.Codec:
  return codecs.Codec(dataclasses.replace(cfg, up=cfg.down), like)


class Mirrors:
  """The syncer's end: per learner the latest Θ̃_m it sent, and the program that quantizes Θ − Θ̃_m."""

  def __init__(self, cfg: CompressionConfig, like: PyTree):
    self.codec = _codec(cfg, like)
    self._encode = jax.jit(lambda theta, base: self.codec.encode(jax.tree.map(jnp.subtract, theta, base)))
    self._held: dict[int, tuple[int, PyTree]] = {}  # learner -> (mirror number, Θ̃_m on the host CPU)
    self._count = 0

  def get(self, learner: int, mirror: int) -> PyTree | None:
    """Θ̃ number `mirror` of the learner, or None once a later one replaced it."""
    number, theta = self._held.get(learner, (NO_MIRROR, None))
    return theta if number == mirror else None

  def send(self, learner: int, theta: PyTree, base: PyTree) -> tuple[payload_lib.Payload, int]:
    """The payload of Θ − base for the learner holding `base`, and the number of the mirror it becomes."""
    parts = jax.device_get(self._encode(theta, base))
    payload = payload_lib.pack(parts)
    mirror = _add(_host(base), self.codec.decode(parts))
    sharding = jax.tree.leaves(theta)[0].sharding
    self._count += 1
    self._held[learner] = (self._count, jax.device_put(mirror, sharding))
    return payload, self._count

  def snapshot(self, packer: snapshot_lib.Packer, group: str = snapshot_lib.HOST) -> dict:
    """Every learner's mirror and its number, and the count of mirrors made."""
    held = [[m, number, packer.tree(theta, "params", group)] for m, (number, theta) in sorted(self._held.items())]
    return dict(count=self._count, held=held)

  def restore(self, saved: dict | None, unpacker: snapshot_lib.Unpacker) -> None:
    """The mirrors as `snapshot` saw them, on the syncer's host CPU device (none in a checkpoint from before)."""
    saved = saved or dict(count=0, held=[])
    self._count = saved["count"]
    self._held = {m: (number, unpacker.tree(theta)) for m, number, theta in saved["held"]}


class Downlink:
  """The learner's end: the Θ it holds on the host (a copy of Θ whole, or its mirror) and the key naming it."""

  def __init__(self, cfg: CompressionConfig):
    self.cfg = cfg
    self.codec: codecs.Codec | None = None
    self.theta: PyTree = None
    self.key = (NO_MIRROR, 0)

  def hold(self, theta: PyTree, version: int) -> None:
    """Θ of `version` arrived whole."""
    self.theta, self.key = _host(theta), (NO_MIRROR, version)

  def receive(self, delivery: Any) -> PyTree:
    """The Θ a delivery brings (its mirror, decoded onto what the learner holds); raises CorruptPayload if its bytes
    are damaged or it updates another Θ than the one held, so nothing is adopted."""
    if delivery.payload is None:
      self.hold(delivery.params, delivery.version)
      return delivery.params
    if tuple(delivery.base) != self.key:
      raise payload_lib.CorruptPayload(f"Θ update is for Θ {tuple(delivery.base)}, the learner holds {self.key}")
    if self.codec is None:
      self.codec = _codec(self.cfg, self.theta)
    self.theta = _add(self.theta, self.codec.open(delivery.payload))
    self.key = (delivery.mirror, delivery.version)
    return self.theta

  def snapshot(self, packer: snapshot_lib.Packer, group: str = snapshot_lib.HOST) -> dict:
    """The Θ held (host arrays, never changed in place) and its key."""
    return dict(theta=packer.tree(self.theta, "params", group), key=list(self.key))

  def restore(self, saved: dict | None, unpacker: snapshot_lib.Unpacker) -> None:
    """The Θ held (NumPy, as `hold` makes it) and its key as `snapshot` saw them."""
    if saved is not None:  # (None: a checkpoint from before they were saved)
      self.theta = unpacker.tree(saved["theta"], lambda x, _: np.array(x, np.float32), where="numpy")
      self.key = tuple(saved["key"])
