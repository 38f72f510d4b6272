"""Where the syncer's tensors live: Θ's tensors split across S host CPU devices (`syncer.shards`), whole tensors
packed by size as fragments are, each shard's share of every syncer structure (Θ, the outer momentum, the history,
the mirrors, the reports of a merge) on its device and merged there by its own programs.

Shard s of a tree is the same tree with every tensor outside s replaced by None, so paths and the per-tensor merge
rules apply unchanged. Every syncer program is per tensor except the norms, which sum per-tensor sums of squares in
tensor order on the host whatever S is: S = 4 merges to the same bits as S = 1. With S = 1 there is one shard, the
whole tree on the host CPU device, as before shards.
"""

from typing import Any, Callable, Sequence

import jax
import numpy as np

from runtime.diloco.sync.fragment_trees import FragmentTrees

PyTree = Any


class Shards:
  """The packing of one model's tensors into S shards, each on one device, and the shard trees it cuts and joins."""

  def __init__(self, like: PyTree, shardings: Sequence[jax.sharding.Sharding]):
    self._treedef = jax.tree.structure(like)
    self.num = len(shardings)
    self.shardings = tuple(shardings)
    packing = FragmentTrees(like, self.num)  # whole tensors packed by size, as fragments are
    self.groups, self.owner, self.nbytes = packing.groups, packing.owner, packing.nbytes  # owner: leaf -> shard

  def part(self, tree: PyTree, s: int) -> PyTree:
    """Shard s of `tree` (whole, or a fragment of it with None for the tensors outside the fragment)."""
    if self.num == 1:
      return tree
    leaves = self._treedef.flatten_up_to(tree)
    return self._treedef.unflatten([x if self.owner[i] == s else None for i, x in enumerate(leaves)])

  def parts(self, tree: PyTree) -> list[PyTree]:
    return [self.part(tree, s) for s in range(self.num)]

  def join(self, parts: Sequence[PyTree]) -> PyTree:
    """The tree whose shard s is parts[s] (tensors None in every part stay None)."""
    if self.num == 1:
      return parts[0]
    flat = [self._treedef.flatten_up_to(p) for p in parts]
    return self._treedef.unflatten([flat[self.owner[i]][i] for i in range(len(self.owner))])

  def holds(self, tree: PyTree, s: int) -> bool:
    """Whether shard s of `tree` has any tensor."""
    return bool(jax.tree.leaves(self.part(tree, s)))

  def place(self, tree: PyTree) -> PyTree:
    """`tree` with every tensor on its shard's device (host arrays or device arrays; None stays None)."""
    if self.num == 1:
      return jax.device_put(tree, self.shardings[0])
    leaves = self._treedef.flatten_up_to(tree)
    return self._treedef.unflatten([None if x is None else jax.device_put(x, self.shardings[self.owner[i]])
                                    for i, x in enumerate(leaves)])

  def placer(self) -> Callable[[np.ndarray, int], jax.Array] | None:
    """For a checkpoint's whole trees: leaf i onto its shard's device (None: the host device, as with S = 1)."""
    if self.num == 1:
      return None
    return lambda x, i: jax.device_put(x, self.shardings[self.owner[i]])

  def norm(self, sums: Sequence[Any], tree: PyTree) -> np.float32:
    """The global norm of `tree` from each shard's per-tensor sums of squares (`sums[s]`, in its tensors' order;
    None for a shard holding none of them): summed in tensor order in fp32, as one program over the whole tree
    sums them."""
    present = [i for i, x in enumerate(self._treedef.flatten_up_to(tree)) if x is not None]
    by_shard = [iter(()) if s is None else iter(np.asarray(s, np.float32).reshape(-1)) for s in jax.device_get(sums)]
    total = np.float32(0.0)
    for i in present:
      total = np.float32(total + next(by_shard[self.owner[i]]))
    return np.sqrt(total)

  def interleave(self, per_shard: Sequence[Sequence[Any]], counts: Sequence[int]) -> list[Any]:
    """One list in tensor order from each shard's list (`counts[i]`: the items tensor i contributes)."""
    at = [0] * self.num
    out = []
    for i, n in enumerate(counts):
      s = self.owner[i]
      out += per_shard[s][at[s]:at[s] + n]
      at[s] += n
    return out
