"""Fragments of a parameter tree: fragment p of a tree is the same tree with every tensor outside p replaced by
None (JAX's empty subtree), so that paths, the merge's per-tensor rules and optax work on it unchanged.

With one fragment the fragment is the tree itself: P = 1 builds the very same programs as before fragments.
"""

from typing import Any

import jax

from runtime.config import fragment_plan
PyTree = Any


def fragment_paths(tree: PyTree, num_fragments: int) -> tuple[tuple[str, ...], ...]:
  """Each fragment's tensors by path ("blocks/0/mlp/w"), packed by their number of elements."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  paths = [jax.tree_util.keystr(path, simple=True, separator="/") for path, _ in leaves]
  groups = fragment_plan.pack([int(getattr(x, "size", 1)) for _, x in leaves], num_fragments)
  return tuple(tuple(paths[i] for i in group) for group in groups)


class FragmentTrees:
  """The packing of one model's tensors into `num` fragments, and the fragment trees it cuts and puts back."""

  def __init__(self, tree: PyTree, num: int):
    leaves, self._treedef = jax.tree.flatten(tree)
    self.num = num
    self.groups = fragment_plan.pack([int(x.size) for x in leaves], num)
    self.owner = [0] * len(leaves)  # leaf index -> its fragment
    for p, group in enumerate(self.groups):
      for i in group:
        self.owner[i] = p
    self.nbytes = tuple(sum(leaves[i].size * leaves[i].dtype.itemsize for i in g) for g in self.groups)

  def part(self, tree: PyTree, p: int) -> PyTree:
    """Fragment p of `tree` (a whole tree): its other tensors are None."""
    if self.num == 1:
      return tree
    leaves = jax.tree.leaves(tree)
    return self._treedef.unflatten([x if self.owner[i] == p else None for i, x in enumerate(leaves)])

  def put(self, tree: PyTree, part: PyTree, p: int) -> PyTree:
    """`tree` (whole) with fragment p's tensors taken from `part` (fragment p of a tree)."""
    if self.num == 1:
      return part
    mine = iter(jax.tree.leaves(part))
    leaves = jax.tree.leaves(tree)
    return self._treedef.unflatten([next(mine) if self.owner[i] == p else x for i, x in enumerate(leaves)])


class LearnerFragments:
  """A learner's side of fragments: which fragment its next report carries, and per fragment the Θ version it holds
  it from (its base) and its trained tokens and steps then (what the fragment's next report trained on).

  Receiving Θ whole (a start, a rejoin, a quarantined or lost report) resets every fragment to that version.
  """

  def __init__(self, num: int):
    self.num = num
    self.trees: FragmentTrees | None = None  # bound to the model's tree at the learner's first Θ
    self.versions = [0] * num
    self._marks = [(0, 0)] * num  # per fragment: (tokens, steps) the learner had trained when its base was set
    self._at_report = (0, 0)  # ... when it took its last report
    self.reports = 0  # reports taken

  def bind(self, theta: PyTree) -> None:
    if self.trees is None:
      self.trees = FragmentTrees(theta, self.num)

  def part(self, tree: PyTree, p: int) -> PyTree:
    return tree if self.num == 1 else self.trees.part(tree, p)  # (one fragment: also before any Θ, on a resume)

  def put(self, tree: PyTree, part: PyTree, p: int) -> PyTree:
    return part if self.num == 1 else self.trees.put(tree, part, p)

  def next(self) -> int:
    """The fragment its next report carries."""
    return fragment_plan.fragment_of(self.reports, self.num)

  def last(self) -> int:
    """The fragment its last report carried."""
    return fragment_plan.fragment_of(self.reports - 1, self.num)

  def owed(self, reports_out: int) -> int:
    """The fragment of the report it has outstanding, or else of the one it trains toward."""
    return fragment_plan.fragment_of(self.reports - 1 if reports_out else self.reports, self.num)

  def report(self, base_version: int, tokens: int, steps: int) -> dict:
    """The Report's fragment fields for a report taken now, after `tokens` and `steps` trained in all ever."""
    if self.num == 1:
      return dict(base_version=base_version)
    p = self.next()
    self.reports += 1
    self._at_report = (tokens, steps)
    return dict(base_version=self.versions[p], fragment=p, fragment_tokens=tokens - self._marks[p][0],
                fragment_steps=steps - self._marks[p][1])

  def snapshot(self) -> dict:
    return dict(versions=self.versions, marks=self._marks, at_report=self._at_report, reports=self.reports)

  def restore(self, saved: dict | None) -> None:
    if saved is not None:  # (None: a checkpoint from before fragments)
      self.versions, self.reports = list(saved["versions"]), saved["reports"]
      self._marks, self._at_report = [tuple(m) for m in saved["marks"]], tuple(saved["at_report"])

  def received(self, p: int, version: int, tokens: int, steps: int) -> None:
    """Fragment p (WHOLE: all of them) is now held from Θ `version`; the learner has trained `tokens`, `steps`."""
    if p == fragment_plan.WHOLE:
      self.versions, self._marks = [version] * self.num, [(tokens, steps)] * self.num
    else:  # what it trained after the report (overlap steps) is in the fragment's next report
      self.versions[p], self._marks[p] = version, self._at_report
