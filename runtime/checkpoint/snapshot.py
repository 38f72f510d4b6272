"""A controller's state as a checkpoint: JSON for the bookkeeping, one table of arrays for every pytree.

`Packer` turns the controller's objects (parameter trees, fault plans, and the messages whose owners give a
`Codec`) into JSON that names arrays by key; each array is stored once however many objects share it. A group of
arrays whose device program failed is dropped whole, its device error kept so that the resumed run meets the same
failure. `Unpacker` turns the JSON and the arrays back into objects, each tree placed where the caller says.
"""

import dataclasses
from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np

from runtime.config.faults import Fault
from runtime.faults import injection
from runtime.faults.plan import fault_index
from runtime.train import tree_transfer

PyTree = Any
HOST = "host"  # the group of arrays that no failed program produced


@dataclasses.dataclass(frozen=True)
class Codec:
  """How the owner of a message type saves it: the JSON tag, and the encoding each way (its trees through the
  packer and unpacker)."""

  kind: type
  tag: str
  encode: Callable[["Packer", Any], dict]
  decode: Callable[["Unpacker", dict], Any]


class Packer:
  """Collects the arrays of a snapshot (by group) while its JSON is built."""

  def __init__(self, schedule: tuple[Fault, ...], treedefs: dict[str, Any], codecs: Sequence[Codec] = ()):
    self._schedule, self._codecs = schedule, tuple(codecs)
    self.treedefs = treedefs  # kind -> the treedef that trees of that kind have ("params", "train", ...)
    self._keys: dict[int, str] = {}  # id(array) -> key
    self.groups: dict[str, dict[str, jax.Array]] = {}  # holds every packed array, so that ids stay unique
    self.failed: dict[str, str] = {}  # groups packed elsewhere (`fetched`) whose program failed there: the error

  def tree(self, tree: PyTree | None, kind: str, group: str = HOST) -> dict | None:
    """A pytree of kind `kind` ("dict" or a key of the treedefs) as {"kind", "keys"}; its arrays go to `group`."""
    if tree is None:
      return None
    tree = tree_transfer.unstaged(tree)  # (a report staged in pinned host memory: fetched from its source)
    names = None
    if kind == "dict":  # a flat dict of arrays (a round's metrics)
      names = sorted(tree)
      leaves = [tree[name] for name in names]
    else:
      leaves, treedef = jax.tree.flatten(tree)
      kind = next((k for k in self.treedefs if k.partition("/")[0] == kind and self.treedefs[k] == treedef), kind)
      if treedef != self.treedefs[kind]:  # (a fragment of kind "params" is of kind "params/<p>")
        raise ValueError(f"snapshot: a '{kind}' tree has structure {treedef}, expected {self.treedefs[kind]}")
    keys = []
    for leaf in leaves:
      if id(leaf) not in self._keys:
        self._keys[id(leaf)] = f"a{len(self._keys)}"
        self.groups.setdefault(group, {})[self._keys[id(leaf)]] = leaf
      keys.append(self._keys[id(leaf)])
    return {"kind": kind, "keys": keys, **({"names": names} if names else {})}

  def fetched(self, saved: Any, arrays: dict[str, np.ndarray], failed: dict[str, str], prefix: str) -> Any:
    """A part packed and fetched by a Packer of its own elsewhere (a learner in another process): its JSON with its
    arrays' keys under `prefix`, those arrays held here (in group `prefix`), and the groups whose program failed
    there with their errors."""
    self.groups.setdefault(prefix, {}).update({prefix + key: array for key, array in arrays.items()})
    self.failed.update(failed)
    return _rekeyed(saved, lambda key: prefix + key)

  def value(self, x: Any) -> Any:
    """JSON for a message, event payload or plain value."""
    codec = next((c for c in self._codecs if isinstance(x, c.kind)), None)
    if codec is not None:
      return {codec.tag: codec.encode(self, x)}
    if isinstance(x, Fault):
      return {"fault": fault_index(self._schedule, x)}
    if isinstance(x, tuple):
      return {"tuple": [self.value(v) for v in x]}
    if x is None or isinstance(x, (bool, int, float, str, dict, list)):
      return x
    raise TypeError(f"snapshot: cannot save a {type(x).__name__} ({x!r:.80})")



def tree_kinds(params: PyTree, state: Any, fragments: Any) -> dict[str, Any]:
  """The kinds of tree a learner's part of a snapshot packs, by structure: Θ's ("params", and "params/<p>" for each
  fragment p when there are `fragments.num` > 1: its `part(params, p)`), and its train state's ("train")."""
  parts = {f"params/{p}": jax.tree.structure(fragments.part(params, p)) for p in range(fragments.num)}
  return dict(params=jax.tree.structure(params), **(parts if fragments.num > 1 else {}),
              train=jax.tree.structure(state))


def fetch(groups: dict[str, dict[str, jax.Array]]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  """The arrays of every group on the host, and the device error of each group whose program failed."""
  arrays, failed = {}, {}
  for group, members in groups.items():
    try:
      arrays.update(jax.device_get(members))
    except Exception as error:  # pylint: disable=broad-except
      failed[group] = injection.describe(error)
  return arrays, failed


class Unpacker:
  """Rebuilds objects from a snapshot's JSON and host arrays."""

  def __init__(self, arrays: dict[str, np.ndarray], failed: dict[str, str], schedule: tuple[Fault, ...],
               treedefs: dict[str, Any], host_sharding: jax.sharding.Sharding | None, codecs: Sequence[Codec] = ()):
    self._arrays, self.failed, self._codecs = arrays, failed, {c.tag: c for c in codecs}
    self._schedule, self.treedefs, self._host = schedule, treedefs, host_sharding
    self._placed: dict[tuple, PyTree] = {}  # the same arrays placed the same way are one tree

  def tree(self, encoded: dict | None, place: Callable[[np.ndarray, int], jax.Array] | None = None,
           where: str = HOST) -> PyTree | None:
    """The pytree `encoded` names; leaf i placed by `place(array, i)` (default: on the host device; with no host
    sharding, left as NumPy for its user to lay out, as a gang's members do).

    `where` names the placement: the same arrays placed at the same `where` are one tree.
    """
    if encoded is None:
      return None
    key = (tuple(encoded["keys"]), where)
    if key not in self._placed:
      place = place or (lambda x, _: x if self._host is None else jax.device_put(x, self._host))
      leaves = [place(self._arrays[k], i) for i, k in enumerate(encoded["keys"])]
      if encoded["kind"] == "dict":
        self._placed[key] = dict(zip(encoded["names"], leaves))
      else:
        self._placed[key] = jax.tree.unflatten(self.treedefs[encoded["kind"]], leaves)
    return self._placed[key]

  def arrays_named(self, saved: Any) -> dict[str, np.ndarray]:
    """The arrays that a part of the snapshot names in its trees (to restore that part elsewhere); a failed group's
    are none."""
    return {key: self._arrays[key] for tree in _packed_trees(saved) for key in tree["keys"] if key in self._arrays}

  def value(self, x: Any) -> Any:
    if isinstance(x, dict) and len(x) == 1:
      (tag, body), = x.items()
      if tag in self._codecs:
        return self._codecs[tag].decode(self, body)
      if tag == "fault":
        return self._schedule[body]
      if tag == "tuple":
        return tuple(self.value(v) for v in body)
    return x


def _is_packed_tree(saved: Any) -> bool:
  """Whether the JSON `saved` is a packed tree (Packer.tree's)."""
  return isinstance(saved, dict) and isinstance(saved.get("keys"), list) and "kind" in saved


def _packed_trees(saved: Any) -> Iterator[dict]:
  """The packed trees anywhere in the JSON `saved`."""
  if isinstance(saved, dict):
    if _is_packed_tree(saved):
      yield saved
      return
    saved = list(saved.values())
  if isinstance(saved, (list, tuple)):
    for value in saved:
      yield from _packed_trees(value)


def _rekeyed(saved: Any, rename: Callable[[str], str]) -> Any:
  """The JSON `saved` with each packed tree's array keys renamed."""
  if _is_packed_tree(saved):
    return dict(saved, keys=[rename(key) for key in saved["keys"]])
  if isinstance(saved, dict):
    return {name: _rekeyed(value, rename) for name, value in saved.items()}
  if isinstance(saved, (list, tuple)):
    return type(saved)(_rekeyed(value, rename) for value in saved)
  return saved


def copied(tree: PyTree) -> PyTree:
  """A copy of a device tree to snapshot (the next program donates the tree), or the tree itself if the program that
  made it failed: fetching it then fails again, and the snapshot records that error."""
  try:
    return tree_transfer.fresh_copy(tree)
  except jax.errors.JaxRuntimeError:
    return tree


def like(tree: PyTree) -> Callable[[np.ndarray, int], jax.Array]:
  """A placement that puts leaf i where leaf i of `tree` lives."""
  shardings = [x.sharding for x in jax.tree.leaves(tree)]
  return lambda x, i: jax.device_put(x, shardings[i])
