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


def _quantizer(codec: codecs.Codec) -> Any:
  """The program that quantizes Θ − Θ̃ (the trees `codec` was made for) into the codec's parts."""
  return jax.jit(lambda theta, base: codec.encode(jax.tree.map(jnp.subtract, theta, base)))


class Mirrors:
  """The syncer's end: per learner the latest Θ̃_m it sent, and the programs that quantize Θ − Θ̃_m (one per shard of
  the syncer, each on its shard's tensors: quantization is per tensor, so the parts are the same)."""

  def __init__(self, cfg: CompressionConfig, like: PyTree, shards: Any = None):
    self.codec = _codec(cfg, like)
    self.shards = shards  # the syncer's shards (sync/shards.py), or None: one, on the host CPU
    parts = shards.parts(like) if shards is not None and shards.num > 1 else [like]
    self._encoders = [_quantizer(_codec(cfg, part)) for part in parts]
    self._counts = [len(leaf.parts()) for leaf in self.codec.leaves]  # parts per tensor, in tensor order
    self._held: dict[int, tuple[int, PyTree]] = {}  # learner -> (mirror number, Θ̃_m on the host CPU)
    self._count = 0

  def get(self, learner: int, mirror: int) -> PyTree | None:
    """Θ̃ number `mirror` of the learner, or None once a later one replaced it."""
    number, theta = self._held.get(learner, (NO_MIRROR, None))
    return theta if number == mirror else None

  def send(self, learner: int, theta: PyTree, base: PyTree) -> tuple[payload_lib.Payload, int]:
    """The payload of Θ − base for the learner holding `base`, and the number of the mirror it becomes."""
    if len(self._encoders) == 1:
      parts = jax.device_get(self._encoders[0](theta, base))
    else:  # each shard quantizes its tensors where they live; the payload has every tensor's parts in order
      per_shard = [self._encoders[s](*pair) if self.shards.holds(pair[0], s) else []
                   for s, pair in enumerate(zip(self.shards.parts(theta), self.shards.parts(base)))]
      parts = self.shards.interleave(jax.device_get(per_shard), self._counts)
    payload = payload_lib.pack(parts)
    mirror = _add(_host(base), self.codec.decode(parts))
    self._count += 1
    self._held[learner] = (self._count, self._place(mirror, theta))
    return payload, self._count

  def _place(self, tree: PyTree, like: PyTree) -> PyTree:
    """A host tree where the syncer keeps Θ (`like`'s device, or each tensor on its shard's)."""
    if self.shards is not None and self.shards.num > 1:
      return self.shards.place(tree)
    return jax.device_put(tree, jax.tree.leaves(like)[0].sharding)

  def snapshot(self, packer: snapshot_lib.Packer, group: str = snapshot_lib.HOST) -> dict:
    """Every learner's mirror and its number, and the count of mirrors made."""
    held = [[m, number, packer.tree(theta, "params", group)] for m, (number, theta) in sorted(self._held.items())]
    return dict(count=self._count, held=held)

  def restore(self, saved: dict | None, unpacker: snapshot_lib.Unpacker) -> None:
    """The mirrors as `snapshot` saw them, on the syncer's host CPU device (none in a checkpoint from before)."""
    saved = saved or dict(count=0, held=[])
    self._count = saved["count"]
    sharded = self.shards is not None and self.shards.num > 1
    place, where = (self.shards.placer(), "shards") if sharded else (None, snapshot_lib.HOST)
    self._held = {m: (number, unpacker.tree(theta, place, where)) for m, number, theta in saved["held"]}


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
