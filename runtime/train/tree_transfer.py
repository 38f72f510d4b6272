"""Copies of parameter trees that share no buffer with their source; between two single devices, one packed buffer
instead of one transfer per leaf where the leaves are small; and the host route of reports and Θ (`route`).

jax.device_put spends ~40 µs of host CPU per leaf in Python (jax 0.10.2), so a 27-leaf tree cost the controller
~1.2 ms per report and per Θ adopted. Packing the leaves into one buffer on the source device, sending that, and
unpacking it on the destination costs three dispatches (~0.4 ms) and moves the same bits: concatenation and
slicing copy values exactly, and the unpacked leaves share no buffer with the source. Large leaves go one by one
between devices of one platform (`leafwise`): XLA:CPU's packing and unpacking passes are the slow part there.
"""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec as P

PyTree = Any

ALIGN_BYTES = 64  # a staged leaf starts at a multiple of this: XLA:CPU adopts such a NumPy buffer without a copy
# Leaves averaging this many bytes go one at a time (a staged tree's adopted in place, others copied by device_put):
# handling one costs ~40 µs of Python, about what copying 64 KiB costs. Smaller ones go packed, as one buffer
ADOPT_BYTES = 64 * 1024


def leafwise(tree: PyTree, sharding: PyTree) -> bool:
  """Whether a `packable` tree goes to `sharding` faster leaf by leaf than packed: between devices of one platform,
  leaves averaging ADOPT_BYTES or more (XLA:CPU packs and unpacks at ~2 GB/s, a device_put copies at ~7 GB/s)."""
  leaves, targets = jax.tree.leaves(tree), jax.tree.leaves(sharding)
  if sum(x.nbytes for x in leaves) < ADOPT_BYTES * len(leaves):
    return False
  source = next(iter(leaves[0].sharding.device_set))  # (packable: the leaves share one device)
  return len({frozenset(s.device_set) for s in targets}) == 1 and next(iter(targets[0].device_set)).platform == (
      source.platform)


def packable(tree: PyTree, sharding: PyTree) -> bool:
  """Whether `tree` (one dtype, on one device) can go to `sharding` (one device; a sharding or a tree of them)."""
  leaves = jax.tree.leaves(tree)
  return (bool(leaves) and all(isinstance(x, jax.Array) for x in leaves)
          and len(jax.tree.leaves(sharding)[0].device_set) == 1
          and len({x.dtype for x in leaves}) == 1 and _devices(leaves) == 1)


def _devices(leaves: list[Any]) -> int:
  """How many devices the leaves are on, together (host arrays: none)."""
  return len({d for x in leaves if isinstance(x, jax.Array) for d in x.sharding.device_set})


@jax.jit
def _pack(leaves: list[jax.Array]) -> jax.Array:
  return jnp.concatenate([x.reshape(-1) for x in leaves])


@functools.lru_cache(maxsize=None)
def _unpacker(shapes: tuple[tuple[int, ...], ...], shardings: tuple[jax.sharding.Sharding, ...]) -> Any:
  """The jitted inverse of `_pack` for leaves of `shapes`, each laid out on its sharding."""
  ends = np.cumsum([int(np.prod(s)) for s in shapes]).tolist()

  def unpack(flat: jax.Array) -> list[jax.Array]:
    return [flat[end - int(np.prod(s)):end].reshape(s) for s, end in zip(shapes, ends)]

  return jax.jit(unpack, out_shardings=list(shardings))


def send(tree: PyTree, sharding: PyTree, packed: np.ndarray | None = None) -> PyTree:
  """`tree` copied onto `sharding` (one for all leaves, or a tree of them) through one packed buffer; see `packable`.
  `packed`: its leaves already packed on the host (`Shared`), sent through the target's pinned host memory where the
  target is not a CPU device."""
  leaves, treedef = jax.tree.flatten(tree)
  targets = jax.tree.leaves(sharding)
  targets = tuple(targets) if len(targets) == len(leaves) else (targets[0],) * len(leaves)
  one = targets[0]  # (the packed buffer is one vector: a sharding split along a tensor axis cannot hold it)
  one = NamedSharding(one.mesh, P()) if isinstance(one, NamedSharding) else one
  if packed is None:
    flat = jax.device_put(_pack(leaves), one)
  else:
    pinned = _pinned(one) if next(iter(one.device_set)).platform != "cpu" else None
    flat = jax.device_put(packed if pinned is None else jax.device_put(packed, pinned), one)
  return jax.tree.unflatten(treedef, _unpacker(tuple(x.shape for x in leaves), targets)(flat))


@jax.jit
def fresh_copy(tree: PyTree) -> PyTree:
  return jax.tree.map(jnp.copy, tree)


def copy_to(tree: PyTree, sharding: jax.sharding.Sharding) -> PyTree:
  """A transfer whose result shares no buffer with its source.

  The learner donates its buffers to each round and the syncer keeps Θ's history, so neither may
  alias the other; device_put between overlapping CPU device sets reuses the shared device's buffer
  even with may_alias=False, hence a copy program. Copies to the host run on the host's single device:
  a copy on the learner's slice queued behind the rounds dispatched before it (XLA:CPU appeared to run
  one multi-device program at a time), and the learner's report with it. Between single devices the tree
  travels as one packed buffer, which costs the controller a third of the CPU time. A Staged tree (a report) lands
  on one host device as views of its buffer, without a copy; a Shared one (Θ) goes from its buffer packed once.
  """
  if isinstance(tree, Shared):
    return send(tree.tree, sharding, tree.packed()) if packable(tree.tree, sharding) else copy_to(tree.tree, sharding)
  if isinstance(tree, Staged):
    single = len(jax.tree.leaves(sharding)[0].device_set) == 1
    return tree.land(jax.tree.leaves(sharding)[0]) if single else copy_to(tree.host(), sharding)
  if packable(tree, sharding):
    if not leafwise(tree, sharding):
      return send(tree, sharding)
    same = jax.tree.leaves(sharding)[0].device_set == jax.tree.leaves(tree)[0].sharding.device_set
    return jax.device_put(fresh_copy(tree) if same else tree, sharding)  # (on their own device: a copy program)
  if not _devices(jax.tree.leaves(tree)):  # host (NumPy) arrays: each process lays out its share of the target
    return fresh_copy(jax.device_put(tree, sharding))
  # (one target device, or a tree whose tensors are on several devices: a sharded syncer's Θ)
  if len(jax.tree.leaves(sharding)[0].device_set) == 1 or _devices(jax.tree.leaves(tree)) > 1:
    return fresh_copy(jax.device_put(tree, sharding))
  return jax.device_put(fresh_copy(tree), sharding)


# The pinned route ---------------------------------------------------------------------------------------------------
# A report goes up as one transfer into its device's pinned host memory, started when it is taken and read by the
# syncer as NumPy views of that buffer (no unpack pass on the host); Θ goes down packed once per merge for every
# learner it goes to, through the learner device's pinned host memory where that device is not the host's.


@functools.lru_cache(maxsize=None)
def route(asked: str) -> str:
  """The route a process takes (asked: run.host_transfers), decided once per process (the controller's, and each Ray
  actor's for its own devices): "pinned" where its devices have pinned host memory (asked "auto": and are not CPU
  devices, whose own copies are faster: docs/accelerator.md) and a probe tree makes the round trip through it intact,
  as on GPUs; else "copy" (tree copies by `copy_to`; TPUs too, which export no buffer to NumPy in place)."""
  device = jax.devices()[0]
  if asked == "copy" or (asked == "auto" and device.platform == "cpu"):
    return "copy"
  if _pinned(jax.sharding.SingleDeviceSharding(device)) is None:
    return "copy"
  try:
    probe = {"a": jnp.arange(3, dtype=jnp.float32), "b": jnp.ones((2, 5), jnp.float32)}
    host = jax.device_put(stage(probe).host(), jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0]))
    down = copy_to(Shared(host), jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    intact = all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(probe), jax.tree.leaves(down)))
  except Exception as error:  # pylint: disable=broad-except  # (any refusal of the platform's: the copy route serves)
    logging.warning("host_transfers=%s: the pinned route's probe failed on %s (%s); reports and Θ take the copy route",
                    asked, device, error)
    return "copy"
  if not intact:
    logging.warning("host_transfers=%s: the pinned route's probe came back changed on %s; the copy route serves",
                    asked, device)
  return "pinned" if intact else "copy"


def _pinned(sharding: jax.sharding.Sharding) -> jax.sharding.Sharding | None:
  """`sharding` in its devices' pinned host memory (None where they have none)."""
  device = next(iter(sharding.device_set))
  if "pinned_host" not in {m.kind for m in device.addressable_memories()}:
    return None
  return sharding.with_memory_kind("pinned_host")


def _layout(shapes: tuple[tuple[int, ...], ...], itemsize: int) -> tuple[tuple[int, ...], int]:
  """Each leaf's offset (in elements) in a staged buffer, each aligned to ALIGN_BYTES, and the buffer's length."""
  align, offsets, end = max(1, ALIGN_BYTES // itemsize), [], 0
  for shape in shapes:
    offsets.append(end)
    end += -(-int(np.prod(shape)) // align) * align
  return tuple(offsets), max(end, 1)


@functools.lru_cache(maxsize=None)  # (one per tree shape and device: bounded by the fragments times the slices)
def _stager(shapes: tuple[tuple[int, ...], ...], dtype: Any, target: jax.sharding.Sharding) -> Any:
  """The jitted packing of leaves of `shapes` into one buffer laid out by `_layout`, written to `target`."""
  offsets, length = _layout(shapes, np.dtype(dtype).itemsize)
  ends = [*offsets[1:], length]

  def pack(leaves: list[jax.Array]) -> jax.Array:
    parts = []
    for x, at, end in zip(leaves, offsets, ends):
      parts += [x.reshape(-1), jnp.zeros((end - at - x.size,), dtype)]
    return jnp.concatenate(parts)

  return jax.jit(pack, out_shardings=target)


@functools.lru_cache(maxsize=None)  # (one per tree shape and host device)
def _unstager(shapes: tuple[tuple[int, ...], ...], sharding: jax.sharding.Sharding) -> Any:
  """The jitted inverse of `_stager`'s packing, on `sharding`."""

  def unpack(flat: jax.Array) -> list[jax.Array]:
    offsets, _ = _layout(shapes, flat.dtype.itemsize)
    return [flat[at:at + int(np.prod(s))].reshape(s) for s, at in zip(shapes, offsets)]

  return jax.jit(unpack, out_shardings=[sharding] * len(shapes))


@dataclasses.dataclass(frozen=True, eq=False)
class Staged:
  """A tree's leaves packed into one buffer in their device's pinned host memory: its copy there is started, not
  awaited (`host` waits for it)."""

  flat: jax.Array
  treedef: Any
  shapes: tuple[tuple[int, ...], ...]
  source: PyTree  # the tree on its device: what a checkpoint fetches, on its own thread (reading `flat` would wait)

  def host(self) -> PyTree:
    """The tree as NumPy views of the one buffer (read-only; no copy: they keep the buffer alive)."""
    whole = np.from_dlpack(self.flat)
    offsets, _ = _layout(self.shapes, whole.dtype.itemsize)
    views = [whole[at:at + int(np.prod(shape))].reshape(shape) for shape, at in zip(self.shapes, offsets)]
    return jax.tree.unflatten(self.treedef, views)

  def land(self, sharding: jax.sharding.Sharding) -> PyTree:
    """The tree on `sharding` (one host device): its leaves adopted in place, or (small leaves, see ADOPT_BYTES)
    unpacked there by one program from the buffer adopted whole."""
    if self.flat.nbytes >= ADOPT_BYTES * len(self.shapes):
      return jax.device_put(self.host(), sharding)
    whole = jax.device_put(np.from_dlpack(self.flat), sharding)
    return jax.tree.unflatten(self.treedef, _unstager(self.shapes, sharding)(whole))


def stage(tree: PyTree) -> PyTree:
  """`tree` (one dtype, on one device that has pinned host memory) as Staged, its copy started; any other tree as
  it is (the merge worker copies it by `copy_to`)."""
  leaves, treedef = jax.tree.flatten(tree)
  if not leaves or not packable(tree, leaves[0].sharding):
    return tree
  target = _pinned(jax.sharding.SingleDeviceSharding(next(iter(leaves[0].sharding.device_set))))
  if target is None:
    return tree
  shapes = tuple(tuple(x.shape) for x in leaves)
  return Staged(_stager(shapes, leaves[0].dtype, target)(leaves), treedef, shapes, tree)


def host_view(tree: PyTree) -> PyTree:
  """A tree as its leaves can be read on the host: a Staged one as NumPy views of its buffer (once its copy is
  done), any other as it is."""
  return tree.host() if isinstance(tree, Staged) else tree


def unstaged(tree: PyTree) -> PyTree:
  """A Staged tree's source on its device (nothing waits), any other as it is."""
  return tree.source if isinstance(tree, Staged) else tree


def _pack_on_host(leaves: list[Any]) -> np.ndarray:
  """Leaves on the host CPU packed into one NumPy buffer: one host pass, about twice as fast as XLA:CPU's
  concatenation (the leaves are read in place)."""
  return np.concatenate([np.asarray(x).reshape(-1) for x in leaves])


@dataclasses.dataclass(eq=False)
class Shared:
  """A host tree sent to several devices (Θ to every learner a merge answers), packed once. Used by one thread (the
  merge worker's): `packed` is not guarded."""

  tree: PyTree
  _flat: np.ndarray | None = dataclasses.field(default=None, init=False, repr=False)

  def packed(self) -> np.ndarray:
    """The tree's leaves in one host buffer: packed by the first send, shared by the others."""
    if self._flat is None:
      self._flat = _pack_on_host(jax.tree.leaves(self.tree))
    return self._flat
