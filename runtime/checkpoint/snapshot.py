"""A controller's state as a checkpoint: JSON for the bookkeeping, one table of arrays for every pytree.

`Packer` turns the controller's objects (reports, deliveries, events, fault plans, parameter trees) into JSON
that names arrays by key; each array is stored once however many objects share it (Θ, its history and the
deliveries of Θ). Arrays are grouped: a group whose device program failed (a learner's round armed to crash)
is dropped whole, and its device error is kept so that the resumed run meets the same failure. `Unpacker`
turns the JSON and the arrays back into objects, each tree placed where the caller says.
"""

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from runtime.train import tree_transfer
from runtime.diloco.clock import Event
from runtime.diloco.messages import Delivery, Report
from runtime.faults import injection
from runtime.faults.plan import Fault, fault_index
from runtime.wire.payload import Payload

PyTree = Any
HOST = "host"  # the group of arrays that no failed program produced


class Packer:
  """Collects the arrays of a snapshot (by group) while its JSON is built."""

  def __init__(self, schedule: tuple[Fault, ...], treedefs: dict[str, Any]):
    self._schedule = schedule
    self._treedefs = treedefs  # kind -> the treedef that trees of that kind have ("params", "train", ...)
    self._keys: dict[int, str] = {}  # id(array) -> key
    self.groups: dict[str, dict[str, jax.Array]] = {}  # holds every packed array, so that ids stay unique

  def tree(self, tree: PyTree | None, kind: str, group: str = HOST) -> dict | None:
    """A pytree of kind `kind` ("dict" or a key of the treedefs) as {"kind", "keys"}; its arrays go to `group`."""
    if tree is None:
      return None
    names = None
    if kind == "dict":  # a flat dict of arrays (a round's metrics)
      names = sorted(tree)
      leaves = [tree[name] for name in names]
    else:
      leaves, treedef = jax.tree.flatten(tree)
      kind = next((k for k in self._treedefs if k.partition("/")[0] == kind and self._treedefs[k] == treedef), kind)
      if treedef != self._treedefs[kind]:  # (a fragment of kind "params" is of kind "params/<p>")
        raise ValueError(f"snapshot: a '{kind}' tree has structure {treedef}, expected {self._treedefs[kind]}")
    keys = []
    for leaf in leaves:
      if id(leaf) not in self._keys:
        self._keys[id(leaf)] = f"a{len(self._keys)}"
        self.groups.setdefault(group, {})[self._keys[id(leaf)]] = leaf
      keys.append(self._keys[id(leaf)])
    return {"kind": kind, "keys": keys, **({"names": names} if names else {})}

  def value(self, x: Any) -> Any:
    """JSON for a message, event payload or plain value."""
    if isinstance(x, (Report, Delivery)):
      trees = dict(params=lambda v: self.tree(v, "params"), payload=self.payload)
      return {"report" if isinstance(x, Report) else "delivery": {
          f.name: trees.get(f.name, lambda v: v)(getattr(x, f.name)) for f in dataclasses.fields(x)
          if f.name != "placed"}}  # (Θ already on a learner's slices: a resumed learner places it again)
    if isinstance(x, Fault):
      return {"fault": fault_index(self._schedule, x)}
    if isinstance(x, tuple):
      return {"tuple": [self.value(v) for v in x]}
    if x is None or isinstance(x, (bool, int, float, str, dict, list)):
      return x
    raise TypeError(f"snapshot: cannot save a {type(x).__name__} ({x!r:.80})")

  def event(self, event: Event) -> dict:
    return {"kind": event.kind, "learner": event.learner, "payload": self.value(event.payload)}

  def payload(self, payload: Payload | None) -> dict | None:
    """A compressed payload's bytes, as one uint8 array."""
    return None if payload is None else self.tree({"blob": np.frombuffer(payload.blob, np.uint8)}, "dict")


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
               treedefs: dict[str, Any], host_sharding: jax.sharding.Sharding):
    self._arrays, self.failed = arrays, failed
    self._schedule, self._treedefs, self._host = schedule, treedefs, host_sharding
    self._placed: dict[tuple, PyTree] = {}  # the same arrays placed the same way are one tree

  def tree(self, encoded: dict | None, place: Callable[[np.ndarray, int], jax.Array] | None = None,
           where: str = HOST) -> PyTree | None:
    """The pytree `encoded` names; leaf i placed by `place(array, i)` (default: on the host device).

    `where` names the placement: the same arrays placed at the same `where` are one tree.
    """
    if encoded is None:
      return None
    key = (tuple(encoded["keys"]), where)
    if key not in self._placed:
      place = place or (lambda x, _: jax.device_put(x, self._host))
      leaves = [place(self._arrays[k], i) for i, k in enumerate(encoded["keys"])]
      if encoded["kind"] == "dict":
        self._placed[key] = dict(zip(encoded["names"], leaves))
      else:
        self._placed[key] = jax.tree.unflatten(self._treedefs[encoded["kind"]], leaves)
    return self._placed[key]

  def value(self, x: Any) -> Any:
    if isinstance(x, dict) and len(x) == 1:
      (tag, body), = x.items()
      if tag in ("report", "delivery"):
        fields = {**body, "params": self.tree(body["params"]), "payload": self.payload(body.get("payload"))}
        if tag == "delivery":
          fields["base"] = tuple(fields.get("base", (-1, 0)))
        return (Report if tag == "report" else Delivery)(**fields)
      if tag == "fault":
        return self._schedule[body]
      if tag == "tuple":
        return tuple(self.value(v) for v in body)
    return x

  def event(self, encoded: dict) -> Event:
    return Event(encoded["kind"], encoded["learner"], self.value(encoded["payload"]))

  def payload(self, encoded: dict | None) -> Payload | None:
    return None if encoded is None else Payload(self.tree(encoded, lambda x, _: x, where="bytes")["blob"].tobytes())


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
